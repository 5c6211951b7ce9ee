"""A full disk: a save that cannot fit -> one :class:`CheckpointError` with the path and the bytes needed.

A save is refused before it starts when the filesystem has less free space
than the state's bytes (:func:`check_space`); a disk that fills during the
write (tensorstore's ``RESOURCE_EXHAUSTED``, ``ENOSPC``, a quota, a file size
limit) is recognised in whatever orbax raises (:func:`is_disk_full`) and the
unfinished step's temporary directory is removed (:func:`drop_unfinished`),
so nothing half-written is ever listed, and the previous step stays the latest.

Example::

    >>> import errno, pathlib, tempfile
    >>> from partitioning.checkpoint.space import check_space, drop_unfinished, is_disk_full, state_nbytes
    >>> state = {"w": jax.ShapeDtypeStruct((1024, 256), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
    >>> state_nbytes(state)
    1048580
    >>> ckpts = pathlib.Path(tempfile.mkdtemp())
    >>> check_space(ckpts, 6, state_nbytes(state))             # fits: nothing happens
    >>> check_space(ckpts, 6, 2**70, latest=4)                 # a state bigger than any disk
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: .../6: no space left on device: this checkpoint needs about ... free; the \
latest complete checkpoint is step 4; free space, lower checkpoint.keep, or point checkpoint.dir at a larger disk
    >>> is_disk_full(RuntimeError("RESOURCE_EXHAUSTED: writing d/3f: [OSError os_error_code=28]"))
    True
    >>> is_disk_full(OSError(errno.EACCES, "Permission denied"))
    False
    >>> (ckpts / "6.orbax-checkpoint-tmp-1").mkdir()          # what a failed save of step 6 leaves
    >>> drop_unfinished(ckpts, 6)
    >>> list(ckpts.iterdir())
    []
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from partitioning.checkpoint.disk import TMP_SUFFIX
from partitioning.errors import CheckpointError
from partitioning.fmt import fmt_bytes

FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_OS_CODE = re.compile(r"os_error_code='?(\d+)")
# Headroom over the arrays' bytes: orbax's metadata, the OCDBT manifest and B-tree nodes.
OVERHEAD = 1.05


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_disk_full(error: BaseException) -> bool:
    """True when ``error`` (or its cause) says the filesystem is full, a quota is reached or a file too big."""
    for e in _causes(error):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return True
        text = str(e)
        m = _OS_CODE.search(text)
        if m and int(m.group(1)) in FULL_ERRNOS:
            return True
        if "No space left on device" in text or "Disk quota exceeded" in text or "File too large" in text:
            return True
    return False


def is_file_too_big(error: BaseException) -> bool:
    """True when ``error`` is a file-size limit (``EFBIG``: ``ulimit -f``, RLIMIT_FSIZE), not a full disk."""
    for e in _causes(error):
        if isinstance(e, OSError) and e.errno == errno.EFBIG:
            return True
        m = _OS_CODE.search(str(e))
        if (m and int(m.group(1)) == errno.EFBIG) or "File too large" in str(e):
            return True
    return False


def file_too_big_error(where: Path, latest: int | None) -> CheckpointError:
    """The file-size limit as one line (the disk may have room: the limit is the process's)."""
    kept = f"; the latest complete checkpoint is step {latest}" if latest is not None else ""
    return CheckpointError(
        f"{where}: file too large: a file reached this process's file-size limit (ulimit -f, RLIMIT_FSIZE){kept}; "
        f"raise the limit (ulimit -f unlimited) or run where it is larger"
    )


def state_nbytes(state: Any) -> int:
    """Bytes of a (global) state's arrays: what a checkpoint of it holds, before compression."""
    total = 0
    for x in jax.tree.leaves(state):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None:
            continue
        try:
            total += math.prod(shape) * jax.numpy.dtype(dtype).itemsize
        except TypeError:  # PRNG keys and other extended dtypes
            total += math.prod(shape) * 8
    return total


def free_bytes(directory: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem holding ``directory`` (or its nearest existing parent)."""
    p = Path(directory).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def disk_full_error(directory: Path, step: int | None, needed: int | None, latest: int | None) -> CheckpointError:
    """``DIR/6: no space left on device: the checkpoint needs about 1.2 MiB (1,234,567 bytes), 0.4 MiB free``
    (``DIR:`` when the failed save's step is unknown)."""
    free = free_bytes(directory)
    if needed and (free is None or needed > free):
        need = f"needs about {fmt_bytes(needed)} ({needed:,} bytes)"
        have = f", {fmt_bytes(free)} free" if free is not None else ""
    elif free is not None:  # the estimate fit, the files did not (chunk and file overheads)
        need, have = f"needs more than the {fmt_bytes(free)} ({free:,} bytes) free", ""
    else:
        need, have = "does not fit", ""
    where = directory if step is None else directory / str(step)
    kept = f"; the latest complete checkpoint is step {latest}" if latest is not None else ""
    return CheckpointError(
        f"{where}: no space left on device: this checkpoint {need}{have}{kept}; free space, "
        f"lower checkpoint.keep, or point checkpoint.dir at a larger disk"
    )


def check_space(directory: Path, step: int, needed: int, latest: int | None = None) -> None:
    """Refuses a save (before anything is written) that cannot fit in the free space."""
    free = free_bytes(directory)
    if free is not None and free < needed * OVERHEAD:
        raise disk_full_error(directory, step, int(needed * OVERHEAD), latest)


def drop_unfinished(directory: Path, step: int) -> None:
    """Removes the temporary directory of a save of ``step`` that failed (process 0)."""
    if jax.process_index() != 0 or not directory.is_dir():
        return
    for c in directory.iterdir():
        if c.name.startswith(f"{step}{TMP_SUFFIX}") and c.is_dir():
            shutil.rmtree(c, ignore_errors=True)


__all__ = [
    "is_disk_full",
    "is_file_too_big",
    "file_too_big_error",
    "state_nbytes",
    "free_bytes",
    "disk_full_error",
    "check_space",
    "drop_unfinished",
]
