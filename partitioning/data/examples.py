"""Tokenized instruction examples held flat, and their cache on disk (written once, memory-mapped after).

An :class:`Examples` is three arrays: every example's tokens one after the other, the loss mask beside
them, and the offsets where each example starts. Tokenizing a large JSONL file writes them as it goes
(:class:`ExampleWriter`: the rows are never all in memory) into a folder of the token cache named by a
digest of what decides them: the files' bytes, the tokenizer (its ``tokenizer.json`` and BOS / EOS rules),
the chat template and its special tokens, the row format and ``train_on_prompt``. The folder appears
whole or not at all (written under a temporary name, then renamed), so a resume — or the other processes
of a multi-host run — memory-maps it at once instead of tokenizing again. ``seq_len`` and the truncation
act on the cached examples (:mod:`partitioning.data.truncation`), so changing them re-tokenizes nothing.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.data.examples import ExampleWriter, read_examples
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "abc123"
    >>> w = ExampleWriter(folder, np.uint16)
    >>> w.add(np.array([1, 2, 3]), np.array([0, 1, 1], np.uint8))
    >>> w.add(np.array([4, 5]), np.array([0, 1], np.uint8))
    >>> ex = w.finish("demo", skipped_turns=0)
    >>> len(ex), ex.example(1)[0].tolist(), read_examples(folder, "demo").lengths.tolist()
    (2, [4, 5], [3, 2])
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioning.errors import DataError

CACHE_FORMAT = "partitioning-examples-1"  # bump when the layout of cached examples changes
FILES = ("tokens.bin", "mask.bin", "offsets.bin")
META = "meta.json"


@dataclasses.dataclass(frozen=True)
class Examples:
    """Tokenized examples held flat: example ``i`` is ``tokens[offsets[i]:offsets[i+1]]`` and its ``mask``."""

    tokens: np.ndarray  # the tokenizer's integer dtype (int32 when built by hand)
    mask: np.ndarray  # uint8: 1 where the token is one the model learns to write
    offsets: np.ndarray  # int64, (n + 1,)
    source: str
    skipped_turns: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi], self.mask[lo:hi]

    def subset(self, indices: Sequence[int], source: str | None = None) -> Examples:
        """The examples ``indices`` (in that order) as a new :class:`Examples` (a copy)."""
        parts = [self.example(int(i)) for i in indices]
        offsets = np.cumsum([0] + [len(t) for t, _ in parts], dtype=np.int64)
        tokens = np.concatenate([t for t, _ in parts]) if parts else np.zeros(0, self.tokens.dtype)
        mask = np.concatenate([m for _, m in parts]) if parts else np.zeros(0, np.uint8)
        return Examples(tokens, mask, offsets, source or self.source, self.skipped_turns)

    def split_at(self, cut: int) -> tuple[Examples, Examples]:
        """(examples ``[:cut]``, examples ``[cut:]``) as views of these arrays: nothing is copied."""
        at = int(self.offsets[cut])
        head = Examples(self.tokens[:at], self.mask[:at], self.offsets[: cut + 1], self.source, self.skipped_turns)
        rest = self.offsets[cut:] - at
        return head, Examples(self.tokens[at:], self.mask[at:], rest, self.source, 0)


def file_digest(path: Path, arg: str = "path") -> bytes:
    """sha256 of a file's bytes, read in blocks (a large file is never held whole)."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").digest()
    except OSError as e:
        raise DataError(f"{str(path)!r}: cannot read: {e.strerror}", arg=arg) from None


def cache_key(files: Sequence[Path], parts: Sequence[Any], arg: str = "path") -> str:
    """The digest naming the cached examples of ``files`` made with ``parts`` (tokenizer, template, format)."""
    h = hashlib.sha256(json.dumps([CACHE_FORMAT, *parts], sort_keys=True, default=str).encode())
    for f in files:
        h.update(file_digest(f, arg))
    return h.hexdigest()


def read_examples(folder: Path, source: str) -> Examples | None:
    """The cached examples in ``folder``, memory-mapped (None: none, or damaged: tokenize again)."""
    try:
        meta = json.loads((folder / META).read_text())
        dtypes = [np.dtype(meta["dtype"]), np.dtype(np.uint8), np.dtype(np.int64)]
        arrays = []
        for name, dtype in zip(FILES, dtypes, strict=True):
            size = (folder / name).stat().st_size
            if size % dtype.itemsize:
                return None
            arrays.append(np.memmap(folder / name, dtype, mode="r") if size else np.zeros(0, dtype))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    tokens, mask, offsets = arrays
    if len(tokens) != len(mask) or len(offsets) < 1 or int(offsets[-1]) != len(tokens):
        return None
    return Examples(tokens, mask, offsets, source, int(meta.get("skipped_turns", 0)))


class ExampleWriter:
    """Appends examples to files under a temporary folder beside ``folder``; :meth:`finish` renames it there."""

    def __init__(self, folder: Path, dtype: Any):
        self.folder, self.dtype = Path(folder), np.dtype(dtype)
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            # A unique temporary name: the processes of a multi-host run may share the cache.
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.", dir=self.folder.parent))
        except OSError as e:
            where = self.folder.parent
            raise DataError(f"cannot make the token cache {where}: {e.strerror}", arg="cache_dir") from None
        self.files = [open(self.tmp / name, "wb") for name in FILES]  # noqa: SIM115 - closed by finish / abort
        self.total = 0
        self.files[2].write(np.zeros(1, np.int64).tobytes())

    def add(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        self.files[0].write(np.asarray(tokens, self.dtype).tobytes())
        self.files[1].write(np.asarray(mask, np.uint8).tobytes())
        self.total += len(tokens)
        self.files[2].write(np.int64(self.total).tobytes())

    def finish(self, source: str, skipped_turns: int) -> Examples:
        try:
            for f in self.files:
                f.close()
            (self.tmp / META).write_text(json.dumps({"dtype": self.dtype.name, "skipped_turns": int(skipped_turns)}))
            try:
                os.rename(self.tmp, self.folder)
            except OSError:  # another process finished the same examples first: theirs are the same
                if read_examples(self.folder, source) is None:
                    raise
        except OSError as e:
            self.abort()
            raise DataError(f"cannot write the token cache {self.folder}: {e.strerror}", arg="cache_dir") from None
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        found = read_examples(self.folder, source)
        if found is None:
            raise DataError(f"the token cache {self.folder} is unreadable right after writing it", arg="cache_dir")
        return found

    def abort(self) -> None:
        """Drops what was written (a row that failed: the cache never holds half a file)."""
        for f in self.files:
            with contextlib.suppress(OSError):
                f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class MemoryWriter:
    """:class:`ExampleWriter`'s interface, in memory (no cache folder): the arrays are joined by :meth:`finish`."""

    def __init__(self, dtype: Any):
        self.dtype = np.dtype(dtype)
        self.tokens: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.offsets = [0]

    def add(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        self.tokens.append(np.asarray(tokens, self.dtype))
        self.masks.append(np.asarray(mask, np.uint8))
        self.offsets.append(self.offsets[-1] + len(tokens))

    def finish(self, source: str, skipped_turns: int) -> Examples:
        tokens = np.concatenate(self.tokens) if self.tokens else np.zeros(0, self.dtype)
        mask = np.concatenate(self.masks) if self.masks else np.zeros(0, np.uint8)
        return Examples(tokens, mask, np.asarray(self.offsets, np.int64), source, int(skipped_turns))

    def abort(self) -> None:
        self.tokens, self.masks = [], []


__all__ = ["Examples", "ExampleWriter", "MemoryWriter", "read_examples", "cache_key", "file_digest", "CACHE_FORMAT"]
