"""Per-shard reads: each process reads only the bytes of the parameter shards its devices hold.

For one parameter and its target sharding, the distinct boxes of this
process's devices (replicas read once) are mapped through the name map's
pattern to boxes of the file tensor's atoms (:mod:`~partitioning.checkpoint.hf_pattern`),
layer by layer for a stacked parameter (so a pipeline stage reads only its
layers). The union of those boxes is read in pieces of at most ``chunk``
bytes with ``os.preadv`` into one reused scratch buffer (not ``mmap``: mapped
pages count toward the process's RSS), and each piece is copied, transposed
and cast by NumPy into the shard buffers. A piece that is already a shard's
bytes in the shard's order and dtype is read straight into the shard. The
shard buffers are 64-byte aligned, so the CPU client adopts them without a
copy; other platforms transfer them as usual. Host memory beyond the
process's own shards is the scratch buffer.

Example::

    >>> with Reader() as r:
    ...     q = r.param(pmap, [stored[n] for n in pmap.hf], (2, 64, 4, 16), np.float32, sharding)
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from partitioning.checkpoint.hf_files import Stored
from partitioning.checkpoint.hf_map import ParamMap
from partitioning.checkpoint.hf_pattern import Box, Pattern
from partitioning.checkpoint.reader import _aligned_empty
from partitioning.errors import CheckpointError

CHUNK = 32 * 2**20
TILE = 128


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
        if m.stacked:
            layers = sorted({i for box in boxes for i in range(*box[0])})
            for i in layers:
                targets = [(box[1:], bufs[box][i - box[0][0]]) for box in boxes if box[0][0] <= i < box[0][1]]
                self.tensor(stored[i], m.pattern, m.part, tuple(shape[1:]), targets)
        else:
            self.tensor(stored[0], m.pattern, m.part, tuple(shape), [(box, bufs[box]) for box in boxes])
        host, places = [], []
        for box, devices in boxes.items():
            for d in devices:
                host.append(bufs[box])
                places.append(jax.sharding.SingleDeviceSharding(d, memory_kind=sharding.memory_kind))
        shards = jax.device_put(host, places)
        return jax.make_array_from_single_device_arrays(tuple(shape), sharding, shards)


__all__ = ["Reader", "pieces", "CHUNK"]
