"""Rows of instruction examples: several examples per row of ``seq_len`` (packing) or one each, with segment ids.

An example of ``n`` tokens fills ``n - 1`` slots of a row (inputs ``tokens[:-1]``, targets
``tokens[1:]``, ``loss_mask`` its mask shifted the same way); examples longer than ``seq_len + 1`` tokens
are cut to that length, their end (``truncation="right"``) or their start (``"left"``) going, or left
out (``"drop"``; :mod:`partitioning.data.truncation`); :attr:`PackedBatches.truncated` counts them. A
row carries, besides ``inputs`` and ``targets`` (int32), ``loss_mask`` (float32), ``segment_ids`` (int32:
1..n for the examples of the row, 0 for padding) and ``positions`` (int32, restarting at 0 for each
example), so a model that honours them never attends across examples and sees each at the positions it would alone.

Packing is best-fit decreasing (:func:`pack`), ties broken by an order shuffled by ``(seed, split)``,
done once; the rows are then visited in grain's seeded per-epoch order
(:func:`~partitioning.data.order.example_order`), so the batch of step ``k`` is a pure function of
``(seed, k)`` and each process builds only the rows (and columns) its devices hold.

Example::

    >>> from partitioning.data.instruct import Examples
    >>> from partitioning.data.packing import PackedBatches
    >>> tokens = np.arange(1, 13, dtype=np.int32)                 # three examples: 3, 4 and 5 tokens
    >>> ex = Examples(tokens, np.ones(12, np.uint8), np.array([0, 3, 7, 12]), "demo")
    >>> b = PackedBatches(ex, 1, 8, seed=0)
    >>> row = b.batch_at(0)
    >>> row["inputs"].tolist()                                    # two examples, then padding
    [[8, 9, 10, 11, 4, 5, 6, 0]]
    >>> row["segment_ids"].tolist(), row["positions"].tolist()
    ([[1, 1, 1, 1, 2, 2, 2, 0]], [[0, 1, 2, 3, 0, 1, 2, 0]])
    >>> b.note
    'data: 3 examples packed into 2 rows of 8 tokens: 56.2% of the slots hold tokens'
"""

from __future__ import annotations

import bisect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from partitioning.data.batch import local_block
from partitioning.errors import DataError

KEYS = ("inputs", "targets", "loss_mask", "segment_ids", "positions")


def instruction_batch(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The shapes of a batch of instruction rows: int32 tokens, float32 ``loss_mask``, int32 segments / positions.

    Example::

        >>> from partitioning.data.packing import instruction_batch
        >>> {k: str(v.dtype) for k, v in instruction_batch(8, 64).items()}["loss_mask"]
        'float32'
    """
    shape = (int(batch_size), int(seq_len))
    out = {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k in KEYS}
    out["loss_mask"] = jax.ShapeDtypeStruct(shape, jnp.float32)
    return out


def pack(
    lengths: np.ndarray, seq_len: int, order: np.ndarray, packing: bool = True, drop_long: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(members, row_offsets): row ``r`` holds examples ``members[row_offsets[r]:row_offsets[r+1]]``.

    Best-fit decreasing (TRL's default): the longest example first, each into the fullest row it still
    fits; ``order`` breaks ties between examples of one length, so it decides which share a row. An example
    takes ``min(length, seq_len + 1) - 1`` slots; examples of fewer than 2 tokens (no target) are left out.
    Without ``packing`` each example is a row of its own, in ``order``. ``drop_long`` leaves out the examples
    longer than ``seq_len + 1`` tokens instead of cutting them.

    Example::

        >>> from partitioning.data.packing import pack
        >>> members, offsets = pack(np.array([5, 4, 3, 9]), 8, np.arange(4))   # slots 4, 3, 2, 8
        >>> [members[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        [[3], [0, 1], [2]]
    """
    lengths = np.asarray(lengths, np.int64)
    slots = np.minimum(lengths, seq_len + 1) - 1
    if drop_long:
        slots = np.where(lengths > seq_len + 1, 0, slots)
    kept = [int(i) for i in np.asarray(order, np.int64) if slots[i] >= 1]
    if not packing:
        return np.asarray(kept, np.int64), np.arange(len(kept) + 1, dtype=np.int64)
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (slots left, row), sorted: the fullest row that fits is the first >= s
    for i in sorted(kept, key=lambda i: -int(slots[i])):  # stable: ties keep `order`
        s = int(slots[i])
        k = bisect.bisect_left(free, (s, -1))
        if k < len(free):
            left, r = free.pop(k)
            rows[r].append(i)
        else:
            r, left = len(rows), seq_len
            rows.append([i])
        if left - s > 0:
            bisect.insort(free, (left - s, r))
    members = [i for row in rows for i in row]
    return np.asarray(members, np.int64), np.cumsum([0] + [len(r) for r in rows], dtype=np.int64)


def _examples(n: int) -> str:
    return f"{n:,} example{'s' * (n != 1)}"


class PackedRows:
    """Row ``r``'s arrays (:data:`KEYS`), columns ``cols``, built from the examples it holds; many at a time."""

    def __init__(
        self, examples: Any, members: np.ndarray, offsets: np.ndarray, seq_len: int, cols: slice, left: bool = False
    ):
        self.examples, self.members, self.offsets = examples, members, offsets
        self.seq_len, self.cols, self.left = int(seq_len), cols, left

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __call__(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, np.int64)
        t = self.seq_len
        out = {k: np.zeros((len(rows), t), np.float32 if k == "loss_mask" else np.int32) for k in KEYS}
        for b, r in enumerate(rows):
            p = 0
            for seg, i in enumerate(self.members[self.offsets[r] : self.offsets[r + 1]], 1):
                tokens, mask = self.examples.example(int(i))
                cut = slice(-(t + 1), None) if self.left and len(tokens) > t + 1 else slice(0, t + 1)
                tokens, mask = tokens[cut], mask[cut]
                n = len(tokens) - 1
                out["inputs"][b, p : p + n] = tokens[:-1]
                out["targets"][b, p : p + n] = tokens[1:]
                out["loss_mask"][b, p : p + n] = mask[1:]
                out["segment_ids"][b, p : p + n] = seg
                out["positions"][b, p : p + n] = np.arange(n)
                p += n
        return {k: v[:, self.cols] for k, v in out.items()}


class PackedBatches:
    """Batches of instruction rows (:data:`KEYS`) where the batch of step ``k`` is a pure function of ``(seed, k)``.

    ``packing`` puts several examples in a row (best-fit decreasing, :func:`pack`); without it each example
    is a row, padded. :attr:`efficiency` is the share of slots that hold tokens; :attr:`note` says it in a line.
    """

    def __init__(
        self,
        examples: Any,
        batch_size: int,
        seq_len: int,
        sharding: Any = None,
        *,
        seed: int = 0,
        name: str = "data",
        split: str = "train",
        packing: bool = True,
        truncation: str = "right",
    ):
        from partitioning.data.order import ProcessRows, example_order, grain_seed
        from partitioning.data.truncation import MODES

        if truncation not in MODES:
            raise DataError(f"truncation must be one of {', '.join(MODES)}, got {truncation!r}", arg="truncation")
        if batch_size < 1 or seq_len < 1:
            raise DataError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
        self.batch_size, self.seq_len, self.sharding, self.seed = batch_size, seq_len, sharding, seed
        self.split, self.packing = split, packing
        lengths = examples.lengths
        order = np.random.default_rng(grain_seed(seed, split)).permutation(len(lengths)) if packing else None
        self.members, self.offsets = pack(
            lengths, seq_len, order if order is not None else np.arange(len(lengths)), packing, truncation == "drop"
        )
        self.n_rows = len(self.offsets) - 1
        kept = lengths[self.members]
        self.truncated = int((kept > seq_len + 1).sum())
        self.dropped = int(len(lengths) - len(self.members))
        self.long_dropped = int((lengths > seq_len + 1).sum()) if truncation == "drop" else 0
        slots = int((np.minimum(kept, seq_len + 1) - 1).sum())
        self.efficiency = slots / max(1, self.n_rows * seq_len)
        if self.n_rows < batch_size:
            raise DataError(
                f"{name}: {len(lengths):,} examples make only {self.n_rows} row{'s' * (self.n_rows != 1)} of "
                f"{seq_len} tokens, fewer than the batch size {batch_size}; use more data or a smaller "
                "train.batch_size"
            )
        how = "packed into" if packing else "one per row:"
        note = (
            f"{name}: {_examples(len(self.members))} {how} {self.n_rows:,} rows of {seq_len} tokens: "
            f"{self.efficiency:.1%} of the slots hold tokens"
        )
        if self.truncated:
            which = "their start" if truncation == "left" else "their end"
            note += f"; {_examples(self.truncated)} longer than {seq_len + 1} tokens cut to that length ({which} cut)"
        if self.long_dropped:
            note += f"; {_examples(self.long_dropped)} longer than {seq_len + 1} tokens left out"
        if self.dropped - self.long_dropped:
            note += f"; {_examples(self.dropped - self.long_dropped)} of fewer than 2 tokens left out"
        self.note = note
        shape = (batch_size, seq_len)
        block = local_block(sharding, shape) if sharding is not None else (slice(0, batch_size), slice(0, seq_len))
        self._rows = block[0]
        read = PackedRows(examples, self.members, self.offsets, seq_len, block[1], left=truncation == "left")
        self.dataset = ProcessRows(example_order(self.n_rows, seed, split), batch_size, self._rows).map(read)

    def rows_at(self, step: int) -> np.ndarray:
        """The packed rows (indices into :attr:`offsets`) of the whole global batch of ``step``."""
        from partitioning.data.order import ProcessRows, example_order

        return ProcessRows(
            example_order(self.n_rows, self.seed, self.split), self.batch_size, slice(0, self.batch_size)
        )[step]

    def examples_at(self, step: int) -> list[list[int]]:
        """The examples in each row of the global batch of ``step``, in order (segment 1, 2, ...)."""
        return [self.members[self.offsets[r] : self.offsets[r + 1]].tolist() for r in self.rows_at(step)]

    def host_batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This process's block of the batch of ``step`` as numpy arrays."""
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        return self.dataset[int(step)]

    def batch_at(self, step: int) -> dict[str, Any]:
        """The global batch of ``step`` (:data:`KEYS`, each ``(batch, seq_len)``)."""
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


__all__ = ["PackedBatches", "PackedRows", "pack", "instruction_batch", "KEYS"]
