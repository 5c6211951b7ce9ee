"""How tokenizing says where it is, from its first second: a bar on a terminal, else a line every few seconds.

``progress`` is what ``train``'s flag gives: ``True`` (a bar when stderr is a terminal, else lines),
``"lines"`` (a line once :data:`DELAY_S` has passed, then every :data:`EVERY_S` seconds, and a closing
line), or ``False`` (``--no-progress``: quiet). Work done within :data:`DELAY_S` says nothing at all, so a
small file (or one read from the cache) adds no line to a command's output. Everything goes to stderr:
stdout stays for results.

Example::

    >>> import io
    >>> from partitioning.data.progress import Progress
    >>> out = io.StringIO()
    >>> p = Progress(2_000_000, "chat.jsonl (2.0 MB)", "lines", stream=out)
    >>> p.start -= 5                        # as if it had run for 5 s
    >>> p.update(1_000_000, rows=10)
    >>> p.close("data: 10 rows, 500 tokens in 5.0 s")
    >>> out.getvalue().splitlines()
    ['data: tokenizing chat.jsonl (2.0 MB): 50% (1.0 MB, 10 rows) after 5 s', 'data: 10 rows, 500 tokens in 5.0 s']
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

DELAY_S = 1.0  # nothing is said of work that ends sooner
EVERY_S = 10.0  # a line this often when there is no bar


class Progress:
    """Bytes of ``total`` done so far, shown as ``progress`` says (see the module docstring)."""

    def __init__(self, total: int, what: str, progress: bool | str = True, *, stream: TextIO | None = None):
        self.total, self.what, self.done, self.rows = max(int(total), 1), what, 0, 0
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.last: float | None = None  # when the last line was said (None: none yet)
        self.bar: Any = None
        self.lines = progress == "lines" or (progress is True and not _terminal(self.stream))
        if progress is True and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                unit="B",
                unit_scale=True,
                desc=f"tokenizing {what}",
                file=self.stream,
                leave=False,
                delay=DELAY_S,
            )

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, n: int, rows: int = 0) -> None:
        self.done += int(n)
        self.rows += int(rows)
        if self.bar is not None:
            self.bar.update(int(n))
            return
        now = time.perf_counter()
        due = now - self.start >= DELAY_S if self.last is None else now - self.last >= EVERY_S
        if self.lines and due:
            self.last = now
            rows_said = f", {self.rows:,} rows" if self.rows else ""
            self._say(
                f"data: tokenizing {self.what}: {self.done / self.total:.0%} ({self.done / 1e6:,.1f} MB{rows_said}) "
                f"after {now - self.start:.0f} s"
            )

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def close(self, line: str | None = None) -> None:
        """Ends the bar; ``line`` (what was made) is said when progress was shown (a bar, or a line)."""
        shown = self.bar is not None and self.seconds >= DELAY_S
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if line and (shown or self.last is not None):
            self._say(line)


def _terminal(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


__all__ = ["Progress", "DELAY_S", "EVERY_S"]
