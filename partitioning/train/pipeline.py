"""The grain pipeline behind every batch: random-access sources, a seeded endless example order, this
process's rows of global batch ``k``.

Example ``g`` of a run (``g = k * batch_size + row``) is read from a grain
``MapDataset`` built as::

    MapDataset.source(windows).seed(s).shuffle().repeat()

so it is a pure function of ``(seed, g)``: epoch ``e = g // n`` visits all
``n`` examples once, in an order seeded by ``(s + e)``, with ``s`` derived
from the user's seed and the split. :class:`ProcessRows` is the global batch
of step ``k`` cut to the rows (and columns) this process's devices hold, so
each process reads only its own data, and one process or eight, any mesh,
and a run resumed at step ``k`` all see the same global batch ``k``.

Example::

    >>> ds = token_batches(stream, seq_len=128, batch_size=32, seed=0, rows=slice(0, 16))
    >>> ds[7]["inputs"].shape          # this process's half of step 7's batch
    (16, 128)
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np

from partitioning.train.batch import local_block
from partitioning.train.sources import TokenStream

_SALT = {"train": 0, "eval": 1}


def grain_seed(seed: int, split: str = "train") -> int:
    """The 32-bit shuffle seed grain gets for a user's ``seed`` and ``split``.

    Grain reseeds epoch ``e`` with ``s + e``; hashing keeps seed 1's first epoch
    from being seed 0's second.
    """
    return int(np.random.SeedSequence([int(seed), _SALT.get(split, 2)]).generate_state(1)[0])


class TokenWindows:
    """A grain random-access source: window ``i`` is tokens ``[i*T + c0, i*T + c1 + 1)`` of a stream.

    ``T`` is ``seq_len``; ``cols = slice(c0, c1)`` are the columns of the batch
    this process holds (all by default). Batched reads gather every window of
    a batch in one indexing operation.
    """

    def __init__(self, tokens: Any, seq_len: int, cols: slice | None = None):
        self.stream = tokens if isinstance(tokens, TokenStream) else TokenStream([tokens])
        self.seq_len = int(seq_len)
        self.cols = cols if cols is not None else slice(0, self.seq_len)
        self.n = (len(self.stream) - 1) // self.seq_len

    def __len__(self) -> int:
        return self.n

    def _read(self, indices: Sequence[int]) -> np.ndarray:
        starts = np.asarray(indices, dtype=np.int64) * self.seq_len + self.cols.start
        return self.stream.take(starts, self.cols.stop - self.cols.start + 1)

    def __getitem__(self, index: int) -> np.ndarray:
        return self._read([index])[0]

    def _getitems(self, indices: Sequence[int]) -> list[np.ndarray]:
        return list(self._read(indices))

    def __repr__(self) -> str:
        return f"TokenWindows({len(self.stream):,} tokens, seq_len={self.seq_len})"


class ArrayRows:
    """A grain random-access source: row ``i`` is ``{key: array[indices[i]]}`` of a dict of arrays."""

    def __init__(self, arrays: dict[str, np.ndarray], indices: np.ndarray):
        self.arrays, self.indices = arrays, np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[self.indices[index]] for k, v in self.arrays.items()}

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        rows = self.indices[np.asarray(indices, dtype=np.int64)]
        block = {k: v[rows] for k, v in self.arrays.items()}
        return [{k: v[i] for k, v in block.items()} for i in range(len(rows))]


def examples(source: Any, seed: int, split: str = "train") -> grain.MapDataset:
    """The endless example order of a run: item ``g`` is example ``g``, epoch by epoch reshuffled."""
    return grain.MapDataset.source(source).seed(grain_seed(seed, split)).shuffle().repeat()


def _stack(items: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.stack(xs), *items)


class ProcessRows(grain.MapDataset):
    """Item ``k``: rows ``rows`` of global batch ``k`` of ``parent`` (examples ``k*B + r``), stacked.

    The grain counterpart of ``parent.batch(batch_size)[k][rows]`` that reads
    only the rows asked for.
    """

    def __init__(self, parent: grain.MapDataset, batch_size: int, rows: slice):
        super().__init__(parent)
        self.batch_size, self.rows = int(batch_size), rows

    def __len__(self) -> int:
        return len(self._parent) // self.batch_size

    def __str__(self) -> str:
        return f"ProcessRows(batch_size={self.batch_size}, rows={self.rows.start}:{self.rows.stop})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        base = int(index) * self.batch_size
        # grain's batched read: one gather per batch for sources that support it.
        items = self._parent._getitems([base + r for r in range(self.rows.start, self.rows.stop)])  # noqa: SLF001
        return _stack(list(items))


def _inputs_targets(window: np.ndarray) -> dict[str, np.ndarray]:
    w = window.astype(np.int32)
    return {"inputs": w[:, :-1], "targets": w[:, 1:]}


def token_batches(tokens: Any, *, seq_len: int, batch_size: int, seed: int, split: str = "train",
                  rows: slice | None = None, cols: slice | None = None) -> grain.MapDataset:
    """Item ``k``: this process's block of step ``k``'s ``{"inputs", "targets"}`` (int32), from windows of
    ``seq_len + 1`` tokens."""
    source = TokenWindows(tokens, seq_len, cols)
    rows = rows if rows is not None else slice(0, batch_size)
    return ProcessRows(examples(source, seed, split), batch_size, rows).map(_inputs_targets)


def array_batches(arrays: dict[str, np.ndarray], indices: np.ndarray, *, batch_size: int, seed: int,
                  split: str = "train", rows: slice | None = None) -> grain.MapDataset:
    """Item ``k``: rows ``rows`` of step ``k``'s batch of examples ``indices`` of ``arrays``."""
    rows = rows if rows is not None else slice(0, batch_size)
    return ProcessRows(examples(ArrayRows(arrays, indices), seed, split), batch_size, rows)


def process_rows(shardings: Any, shapes: Any) -> slice:
    """The rows of a global batch this process holds: the span of every leaf's local block on dim 0."""
    blocks = [local_block(s, shape)[0] for s, shape in zip(jax.tree.leaves(shardings), shapes)]
    return slice(min(b.start for b in blocks), max(b.stop for b in blocks))


# -- a record of what each step trained on ---------------------------------------------------------

def batch_digest(batch: Any) -> dict[str, int]:
    """CRC32 of each row this process holds of each leaf of a global batch: ``{"inputs[3]": crc, ...}``.

    A row split over processes by columns is keyed ``inputs[3,0:64]``. Rows are
    keyed by their global index, so the records of all processes join into the
    digest of the whole batch, comparable across meshes and process counts.
    """
    out: dict[str, int] = {}
    flat, _ = jax.tree_util.tree_flatten_with_path(batch)
    for path, x in flat:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        shards = x.addressable_shards if isinstance(x, jax.Array) else None
        pieces = [(s.index, np.asarray(s.data)) for s in shards] if shards else [((), np.asarray(x))]
        for index, data in pieces:
            r0 = index[0].indices(x.shape[0])[0] if index else 0
            cols = index[1].indices(x.shape[1])[:2] if len(index) > 1 else None
            full = cols is None or cols == (0, x.shape[1])
            for i, row in enumerate(data):
                key = f"{name}[{r0 + i}]" if full else f"{name}[{r0 + i},{cols[0]}:{cols[1]}]"
                out[key] = zlib.crc32(np.ascontiguousarray(row).tobytes())
    return out


class LoggedBatches:
    """``batch_at(step)`` of ``batches``, appending ``{"step", "process", "rows": batch_digest}`` to ``path``.

    Each line is flushed at once, so a killed run's record is complete up to
    the batch it was given last.

    Example::

        >>> train = LoggedBatches(train, "runs/x/batches.0.jsonl")
    """

    def __init__(self, batches: Any, path: str | os.PathLike):
        self.batches, self.path = batches, Path(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.batches, name)

    def batch_at(self, step: int) -> Any:
        batch = self.batches.batch_at(step)
        record = {"step": int(step), "process": jax.process_index(), "rows": batch_digest(batch)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return batch


__all__ = ["TokenWindows", "ArrayRows", "ProcessRows", "examples", "token_batches", "array_batches", "grain_seed",
           "process_rows", "batch_digest", "LoggedBatches"]
