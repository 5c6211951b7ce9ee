"""JSON Lines files as JSON defines them: one value per line, lines ending at ``\\n`` only, read as a stream.

``str.splitlines()`` also breaks at U+2028, U+2029, U+0085 and the ASCII separators, which
``json.dumps(ensure_ascii=False)`` writes raw inside strings: a valid row would be cut in two. Here a
file is read in binary and split at ``b"\\n"`` alone (a ``\\r`` before it is JSON whitespace), one row at
a time, so a large file is never held whole; a UTF-8 byte order mark at the start is skipped.

Example::

    >>> import json, pathlib, tempfile
    >>> from partitioning.data.jsonl import iter_rows
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "rows.jsonl"
    >>> _ = f.write_text(json.dumps({"text": "a\\u2028b"}, ensure_ascii=False) + "\\n\\n" + '{"text": "c"}\\n')
    >>> [(where.rsplit("/", 1)[-1], row["text"]) for where, row in iter_rows([f])]
    [('rows.jsonl:1', 'a\\u2028b'), ('rows.jsonl:3', 'c')]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from partitioning.errors import DataError

BOM = b"\xef\xbb\xbf"


def jsonl_files(path: str | Path, arg: str = "path") -> list[Path]:
    """A ``.jsonl`` file, or the ``*.jsonl`` files under a folder (sorted by relative path)."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted((f for f in p.rglob("*.jsonl") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
        if not files:
            raise DataError(f"{str(path)!r}: folder holds no .jsonl files", arg=arg)
        return files
    raise DataError(f"{str(path)!r}: no such file or folder", arg=arg)


def lines(f: Path, arg: str = "path", on_bytes: Callable[[int], None] | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line of ``f``, split at ``\\n`` only; ``on_bytes`` hears each line's size."""
    try:
        fh = open(f, "rb")  # noqa: SIM115 - closed below, after the last line is handed out
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None
    with fh:
        for n, raw in enumerate(fh, 1):  # a binary file's lines end at b"\n" alone
            if on_bytes is not None:
                on_bytes(len(raw))
            if n == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                where = f"{f}:{n}: not UTF-8 text (byte {e.start} of the line); JSONL files are UTF-8"
                raise DataError(where, arg=arg) from None
            yield n, text.removesuffix("\n").removesuffix("\r")


def parse_row(line: str, where: str, arg: str = "path") -> dict[str, Any]:
    """One line's JSON object; anything else is a DataError at ``where``."""
    try:
        row = json.loads(line)
    except ValueError as e:
        raise DataError(f"{where}: not valid JSON ({' '.join(str(e).split())})", arg=arg) from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object per line, got {type(row).__name__}", arg=arg)
    return row


def iter_rows(
    files: Sequence[Path], arg: str = "path", on_bytes: Callable[[int], None] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(file:line, row)`` of every non-blank line, one at a time; no row at all is a DataError."""
    seen = False
    for f in files:
        for n, line in lines(f, arg, on_bytes):
            if line.strip():
                seen = True
                yield f"{f}:{n}", parse_row(line, f"{f}:{n}", arg)
    if not seen:
        raise DataError(f"{', '.join(str(f) for f in files)}: no rows (one JSON object per line)", arg=arg)


def read_rows(files: Sequence[Path], arg: str = "path") -> list[tuple[str, dict[str, Any]]]:
    """Every row of :func:`iter_rows` in a list (small files; large ones are streamed)."""
    return list(iter_rows(files, arg))


__all__ = ["jsonl_files", "lines", "parse_row", "iter_rows", "read_rows"]
