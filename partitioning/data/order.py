"""The grain pipeline behind every batch: a seeded endless example order, this process's rows of global
batch ``k``, read in one gather.

Example ``g`` of a run (``g = k * batch_size + row``) is the window (or
array row) grain's ``MapDataset`` ::

    MapDataset.range(n).seed(s).shuffle().repeat()

gives at index ``g``, so it is a pure function of ``(seed, g)``: epoch
``e = g // n`` visits all ``n`` examples once, in an order seeded by
``(s + e)``, with ``s`` derived from the user's seed and the split.
:class:`ProcessRows` is global batch ``k`` cut to the rows this process's
devices hold, and a ``map`` reads exactly those examples (only the columns
the process holds, for token windows), so each process reads only its own
data, and one process or eight, any mesh, and a run resumed at step ``k`` all
see the same global batch ``k``. The order carries indices, not data, so the
read is one vectorized gather per batch rather than one per example.

Example::

    >>> from partitioning.data.order import token_batches
    >>> stream = np.arange(100_000) % 256
    >>> ds = token_batches(stream, seq_len=128, batch_size=32, seed=0, rows=slice(0, 16))
    >>> ds[7]["inputs"].shape          # this process's half of step 7's batch
    (16, 128)
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np

from partitioning.data.batch import local_block
from partitioning.data.sources import TokenStream

_SALT = {"train": 0, "eval": 1}


def grain_seed(seed: int, split: str = "train") -> int:
    """The 32-bit shuffle seed grain gets for a user's ``seed`` and ``split``.

    Grain reseeds epoch ``e`` with ``s + e``; hashing keeps seed 1's first epoch
    from being seed 0's second.
    """
    return int(np.random.SeedSequence([int(seed), _SALT.get(split, 2)]).generate_state(1)[0])


def example_order(n: int, seed: int, split: str = "train") -> grain.MapDataset:
    """The endless example order of a run: item ``g`` is the index (in ``[0, n)``) of example ``g``."""
    return grain.MapDataset.range(n).seed(grain_seed(seed, split)).shuffle().repeat()


class ProcessRows(grain.MapDataset):
    """Item ``k``: rows ``rows`` of global batch ``k`` of ``parent`` (items ``k*B + r``), as one array.

    The grain counterpart of ``parent.batch(batch_size)[k][rows]`` that touches
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
        # grain's batched read (what its own batch transform uses), one call per batch.
        items = self._parent._getitems([base + r for r in range(self.rows.start, self.rows.stop)])
        return np.asarray(items, dtype=np.int64)


class TokenWindows:
    """Window ``i`` of a token stream: tokens ``[i*T + c0, i*T + c1 + 1)``, read many at a time.

    ``T`` is ``seq_len``; ``cols = slice(c0, c1)`` are the columns of the batch
    this process holds (all by default).
    """

    def __init__(self, tokens: Any, seq_len: int, cols: slice | None = None):
        self.stream = tokens if isinstance(tokens, TokenStream) else TokenStream([tokens])
        self.seq_len = int(seq_len)
        self.cols = cols if cols is not None else slice(0, self.seq_len)
        self.n = (len(self.stream) - 1) // self.seq_len

    def __len__(self) -> int:
        return self.n

    def __call__(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """``{"inputs", "targets"}`` (int32) of the windows, targets shifted by one token."""
        starts = np.asarray(windows, dtype=np.int64) * self.seq_len + self.cols.start
        w = self.stream.take(starts, self.cols.stop - self.cols.start + 1).astype(np.int32)
        return {"inputs": w[:, :-1], "targets": w[:, 1:]}


class ArrayRows:
    """Rows ``indices[i]`` of a dict of arrays, read many at a time."""

    def __init__(self, arrays: dict[str, np.ndarray], indices: np.ndarray):
        self.arrays, self.indices = arrays, np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __call__(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        picked = self.indices[rows]
        return {k: v[picked] for k, v in self.arrays.items()}


def token_batches(
    tokens: Any,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    split: str = "train",
    rows: slice | None = None,
    cols: slice | None = None,
) -> grain.MapDataset:
    """Item ``k``: this process's block of step ``k``'s ``{"inputs", "targets"}`` (int32), from windows of
    ``seq_len + 1`` tokens."""
    read = TokenWindows(tokens, seq_len, cols)
    rows = rows if rows is not None else slice(0, batch_size)
    return ProcessRows(example_order(len(read), seed, split), batch_size, rows).map(read)


def array_batches(
    arrays: dict[str, np.ndarray],
    indices: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    split: str = "train",
    rows: slice | None = None,
) -> grain.MapDataset:
    """Item ``k``: rows ``rows`` of step ``k``'s batch of examples ``indices`` of ``arrays``."""
    read = ArrayRows(arrays, indices)
    rows = rows if rows is not None else slice(0, batch_size)
    return ProcessRows(example_order(len(read), seed, split), batch_size, rows).map(read)


def process_rows(shardings: Any, shapes: Any) -> slice:
    """The rows of a global batch this process holds: the span of every leaf's local block on dim 0."""
    blocks = [local_block(s, shape)[0] for s, shape in zip(jax.tree.leaves(shardings), shapes, strict=True)]
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
        pieces: list[tuple[tuple[slice, ...], np.ndarray]]
        pieces = [(s.index, np.asarray(s.data)) for s in shards] if shards else [((), np.asarray(x))]
        for index, data in pieces:
            r0 = index[0].indices(x.shape[0])[0] if index else 0
            c0, c1 = index[1].indices(x.shape[1])[:2] if len(index) > 1 else (0, x.shape[1])
            full = (c0, c1) == (0, x.shape[1])
            for i, row in enumerate(data):
                key = f"{name}[{r0 + i}]" if full else f"{name}[{r0 + i},{c0}:{c1}]"
                out[key] = zlib.crc32(np.ascontiguousarray(row).tobytes())
    return out


class LoggedBatches:
    """``batch_at(step)`` of ``batches``, appending ``{"step", "process", "rows": batch_digest}`` to ``path``.

    Each line is flushed at once, so a killed run's record is complete up to
    the batch it was given last.

    Example::

        >>> import json, pathlib, tempfile
        >>> from partitioning.data.order import LoggedBatches
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "batches.0.jsonl"
        >>> train = LoggedBatches(pt.data.TokenBatches(np.arange(4096) % 256, 8, 16), path)
        >>> _ = train.batch_at(3)
        >>> record = json.loads(path.read_text())
        >>> record["step"], record["process"], len(record["rows"])
        (3, 0, 16)
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


__all__ = [
    "TokenWindows",
    "ArrayRows",
    "ProcessRows",
    "example_order",
    "token_batches",
    "array_batches",
    "grain_seed",
    "process_rows",
    "batch_digest",
    "LoggedBatches",
]
