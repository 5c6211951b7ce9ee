"""Byte-level training data: the embedded corpus and resumable global batches.

With no path, the corpus is the running interpreter's own standard library
(its ``.py`` files, minus tests and site-packages): real text, no download.
Tokens are bytes (vocabulary 256). Files are split into train and eval by a
hash of their relative path, so the split does not depend on any seed.

:class:`TokenBatches` makes the batch for step ``k`` a pure function of
``(seed, k)`` (an epoch-wise seeded permutation of fixed windows), so a run
resumed at step ``k`` sees exactly the data the uninterrupted run would have.
Each process builds only the rows its devices hold and the global array is
assembled with :func:`jax.make_array_from_process_local_data`, so the same
code runs on one host or many.

Example::

    >>> corpus = load_corpus()                      # stdlib bytes
    >>> batches = corpus.batches("train", 32, 128, trainer.batch_sharding, seed=0)
    >>> batch = batches.batch_at(0)                 # {"inputs", "targets"}: int32 (32, 128)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sysconfig
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np

from partitioning.errors import DataError
from partitioning.train.batch import local_block, place

VOCAB_SIZE = 256
# Parts of the stdlib tree that are not the library itself (or are tests,
# whose contents vary between builds of the same Python version).
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files() -> list[Path]:
    """The standard library ``.py`` files of this interpreter, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        f for f in root.rglob("*.py")
        if f.is_file() and not _SKIP_DIRS.intersection(f.relative_to(root).parts[:-1])
    ]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def _text_files(folder: Path) -> list[Path]:
    out = []
    for f in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        rel = f.relative_to(folder).parts
        if not f.is_file() or any(p.startswith(".") for p in rel):
            continue
        try:
            with f.open("rb") as fh:
                if b"\0" in fh.read(8192):  # binary file: not text
                    continue
        except OSError as e:
            raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg="path") from None
        out.append(f)
    return out


def _split_key(rel: str) -> int:
    return zlib.crc32(rel.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Train and eval byte streams (``uint8`` arrays) and where they came from.

    Example::

        >>> corpus = load_corpus("my_text_dir")
        >>> batches = corpus.batches("train", 32, 128, trainer.batch_sharding, seed=0)
    """

    train: np.ndarray
    eval: np.ndarray
    source: str
    train_files: tuple[str, ...] = ()
    eval_files: tuple[str, ...] = ()

    def tokens(self, split: str) -> np.ndarray:
        if split not in ("train", "eval"):
            raise DataError(f"split must be 'train' or 'eval', got {split!r}")
        return self.train if split == "train" else self.eval

    def batches(self, split: str, batch_size: int, seq_len: int, sharding: Any = None,
                *, seed: int = 0) -> "TokenBatches":
        """Resumable batches of ``split``; see :class:`TokenBatches`."""
        return TokenBatches(self.tokens(split), batch_size, seq_len, sharding, seed=seed,
                            name=f"{self.source} ({split})")


def _read(f: Path) -> bytes:
    try:
        return f.read_bytes()
    except OSError as e:
        raise DataError(f"{str(f)!r}: cannot read: {e.strerror}", arg="path") from None


def _join(files: list[Path]) -> np.ndarray:
    return np.frombuffer(b"".join(_read(f) for f in files), dtype=np.uint8)


@functools.lru_cache(maxsize=4)
def load_corpus(path: str | None = None, *, eval_fraction: float = 0.05) -> Corpus:
    """The embedded stdlib corpus (``path=None``), a text file, or a folder of text files.

    Several files are split by file: the ``ceil(n * eval_fraction)`` files with
    the smallest CRC32 of their relative path go to eval (at least one). A
    single file is split by bytes: its last ``eval_fraction`` is eval.

    Example::

        >>> c = load_corpus()
        >>> len(c.train) > 1_000_000, len(c.eval) > 10_000
        (True, True)
    """
    if not 0 < eval_fraction < 1:
        raise DataError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}",
                        arg="eval_fraction")
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files, source = stdlib_files(), f"python stdlib ({root})"
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(f"{str(path)!r}: no such file or folder", arg="path")
        if p.is_file():
            data = np.frombuffer(_read(p), dtype=np.uint8)
            cut = len(data) - max(1, int(len(data) * eval_fraction))
            if len(data) < 2:
                raise DataError(f"{str(path)!r}: file is empty", arg="path")
            return Corpus(data[:cut], data[cut:], str(p), (p.name,), (p.name,))
        root, files, source = p, _text_files(p), str(p)
        if not files:
            raise DataError(f"{str(path)!r}: folder holds no text files", arg="path")
    if len(files) == 1:
        return load_corpus(str(files[0]), eval_fraction=eval_fraction)
    rel = [f.relative_to(root).as_posix() for f in files]
    n_eval = min(len(files) - 1, max(1, math.ceil(len(files) * eval_fraction)))
    by_key = sorted(range(len(files)), key=lambda i: (_split_key(rel[i]), rel[i]))
    eval_idx = set(by_key[:n_eval])
    train_f = [f for i, f in enumerate(files) if i not in eval_idx]
    eval_f = [f for i, f in enumerate(files) if i in eval_idx]
    return Corpus(_join(train_f), _join(eval_f), source,
                  tuple(r for i, r in enumerate(rel) if i not in eval_idx),
                  tuple(r for i, r in enumerate(rel) if i in eval_idx))


class TokenBatches:
    """Next-byte batches where the batch for step ``k`` is a pure function of ``(seed, k)``.

    The byte stream is cut into ``n = (len - 1) // seq_len`` windows of
    ``seq_len + 1`` bytes (inputs and targets shifted by one). Global example
    ``g = k * batch_size + row`` is window ``perm_e[g % n]`` of epoch
    ``e = g // n``, with ``perm_e`` a permutation seeded by ``(seed, e)``.
    With a ``sharding`` the result is a global ``jax.Array`` assembled from the
    rows this process holds; without one, numpy arrays.

    Example::

        >>> b = TokenBatches(tokens, 8, 64, trainer.batch_sharding, seed=1)
        >>> b.batch_at(7)["inputs"].shape
        (8, 64)
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, sharding: Any = None,
                 *, seed: int = 0, name: str = "data"):
        if batch_size < 1 or seq_len < 1:
            raise DataError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
        self.tokens = np.asarray(tokens, dtype=np.uint8)
        self.batch_size, self.seq_len, self.sharding, self.seed = batch_size, seq_len, sharding, seed
        self.n_windows = (len(self.tokens) - 1) // seq_len
        if self.n_windows < batch_size:
            raise DataError(
                f"{name}: {len(self.tokens):,} bytes make only {self.n_windows} windows of "
                f"{seq_len + 1} bytes, fewer than the batch size {batch_size}; use more data or "
                f"smaller train.batch_size / train.seq_len"
            )
        self._perms: dict[int, np.ndarray] = {}
        shape = (batch_size, seq_len)
        self._rows, self._cols = (
            local_block(sharding, shape) if sharding is not None else (slice(0, batch_size), slice(0, seq_len))
        )

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.n_windows)
        return self._perms[epoch]

    def windows_at(self, step: int) -> np.ndarray:
        """Window indices of the global batch of ``step`` (all rows)."""
        g = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        epochs, pos = g // self.n_windows, g % self.n_windows
        return np.array([self._perm(int(e))[p] for e, p in zip(epochs, pos)], dtype=np.int64)

    def host_batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This process's block of the batch of ``step`` as numpy ``int32`` arrays."""
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        starts = self.windows_at(step)[self._rows] * self.seq_len
        offsets = np.arange(self._cols.start, self._cols.stop + 1)
        chunk = self.tokens[starts[:, None] + offsets[None, :]].astype(np.int32)
        return {"inputs": chunk[:, :-1], "targets": chunk[:, 1:]}

    def batch_at(self, step: int) -> dict[str, Any]:
        """The global batch of ``step``: ``{"inputs", "targets"}``, int32 ``(batch, seq_len)``."""
        local = self.host_batch_at(step)
        if self.sharding is None:
            return local
        shape = (self.batch_size, self.seq_len)
        return {k: jax.make_array_from_process_local_data(self.sharding, v, shape) for k, v in local.items()}

    def __iter__(self):
        step = 0
        while True:
            yield self.batch_at(step)
            step += 1


class ArrayDataset:
    """A dataset of examples held as arrays with a leading example dimension (images, labels, ...).

    The last ``eval_fraction`` of the examples (after a seeded shuffle by
    ``split_seed``) is the eval split. A data source a config names with
    ``data: {_target_: ...}`` returns one of these (or anything with
    ``example(batch_size)`` and ``batches(split, batch_size, shardings, seed=)``).

    Example::

        >>> data = ArrayDataset({"inputs": images, "targets": labels}, eval_fraction=0.1)
        >>> trainer = Trainer(model, tx, mesh, "dp", batch=data.example(64), task="classification")
        >>> batches = data.batches("train", 64, trainer.batch_shardings, seed=0)
    """

    def __init__(self, arrays: dict[str, Any], *, eval_fraction: float = 0.1, split_seed: int = 0,
                 source: str = "arrays"):
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        sizes = {len(v) for v in arrays.values()}
        if len(sizes) != 1 or not sizes or 0 in sizes:
            raise DataError(f"{source}: the arrays need one shared, non-zero leading (example) dimension, got "
                            f"{ {k: v.shape for k, v in arrays.items()} }")
        if not 0 < eval_fraction < 1:
            raise DataError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}",
                            arg="eval_fraction")
        n = sizes.pop()
        order = np.random.default_rng(split_seed).permutation(n)
        cut = n - max(1, int(n * eval_fraction))
        self.splits = {"train": order[:cut], "eval": order[cut:]}
        self.arrays, self.source = arrays, source

    def example(self, batch_size: int) -> dict[str, Any]:
        """One batch's shapes and dtypes (``ShapeDtypeStruct`` s)."""
        return {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype) for k, v in self.arrays.items()}

    def __len__(self) -> int:
        return len(self.splits["train"])

    def batches(self, split: str, batch_size: int, shardings: Any = None, *, seed: int = 0) -> "ArrayBatches":
        """Resumable batches of ``split``: the batch of step ``k`` is a pure function of ``(seed, k)``."""
        if split not in self.splits:
            raise DataError(f"split must be 'train' or 'eval', got {split!r}")
        return ArrayBatches(self.arrays, self.splits[split], batch_size, shardings, seed=seed,
                            name=f"{self.source} ({split})")


class ArrayBatches:
    """Batches of examples ``indices`` of ``arrays``; epoch ``e`` visits them in an order seeded by ``(seed, e)``."""

    def __init__(self, arrays: dict[str, np.ndarray], indices: np.ndarray, batch_size: int, shardings: Any,
                 *, seed: int, name: str):
        if len(indices) < batch_size:
            raise DataError(f"{name}: {len(indices)} examples, fewer than the batch size {batch_size}; use more "
                            f"data or a smaller train.batch_size")
        self.arrays, self.indices, self.batch_size = arrays, indices, batch_size
        self.shardings, self.seed = shardings, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {k: v for k, v in self._perms.items() if k >= epoch - 1}
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.indices))
        return self._perms[epoch]

    def host_batch_at(self, step: int) -> dict[str, np.ndarray]:
        """The global batch of ``step`` as numpy arrays."""
        g = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        n = len(self.indices)
        rows = np.array([self.indices[self._perm(int(e))[p]] for e, p in zip(g // n, g % n)])
        return {k: v[rows] for k, v in self.arrays.items()}

    def batch_at(self, step: int) -> dict[str, Any]:
        """The global batch of ``step``, placed on the devices (each process builds only its rows)."""
        host = self.host_batch_at(step)
        return host if self.shardings is None else place(host, self.shardings)


__all__ = ["Corpus", "TokenBatches", "ArrayDataset", "ArrayBatches", "load_corpus", "stdlib_files", "VOCAB_SIZE"]
