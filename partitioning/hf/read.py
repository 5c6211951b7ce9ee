"""Per-shard reads: each process reads only the bytes of the parameter shards its devices hold.

For one parameter and its target sharding, the distinct boxes of this
process's devices (replicas read once) are mapped through the name map's
pattern to boxes of the file tensor's atoms (:mod:`~partitioning.hf.pattern`),
layer by layer for a stacked parameter (so a pipeline stage reads only its
layers). The union of those boxes is read in pieces of at most ``chunk``
bytes with ``os.preadv`` into one reused scratch buffer (not ``mmap``: mapped
pages count toward the process's RSS): a piece whose rows are only partly this
process's (FSDP over the contiguous ``embed`` dimension) is read run by run,
skipping the other processes' bytes, when its runs are long enough
(``MIN_RUN``) for a read call each to cost less than the bytes skipped. Each
piece is copied, transposed
and cast by NumPy into the shard buffers. A piece that is already a shard's
bytes in the shard's order and dtype is read straight into the shard. The
shard buffers are 64-byte aligned, so the CPU client adopts them without a
copy; other platforms transfer them as usual. Host memory beyond the
process's own shards is the scratch buffer.

Example::

    >>> from partitioning.hf.files import discover
    >>> from partitioning.hf.pattern import Pattern
    >>> from partitioning.hf.read import Reader
    >>> s = discover("tests/fixtures/hf/llama")["model.layers.0.self_attn.q_proj.weight"]
    >>> shard = np.empty((4, 4, 8), np.float32)  # d 0:4 of 32 (one device's FSDP shard), every head
    >>> with Reader() as r:  # (h k, d) on disk, (d, h, k) in the model
    ...     r.tensor(s, Pattern.parse("(h k) d -> d h k"), None, (32, 4, 8), [(((0, 4), (0, 4), (0, 8)), shard)])
    ...     r.bytes_read  # 16-byte runs: read with the gaps between them, rows 0..30 and 16 bytes of row 31
    3984
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from partitioning.checkpoint.reader import _aligned_empty
from partitioning.errors import CheckpointError
from partitioning.hf.files import Stored
from partitioning.hf.name_map import ParamMap
from partitioning.hf.pattern import Box, Pattern

CHUNK = 32 * 2**20
TILE = 128
# Bytes: shorter runs are read with the gaps between them. From the page cache one read call costs about as much
# as copying 64 KiB; benchmarks/bench_hf.py measured 2 KiB runs read one by one at 0.46-0.70x of load_file's
# rate, read with their gaps at 0.97x.
MIN_RUN = 64 * 2**10


def _strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _span(box: Box, strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """(first byte, byte count) of the smallest contiguous range holding ``box``."""
    first = sum(a * s for (a, _), s in zip(box, strides, strict=True))
    last = sum((b - 1) * s for (_, b), s in zip(box, strides, strict=True))
    return first, last - first + itemsize


def pieces(box: Box, strides: tuple[int, ...], itemsize: int, limit: int) -> Iterator[Box]:
    """``box`` split along its outer dimensions into boxes whose byte span is at most ``limit``, in file order."""
    if _span(box, strides, itemsize)[1] <= limit:
        yield box
        return
    dim = next((i for i, (a, b) in enumerate(box) if b - a > 1), None)
    if dim is None:
        yield box
        return
    a, b = box[dim]
    mid = (a + b) // 2
    yield from pieces(box[:dim] + ((a, mid),) + box[dim + 1 :], strides, itemsize, limit)
    yield from pieces(box[:dim] + ((mid, b),) + box[dim + 1 :], strides, itemsize, limit)


def runs(box: Box, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> list[tuple[int, int]]:
    """``(first byte, byte count)`` of each contiguous run of ``box`` in a C-ordered tensor of ``shape``.

    Example::

        >>> from partitioning.hf.read import runs
        >>> runs(((0, 2), (0, 2)), (2, 4), (16, 4), 4)  # the left half of each row
        [(0, 8), (16, 8)]
    """
    k = len(shape)
    while k > 0 and box[k - 1] == (0, shape[k - 1]):
        k -= 1
    if k <= 1:  # whole rows from some dimension on: one run
        return [_span(box, strides, itemsize)]
    length = (box[k - 1][1] - box[k - 1][0]) * strides[k - 1]
    inner = box[k - 1][0] * strides[k - 1]
    outer = itertools.product(*(range(a, b) for a, b in box[: k - 1]))
    return [(sum(i * s for i, s in zip(idx, strides, strict=False)) + inner, length) for idx in outer]


def _union(boxes: Sequence[Box]) -> Box:
    return tuple((min(b[i][0] for b in boxes), max(b[i][1] for b in boxes)) for i in range(len(boxes[0])))


def _intersect(x: Box, y: Box) -> Box | None:
    out = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(x, y, strict=True))
    return None if any(a >= b for a, b in out) else out


def _local(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin, strict=True))


def _fastest(a: np.ndarray) -> int:
    return min(range(a.ndim), key=lambda i: abs(a.strides[i]) if a.shape[i] > 1 else 1 << 62)


def copy(dst: np.ndarray, src: np.ndarray, block: int = TILE) -> None:
    """``dst[...] = src`` (cast as needed), in tiles when the two walk memory along different axes.

    NumPy copies a transposed view element by element across cache lines (~0.2 GB/s); tiles of
    ``block`` x ``block`` along the two fast axes keep both sides in cache (2-3x faster).
    """
    a, b = _fastest(src), _fastest(dst)
    if a == b or src.size < block * block:
        np.copyto(dst, src, casting="unsafe")
        return
    full = [slice(None)] * src.ndim
    for i in range(0, src.shape[a], block):
        for j in range(0, src.shape[b], block):
            full[a], full[b] = slice(i, i + block), slice(j, j + block)
            np.copyto(dst[tuple(full)], src[tuple(full)], casting="unsafe")


def _boxes(sharding: Any, shape: tuple[int, ...]) -> dict[Box, list[Any]]:
    """This process's distinct device boxes (devices holding the same box share one read)."""
    out: dict[Box, list[Any]] = defaultdict(list)
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        out[tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))].append(device)
    return out


class Reader:
    """Open files and one scratch buffer for a load; :meth:`param` builds each parameter's global array."""

    def __init__(self, chunk: int = CHUNK):
        self.chunk = int(chunk)
        self.fds: dict[Any, int] = {}
        self.scratch: np.ndarray | None = None
        self.bytes_read = 0

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.scratch = None

    def _pread(self, s: Stored, offset: int, out: memoryview) -> None:
        fd = self.fds.get(s.file)
        if fd is None:
            fd = self.fds[s.file] = os.open(s.file, os.O_RDONLY)
        pos = s.start + offset
        while len(out):
            n = os.preadv(fd, [out], pos)
            if n <= 0:
                raise CheckpointError(f"{s.file}: truncated while reading tensor {s.name!r} (byte {pos})")
            self.bytes_read += n
            out, pos = out[n:], pos + n

    def tensor(self, s: Stored, pattern: Pattern, part: int | None, shape: tuple, targets: list) -> None:
        """Fills each ``(parameter box, parameter-ordered buffer)`` target from the file tensor ``s``."""
        atom_shape = pattern.atom_shape(shape)
        itemsize = s.dtype.itemsize
        strides = _strides(atom_shape, itemsize)
        boxed = [(pattern.atom_box(box, part), pattern.atoms_view(buf)) for box, buf in targets]
        for piece in pieces(_union([b for b, _ in boxed]), strides, itemsize, self.chunk):
            first, span = _span(piece, strides, itemsize)
            if len(boxed) == 1:
                sub = boxed[0][1][_local(piece, boxed[0][0])]
                if sub.dtype == s.dtype and sub.flags.c_contiguous and sub.nbytes == span:
                    # Already the shard's bytes in its order and dtype: read straight into it.
                    self._pread(s, first, sub.reshape(-1).view(np.uint8).data)
                    continue
            if self.scratch is None or self.scratch.nbytes < span:
                self.scratch = np.empty(max(span, min(self.chunk, 2**20)), np.uint8)
            exact = runs(piece, atom_shape, strides, itemsize)
            if len(exact) > 1 and exact[0][1] >= MIN_RUN:
                for start, n in exact:  # the gaps are other processes' shards: never read
                    self._pread(s, start, self.scratch.data[start - first : start - first + n])
            else:
                self._pread(s, first, self.scratch.data[:span])
            shape_p = tuple(b - a for a, b in piece)
            src = np.ndarray(shape_p, s.dtype, buffer=self.scratch, offset=0, strides=strides)
            for b, v in boxed:
                inter = _intersect(piece, b)
                if inter is not None:
                    copy(v[_local(inter, b)], src[_local(inter, piece)])

    def param(self, m: ParamMap, stored: Sequence[Stored], shape: tuple, dtype: Any, sharding: Any) -> jax.Array:
        """The global array of one parameter under ``sharding``, from its file tensor(s) ``stored``."""
        dtype = np.dtype(dtype)
        boxes = _boxes(sharding, tuple(shape))
        bufs = {box: _aligned_empty(tuple(b - a for a, b in box), dtype) for box in boxes}
        axes = m.index_axes
        if axes:
            # One file tensor per layer (stacked) and per expert ({e}): each is read into the
            # boxes holding its index, so a process reads only its layers' and experts' tensors.
            counts = tuple(shape[a] for a in axes)
            held = sorted({ix for box in boxes for ix in itertools.product(*(range(*box[a]) for a in axes))})
            sub_shape = tuple(n for j, n in enumerate(shape) if j not in axes)
            for ix in held:
                at = dict(zip(axes, ix, strict=True))
                targets = [
                    (
                        tuple(r for j, r in enumerate(box) if j not in axes),
                        bufs[box][tuple(at[j] - box[j][0] if j in at else slice(None) for j in range(len(box)))],
                    )
                    for box in boxes
                    if all(box[a][0] <= i < box[a][1] for a, i in at.items())
                ]
                flat = int(np.ravel_multi_index(ix, counts))
                self.tensor(m.view(stored[flat]), m.pattern, m.part, sub_shape, targets)
        else:
            self.tensor(m.view(stored[0]), m.pattern, m.part, tuple(shape), [(box, bufs[box]) for box in boxes])
        host, places = [], []
        for box, devices in boxes.items():
            for d in devices:
                host.append(bufs[box])
                places.append(jax.sharding.SingleDeviceSharding(d, memory_kind=sharding.memory_kind))
        shards = jax.device_put(host, places)
        return jax.make_array_from_single_device_arrays(tuple(shape), sharding, shards)


__all__ = ["Reader", "pieces", "CHUNK"]
