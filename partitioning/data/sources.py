"""Where training tokens come from: text files (bytes) or pre-tokenized arrays, split into train and eval.

Two kinds of source, both read as one long token sequence per split:

- **text** — a text file or a folder of text files, read as bytes (vocabulary
  256); with no path, the running interpreter's own standard library.
- **tokens** — pre-tokenized arrays: ``.npy`` files (their header gives the
  dtype) or raw ``.bin`` files (a dtype must be given, e.g. ``uint16`` for
  GPT-2 tokens as nanoGPT writes them), memory-mapped, never loaded whole; a
  folder of them is read in sorted order as one sequence.

Several files are split by file: the ``ceil(n * eval_fraction)`` files with
the smallest CRC32 of their relative path go to eval, so the split does not
depend on any seed. A single file is split by position: its last
``eval_fraction`` is eval. ``eval_path`` names the eval data instead.

Every problem is a :class:`~partitioning.errors.DataError` naming the file,
with ``arg`` the argument at fault (``path``, ``eval_path``, ``dtype``).

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.data.sources import read_splits
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for i in range(10):
    ...     (np.arange(100_000) % 50_000).astype(np.uint16).tofile(folder / f"shard{i}.bin")
    >>> train, ev, info = read_splits(str(folder), dtype="uint16")   # one of the ten files is eval
    >>> len(train), len(ev), info["kind"]
    (900000, 100000, 'tokens')
"""

from __future__ import annotations

import math
import sysconfig
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioning.errors import DataError

BYTE_VOCAB = 256
TOKEN_SUFFIXES = (".npy", ".bin")
DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
# Parts of the stdlib tree that are not the library itself (or are tests,
# whose contents vary between builds of the same Python version).
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_CHUNK = 1 << 24  # tokens per chunk when scanning a file for its largest token


class TokenStream:
    """Tokens held in one or more 1-D arrays (e.g. memory-mapped files), read as one sequence.

    Example::

        >>> from partitioning.data.sources import TokenStream
        >>> s = TokenStream([np.arange(10), np.arange(10, 20)], names=["a.npy", "b.npy"])
        >>> s.take(np.array([8]), 4)
        array([[ 8,  9, 10, 11]])
    """

    def __init__(self, parts: Sequence[np.ndarray], names: Sequence[str] = (), origins: Sequence[int] = ()):
        self.parts = [np.asarray(p).reshape(-1) for p in parts]
        self.names = list(names) or [f"part {i}" for i in range(len(self.parts))]
        # Where each part starts in its file (a split of one file is a slice of it).
        self.origins = list(origins) or [0] * len(self.parts)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts], dtype=np.int64)
        self.dtype = np.result_type(*self.parts) if self.parts else np.dtype(np.uint8)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise DataError("a TokenStream slices contiguously only")
        return self.take(np.array([start]), stop - start)[0]

    def take(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows ``stream[s : s + length]`` for each ``s`` in ``starts``: shape ``(len(starts), length)``."""
        starts = np.asarray(starts, dtype=np.int64)
        if len(self.parts) == 1:
            return self.parts[0][starts[:, None] + np.arange(length)]
        pos = starts[:, None] + np.arange(length)
        part = np.searchsorted(self.offsets, pos, side="right") - 1
        out = np.empty(pos.shape, dtype=self.dtype)
        for i in np.unique(part):
            mask = part == i
            out[mask] = self.parts[i][pos[mask] - self.offsets[i]]
        return out

    def out_of_range(self, vocab_size: int) -> tuple[int, str, int] | None:
        """The first token outside ``[0, vocab_size)`` as ``(token, file name, index in the file)``, or None.

        Skipped when the dtype cannot hold such a token (``uint16`` with a
        vocabulary of 65,536 or more); otherwise each file is read once, in chunks.
        """
        info = np.iinfo(self.dtype)
        if info.min >= 0 and info.max < vocab_size:
            return None
        for part, name, origin in zip(self.parts, self.names, self.origins, strict=True):
            for lo in range(0, len(part), _CHUNK):
                chunk = part[lo : lo + _CHUNK]
                bad = (chunk >= vocab_size) | (chunk < 0)
                if bad.any():
                    i = int(np.argmax(bad))
                    return int(chunk[i]), name, origin + lo + i
        return None


# -- files ----------------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The standard library ``.py`` files of this interpreter, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        f for f in root.rglob("*.py") if f.is_file() and not _SKIP_DIRS.intersection(f.relative_to(root).parts[:-1])
    ]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def _looks_binary(f: Path, arg: str) -> bool:
    try:
        with f.open("rb") as fh:
            return b"\0" in fh.read(8192)
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None


def _listing(folder: Path, keep) -> list[Path]:
    out = []
    for f in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        rel = f.relative_to(folder).parts
        if f.is_file() and not any(p.startswith(".") for p in rel) and keep(f):
            out.append(f)
    return out


def _read(f: Path, arg: str) -> bytes:
    try:
        return f.read_bytes()
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None


def open_tokens(f: Path, dtype: str | None, arg: str = "path") -> np.ndarray:
    """One token file as a read-only memory map (1-D), after checking it holds integer tokens."""
    suffix = f.suffix.lower()
    if suffix not in TOKEN_SUFFIXES:
        raise DataError(f"{str(f)!r}: not a token array (.npy or .bin); for text use source: text", arg=arg)
    if suffix == ".bin":
        if dtype is None:
            raise DataError(
                f"{str(f)!r}: a .bin file has no header; say its dtype (e.g. uint16 for GPT-2 tokens)", arg="dtype"
            )
        size = _size(f, arg)
        width = np.dtype(dtype).itemsize
        if size % width:
            raise DataError(
                f"{str(f)!r}: {size:,} bytes is not a whole number of {dtype} tokens ({width} bytes "
                f"each); is the dtype right?",
                arg="dtype",
            )
        if size == 0:
            raise DataError(f"{str(f)!r}: file is empty", arg=arg)
        return _memmap(f, dtype, arg)
    try:
        with f.open("rb") as fh:
            magic = fh.read(6)
        if magic != b"\x93NUMPY":
            raise DataError(f"{str(f)!r}: not a .npy file (no NumPy header); raw tokens go in a .bin file", arg=arg)
        arr = np.load(f, mmap_mode="r", allow_pickle=False)
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None
    except (ValueError, EOFError) as e:
        raise DataError(f"{str(f)!r}: not a readable .npy file ({' '.join(str(e).split())[:120]})", arg=arg) from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iu":
        kind = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
        raise DataError(f"{str(f)!r}: holds {kind} values; token arrays need an integer dtype", arg=arg)
    if dtype is not None and np.dtype(dtype) != arr.dtype:
        raise DataError(
            f"{str(f)!r}: holds {arr.dtype} tokens, not {dtype} (a .npy file says its own dtype; drop dtype)",
            arg="dtype",
        )
    if arr.size == 0:
        raise DataError(f"{str(f)!r}: holds no tokens", arg=arg)
    if arr.ndim != 1 and not arr.flags.c_contiguous:
        raise DataError(f"{str(f)!r}: a {arr.ndim}-D array in Fortran order; save it C-contiguous or 1-D", arg=arg)
    return arr.reshape(-1)


def _size(f: Path, arg: str) -> int:
    try:
        return f.stat().st_size
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None


def _memmap(f: Path, dtype: str, arg: str) -> np.ndarray:
    try:
        return np.memmap(f, dtype=np.dtype(dtype), mode="r")
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg=arg) from None


def source_of(path: str | None, source: str | None) -> str:
    """``text`` or ``tokens``: as given, else from the path (a ``.npy`` / ``.bin`` file, or a folder of only those)."""
    if source is not None:
        if source not in ("text", "tokens"):
            raise DataError(f"source must be 'text' or 'tokens', got {source!r}", arg="source")
        return source
    if path is None:
        return "text"
    p = Path(path).expanduser()
    if p.suffix.lower() in TOKEN_SUFFIXES:
        return "tokens"
    if p.is_dir():
        files = _listing(p, lambda f: True)
        if files and all(f.suffix.lower() in TOKEN_SUFFIXES for f in files):
            return "tokens"
    return "text"


def _files(path: str, kind: str, arg: str) -> tuple[Path, list[Path]]:
    """(root, files) of a path: the file itself, or the folder's text / token files."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{str(path)!r}: no such file or folder", arg=arg)
    if p.is_file():
        if kind == "text" and _looks_binary(p, arg):
            raise DataError(
                f"{str(path)!r}: binary data, not text; for token arrays (.npy, .bin) use source: tokens", arg=arg
            )
        return p.parent, [p]
    if kind == "tokens":
        files = _listing(p, lambda f: f.suffix.lower() in TOKEN_SUFFIXES)
        if not files:
            raise DataError(f"{str(path)!r}: folder holds no .npy or .bin token files", arg=arg)
    else:
        files = _listing(p, lambda f: not _looks_binary(f, arg))
        if not files:
            raise DataError(f"{str(path)!r}: folder holds no text files", arg=arg)
    return p, files


def _stream(files: list[Path], root: Path, kind: str, dtype: str | None, arg: str, tokens: Any = None) -> Any:
    if kind == "text" and tokens is not None:  # (tokenizer, cache_dir): tokenized once, then memory-mapped
        from partitioning.data.tokenize import tokenize_files

        data = tokenize_files(files, *tokens)
        if len(data) == 0:
            raise DataError(f"{str(files[0]) if len(files) == 1 else str(root)!r}: no tokens in the text", arg=arg)
        return TokenStream([data], [str(files[0]) if len(files) == 1 else str(root)])
    if kind == "text":
        data = np.frombuffer(b"".join(_read(f, arg) for f in files), dtype=np.uint8)
        if len(data) == 0:
            raise DataError(f"{str(files[0]) if len(files) == 1 else str(root)!r}: file is empty", arg=arg)
        return data
    return TokenStream([open_tokens(f, dtype, arg) for f in files], [str(f) for f in files])


def _rel(files: list[Path], root: Path) -> list[str]:
    return [f.relative_to(root).as_posix() for f in files]


def read_splits(
    path: str | None = None,
    *,
    source: str | None = None,
    dtype: str | None = None,
    eval_path: str | None = None,
    eval_fraction: float = 0.05,
    tokenizer: Any = None,
    cache_dir: str | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """(train tokens, eval tokens, info) of a text or token source; see the module docstring.

    Tokens are a ``uint8`` array for text, a :class:`TokenStream` for token
    files. ``info``: ``kind``, ``source`` and ``eval_source`` (descriptions), ``vocab`` (256 for
    text, None for tokens), ``train_files`` and ``eval_files``. With a
    ``tokenizer`` (a :class:`~partitioning.data.tokenize.TextTokenizer`) text
    is tokenized, each file a document, and cached in ``cache_dir``
    (:func:`~partitioning.data.tokenize.tokenize_files`); ``vocab`` is then
    the tokenizer's.
    """
    if not 0 < eval_fraction < 1:
        raise DataError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}", arg="eval_fraction")
    if dtype is not None and dtype not in DTYPES:
        raise DataError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}", arg="dtype")
    kind = source_of(path, source)
    if path is None:
        if kind == "tokens":
            raise DataError("source: tokens needs a path (a .npy or .bin file, or a folder of them)", arg="path")
        root, files = Path(sysconfig.get_paths()["stdlib"]), stdlib_files()
        desc = f"python stdlib ({root})"
    else:
        root, files = _files(path, kind, "path")
        desc = str(Path(path).expanduser())
    tokens = (tokenizer, cache_dir) if kind == "text" and tokenizer is not None else None
    vocab = (tokenizer.vocab_size if tokens else BYTE_VOCAB) if kind == "text" else None
    info: dict[str, Any] = {"kind": kind, "source": desc, "eval_source": desc, "vocab": vocab}
    if eval_path is not None:
        eroot, efiles = _files(eval_path, kind, "eval_path")
        info.update(
            train_files=tuple(_rel(files, root)),
            eval_files=tuple(_rel(efiles, eroot)),
            eval_source=str(Path(eval_path).expanduser()),
        )
        return (
            _stream(files, root, kind, dtype, "path", tokens),
            _stream(efiles, eroot, kind, dtype, "eval_path", tokens),
            info,
        )
    if len(files) == 1:
        data = _stream(files, root, kind, dtype, "path", tokens)
        if len(data) < 2:
            raise DataError(
                f"{str(files[0])!r}: too small to split into train and eval ({len(data)} tokens)", arg="path"
            )
        cut = len(data) - max(1, int(len(data) * eval_fraction))
        name = (files[0].name,)
        info.update(train_files=name, eval_files=name)
        if not isinstance(data, TokenStream):
            return data[:cut], data[cut:], info
        parts = data.parts[0]
        return TokenStream([parts[:cut]], data.names), TokenStream([parts[cut:]], data.names, [cut]), info
    rel = _rel(files, root)
    n_eval = min(len(files) - 1, max(1, math.ceil(len(files) * eval_fraction)))
    by_key = sorted(range(len(files)), key=lambda i: (zlib.crc32(rel[i].encode("utf-8")), rel[i]))
    eval_idx = set(by_key[:n_eval])
    train_f = [f for i, f in enumerate(files) if i not in eval_idx]
    eval_f = [f for i, f in enumerate(files) if i in eval_idx]
    info.update(
        train_files=tuple(r for i, r in enumerate(rel) if i not in eval_idx),
        eval_files=tuple(r for i, r in enumerate(rel) if i in eval_idx),
    )
    return _stream(train_f, root, kind, dtype, "path", tokens), _stream(eval_f, root, kind, dtype, "path", tokens), info


__all__ = [
    "TokenStream",
    "read_splits",
    "open_tokens",
    "source_of",
    "stdlib_files",
    "BYTE_VOCAB",
    "TOKEN_SUFFIXES",
    "DTYPES",
]
