"""Dead peers: the processes of a multi-host run watch each other and stop together, with one line.

When a process of a ``jax.distributed`` run dies, the others wait in their
next collective until jax's coordination service misses its heartbeats; then
it aborts them (SIGABRT) with a C++ stack trace, after a delay nobody chose.
Here each process keeps one TCP connection to process 0 (which relays to the
others), pings every ``timeout / 4`` seconds, and says goodbye with its exit
status when it ends. A connection that closes without a goodbye (the kernel
closes it when a process is killed) or stays silent for ``timeout`` seconds
names that process; every survivor prints one line and exits with
:data:`EXIT_PEER_DIED` (75, "try again": restart every process with
``--resume``). jax's own heartbeat timeout is set above ``timeout`` (see
:func:`jax_timeouts`), so this watchdog speaks first.

Example (not run: it needs every process of a multi-host run)::

    import partitioning as pt
    from partitioning.peers import goodbye

    pt.initialize_distributed("10.0.0.1:1234", 2, 0, global_devices=8, peer_timeout=30)  # starts the watch
    ...                # train
    goodbye(0)         # at the end: peers do not mistake this exit for a death

jax's own heartbeat gives up later than the watch::

    >>> from partitioning.peers import jax_timeouts
    >>> jax_timeouts(30)
    {'heartbeat_timeout_seconds': 70, 'shutdown_timeout_seconds': 70}
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable

EXIT_PEER_DIED = 75  # EX_TEMPFAIL
DEFAULT_TIMEOUT = 60.0
_watch: PeerWatch | None = None
_note: Callable[[], str | None] | None = None


def jax_timeouts(timeout: float) -> dict[str, int]:
    """jax.distributed's heartbeat / shutdown timeouts for a watch of ``timeout`` seconds: later than ours."""
    return {"heartbeat_timeout_seconds": int(2 * timeout + 10), "shutdown_timeout_seconds": int(2 * timeout + 10)}


def set_note(note: Callable[[], str | None] | None) -> None:
    """A callable adding to the dead-peer line (e.g. the last complete checkpoint)."""
    global _note
    _note = note


def _say_and_exit(message: str) -> None:
    extra = None
    if _note is not None:
        with contextlib.suppress(Exception):
            extra = _note()
    line = f"error: {message}; stopping this process too" + (f"; {extra}" if extra else "")
    line += "; restart every process (with --resume to continue from the last complete checkpoint)"
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, (line + "\n").encode())
    os._exit(EXIT_PEER_DIED)  # the main thread may be blocked in a collective that never returns


class _Conn:
    def __init__(self, sock: socket.socket, who: str):
        self.sock, self.who, self.buf = sock, who, b""
        self.last = time.monotonic()
        self.bye: int | None = None

    def send(self, line: str) -> bool:
        try:
            self.sock.sendall((line + "\n").encode())
            return True
        except OSError:
            return False


class PeerWatch:
    """The watch of one process: process 0 serves, the others connect to it.

    Example (not run: process 0 waits for the other process to connect)::

        from partitioning.peers import PeerWatch

        watch = PeerWatch(process_id=0, num_processes=2, host="10.0.0.1", timeout=30)
        port = watch.listen()        # process 0; the port reaches the others by a broadcast (start_watch)
        watch.start(port)            # a daemon thread accepts process 1, then pings and watches
        ...
        watch.goodbye(0)
    """

    def __init__(self, process_id: int, num_processes: int, host: str, timeout: float = DEFAULT_TIMEOUT):
        self.id, self.n, self.host, self.timeout = process_id, num_processes, host, float(timeout)
        self.conns: list[_Conn] = []
        self.closing = False
        self.server: socket.socket | None = None
        self.port: int | None = None

    def me(self) -> str:
        return f"process {self.id} (pid {os.getpid()} on host {socket.gethostname()})"

    # -- setup -----------------------------------------------------------------------------
    def listen(self) -> int:
        """Process 0: opens the port the others connect to."""
        self.server = socket.create_server(("", 0))
        self.port = self.server.getsockname()[1]
        return self.port

    def start(self, port: int) -> None:
        """Connects (or, on process 0, accepts the others) in a daemon thread, then watches."""
        threading.Thread(target=self._run, args=(port,), name="partitioning-peers", daemon=True).start()

    def _connect(self, port: int) -> None:
        deadline = time.monotonic() + max(self.timeout, 30)
        while True:
            try:
                sock = socket.create_connection((self.host, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    _say_and_exit(f"cannot reach process 0 at {self.host}:{port} to watch it")
                time.sleep(0.2)
        sock.settimeout(None)
        c = _Conn(sock, f"process 0 (host {self.host})")
        c.send(f"hello {self.id} {os.getpid()} {socket.gethostname()}")
        self.conns.append(c)

    def _accept(self) -> None:
        assert self.server is not None
        self.server.settimeout(max(self.timeout, 30))
        while len(self.conns) < self.n - 1:
            try:
                sock, _ = self.server.accept()
            except OSError:
                joined = ", ".join(c.who for c in self.conns) or "none"
                _say_and_exit(
                    f"not every process joined the watch within {max(self.timeout, 30):g} s (joined: {joined})"
                )
            sock.settimeout(5)
            try:
                hello = sock.recv(256).decode(errors="replace").split()
            except OSError:
                hello = []
            sock.settimeout(None)
            who = f"process {hello[1]} (pid {hello[2]} on host {hello[3]})" if len(hello) >= 4 else "a process"
            self.conns.append(_Conn(sock, who))

    # -- the watch ----------------------------------------------------------------------------
    def _run(self, port: int) -> None:
        if self.id == 0:
            self._accept()
        else:
            self._connect(port)
        interval = max(self.timeout / 4, 0.05)
        next_ping = 0.0
        while True:
            now = time.monotonic()
            if now >= next_ping:
                for c in self.conns:
                    if c.bye is None:
                        c.send("ping")
                next_ping = now + interval
            live = [c for c in self.conns if c.bye is None or c.bye != 0]
            if not live:
                return
            ready, _, _ = select.select([c.sock for c in live if c.bye is None], [], [], interval)
            for c in live:
                if c.sock in ready:
                    self._read(c)
                elif c.bye is None and time.monotonic() - c.last > self.timeout:
                    self._dead(c, f"{c.who} stopped answering for {self.timeout:g} s")
                elif c.bye is not None and time.monotonic() - c.last > self.timeout:
                    self._dead(c, f"{c.who} stopped with exit status {c.bye}")

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            if c.bye is None:
                self._dead(c, f"{c.who} died (its connection closed without a goodbye)")
            return
        c.last = time.monotonic()
        c.buf += data
        while b"\n" in c.buf:
            line, c.buf = c.buf.split(b"\n", 1)
            words = line.decode(errors="replace").split(" ", 1)
            if words[0] == "bye":
                c.bye = int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else 0
                c.last = time.monotonic()  # a failed peer gets `timeout` s for this one to fail alike
            elif words[0] == "dead" and len(words) > 1:
                self._dead(c, words[1], relay=False)

    def _dead(self, c: _Conn, what: str, relay: bool = True) -> None:
        if self.closing:
            return
        if self.id == 0 and relay:
            for other in self.conns:
                if other is not c and other.bye is None:
                    other.send(f"dead {what}")
        _say_and_exit(what)

    def goodbye(self, code: int) -> None:
        self.closing = True
        for c in self.conns:
            c.send(f"bye {int(code)}")


def start_watch(process_id: int, num_processes: int, coordinator_host: str, timeout: float) -> PeerWatch:
    """Starts this process's watch (after ``jax.distributed.initialize``): a collective shares process 0's port."""
    import numpy as np
    from jax.experimental import multihost_utils

    global _watch
    w = PeerWatch(process_id, num_processes, coordinator_host, timeout)
    port = w.listen() if process_id == 0 else 0
    port = int(multihost_utils.broadcast_one_to_all(np.int32(port)))
    w.start(port)
    _watch = w
    return w


def goodbye(code: int) -> None:
    """Tells the peers this process ends with ``code`` (0: done; else they stop too). No-op without a watch."""
    if _watch is not None:
        _watch.goodbye(code)


__all__ = ["PeerWatch", "start_watch", "goodbye", "set_note", "jax_timeouts", "EXIT_PEER_DIED", "DEFAULT_TIMEOUT"]
