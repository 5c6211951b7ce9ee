"""One writer per run directory: ``RUN_DIR/.lock``, an ``fcntl`` advisory lock naming its holder.

Two jobs writing one run directory interleave their ``metrics.jsonl`` and race
each other's checkpoint saves. The lock is an ``flock`` on ``DIR/.lock``
(which holds the holder's host, pid, start time and command line, as JSON), so
the kernel frees it when the holder dies, however it dies: no stale lock to
delete by hand. The file itself stays (deleting a lock file races with the
next job opening it). Readers (``ckpt ls``, ``ckpt inspect``) never take it.

:meth:`RunLock.check` only reads: a job refused there has written nothing.
:meth:`RunLock.acquire` creates the file if needed and records the holder.

Example::

    >>> import os, tempfile
    >>> from partitioning.train.lock import RunLock
    >>> run_dir = tempfile.mkdtemp()
    >>> with RunLock(run_dir):                 # held while the job runs
    ...     RunLock(run_dir).check()           # another job is refused before it writes anything
    Traceback (most recent call last):
    partitioning.train.lock.RunLockedError: /...: run directory in use by pid ... on host ... since ...
    >>> RunLock(run_dir).holder()["pid"] == os.getpid()    # the file stays, naming its last holder
    True
    >>> RunLock(run_dir).check()               # the holder has released it (or died): free
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from partitioning.errors import PartitioningError

LOCK_FILE = ".lock"


class RunLockedError(PartitioningError):
    """Another live process holds the run directory's lock."""


def describe_holder(info: dict[str, Any] | None) -> str:
    """``pid 123 on host h since 2026-01-01 10:00:00 (partitioning train run.yaml)``."""
    if not info:
        return "another process (it has not said which yet)"
    out = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
    if info.get("started"):
        out += f" since {info['started']}"
    if info.get("command"):
        out += f" ({info['command']})"
    return out


class RunLock:
    """The advisory lock of a run (or checkpoint) directory: ``DIR/.lock``, or ``path``.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.train.lock import RunLock
        >>> run_dir = pathlib.Path(tempfile.mkdtemp()) / "run"
        >>> lock = RunLock(run_dir).acquire()    # creates the directory and RUN_DIR/.lock
        >>> lock.path.relative_to(run_dir.parent), sorted(lock.holder())
        (PosixPath('run/.lock'), ['command', 'host', 'pid', 'started'])
        >>> lock.release()
    """

    def __init__(
        self, directory: str | os.PathLike, what: str = "run directory", path: str | os.PathLike | None = None
    ):
        self.directory, self.what = Path(directory), what
        self.path = Path(path) if path is not None else self.directory / LOCK_FILE
        self._fd: int | None = None
        self._made: list[Path] = []

    def holder(self) -> dict[str, Any] | None:
        """What the lock file says about its last holder (None if absent or unreadable)."""
        with contextlib.suppress(OSError, ValueError):
            return json.loads(self.path.read_text())
        return None

    def _refuse(self) -> RunLockedError:
        return RunLockedError(
            f"{self.directory}: {self.what} in use by {describe_holder(self.holder())} ({self.path}); "
            f"wait for that job to end or stop it, or use another run_dir"
        )

    def _try(self, fd: int, mode: int) -> bool:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return True  # a filesystem without locks: nothing to enforce
            raise
        return True

    def check(self) -> None:
        """Raises :class:`RunLockedError` if a live process holds the lock; reads only, creates nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # no lock file (or no directory): nobody holds it
        try:
            if not self._try(fd, fcntl.LOCK_SH):
                raise self._refuse()
        finally:
            os.close(fd)  # also drops the shared lock just taken

    def acquire(self) -> RunLock:
        """Takes the lock (creating the directory and the file) and records this process as the holder."""
        if self._fd is not None:
            return self
        made, up = [], self.path.parent  # what this call creates: undone by release(undo=True)
        while not up.exists() and up.parent != up:
            made.append(up)
            up = up.parent
        made = ([] if self.path.exists() else [self.path]) + made
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunLockedError(f"{self.path}: cannot create the {self.what}'s lock: {e.strerror}") from None
        if not self._try(fd, fcntl.LOCK_EX):
            os.close(fd)
            raise self._refuse()
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["partitioning", *sys.argv[1:]]) if sys.argv else None,
        }
        self._fd, self._made = fd, made
        with contextlib.suppress(OSError):  # a full disk: the lock holds, the note of who holds it is lost
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        return self

    def release(self, undo: bool = False) -> None:
        """Frees the lock. ``undo`` (a job refused before it wrote anything): the lock file and the folders
        :meth:`acquire` made go too, while the lock is still held, so a refused command changes nothing on disk."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if undo:
                for p in self._made:  # the file, then its new folders, innermost first (only when empty)
                    with contextlib.suppress(OSError):
                        p.unlink() if p == self.path else p.rmdir()
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


__all__ = ["RunLock", "RunLockedError", "LOCK_FILE", "describe_holder"]
