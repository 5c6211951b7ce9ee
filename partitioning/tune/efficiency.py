"""GEMM efficiency from the shapes: the share of peak a matmul of ``(M, N, K)`` reaches on one device.

A :class:`GemmTable` holds measured (or, where nothing is published, modelled)
points ``(m, n, k) -> share of peak`` on a full grid of sizes, with its source
and date. :meth:`GemmTable.efficiency` interpolates it in log-shape space
(trilinear in ``log2 m, log2 n, log2 k``): above the grid the largest sizes'
share holds (a GEMM that large runs at the plateau), below it the time of the
smallest size holds (a GEMM that small is latency-bound: halving it saves
nothing). A batched GEMM of ``b`` matrices folds its batch into ``M`` (XLA's own
sm_90 table shows ``(b, m, n, k)`` within a few percent of ``(1, b m, n, k)``).

Where the tables come from (each profile says which, :data:`~partitioning.tune.hardware.PROFILES`):

- ``h100`` / ``h200`` (one die, sm_90): XLA's default matmul table
  (``tables/sm90_gemm.json``: openxla/xla ``matmul_interpolator_data.h``,
  measured by XLA's ``matmul_perf_table_gen``, bf16, 256 to 4096 per dimension);
  ``benchmarks/gpu/bench_gpu.py --only gemm`` measures a wider one on the GPU at hand;
- ``a100-80g`` and the TPUs: :func:`model_table`, a model from published
  figures (the HBM roofline, the matrix units' tile, a per-call floor and the
  largest share a GEMM reaches: the "maximum achievable matmul FLOPS" of
  stas00/ml-engineering for the A100), marked ``measured: false``;
- ``cpu``: measured here by :func:`partitioning.tune.measure.gemm_sweep`, cached with the profile.

Example::

    >>> from partitioning.tune.efficiency import sm90
    >>> t = sm90()
    >>> round(t.efficiency(4096, 4096, 4096), 3), round(t.efficiency(8192, 28672, 8192), 3)   # on / above the grid
    (0.789, 0.789)
    >>> round(t.efficiency(1024, 1024, 1024), 3), round(t.efficiency(128, 1024, 1024), 3)   # below: time holds
    (0.256, 0.038)
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

TABLES = Path(__file__).resolve().parent / "tables"


@dataclasses.dataclass(frozen=True)
class GemmTable:
    """Shares of peak FLOP/s on a full ``m x n x k`` grid (see the module docstring).

    Example::

        >>> from partitioning.tune.efficiency import GemmTable
        >>> t = GemmTable.from_points([(m, n, k, 0.5 if m == 256 else 0.8) for m in (256, 1024)
        ...                            for n in (256, 1024) for k in (256, 1024)], source="made up", date="2026")
        >>> t.efficiency(512, 256, 256)          # half way between 256 and 1024 in log2
        0.65
    """

    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    share: tuple[float, ...]  # row-major over (m, n, k)
    source: str = ""
    date: str = ""
    measured: bool = True

    @classmethod
    def from_points(
        cls, points: Iterable[Sequence[float]], *, source: str = "", date: str = "", measured: bool = True
    ) -> GemmTable:
        """A table from ``(m, n, k, share)`` points that fill a grid (each size of each dimension with every
        size of the others)."""
        pts = {(int(m), int(n), int(k)): float(s) for m, n, k, s in points}
        ms, ns, ks = (tuple(sorted({p[i] for p in pts})) for i in range(3))
        missing = [(a, b, c) for a in ms for b in ns for c in ks if (a, b, c) not in pts]
        if missing or not pts:
            raise ValueError(f"a GEMM table needs a full grid of m x n x k; missing {missing[:3] or 'every point'}")
        return cls(ms, ns, ks, tuple(pts[(a, b, c)] for a in ms for b in ns for c in ks), source, date, measured)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GemmTable:
        """The table of a JSON document: ``points`` of ``[m, n, k, tflops]`` with ``peak_flops``, or of
        ``[m, n, k, share]`` (``columns`` names which), ``source``, ``date`` and ``measured``."""
        cols = list(data.get("columns", ["m", "n", "k", "share"]))
        scale = 1e12 / float(data["peak_flops"]) if cols[-1] == "tflops" else 1.0
        points = [(m, n, k, v * scale) for m, n, k, v in data["points"]]
        return cls.from_points(
            points,
            source=str(data.get("source", "")),
            date=str(data.get("date", "")),
            measured=bool(data.get("measured", True)),
        )

    def to_json(self) -> dict[str, Any]:
        it = iter(self.share)
        points = [[a, b, c, round(next(it), 4)] for a in self.m for b in self.n for c in self.k]
        return {"source": self.source, "date": self.date, "measured": self.measured, "points": points}

    def _at(self, i: int, j: int, l_: int) -> float:
        return self.share[(i * len(self.n) + j) * len(self.k) + l_]

    def efficiency(self, m: float, n: float, k: float) -> float:
        """The share of peak a ``(m, n, k)`` GEMM reaches (interpolated; see the module docstring)."""
        idx, shrink = [], 1.0
        for size, grid in ((m, self.m), (n, self.n), (k, self.k)):
            size = max(float(size), 1.0)
            if size < grid[0]:
                shrink *= size / grid[0]  # the smallest size's time: the share falls with the work
            x = math.log2(min(max(size, grid[0]), grid[-1]))
            logs = [math.log2(g) for g in grid]
            hi = min(max(bisect.bisect_left(logs, x), 1), len(grid) - 1) if len(grid) > 1 else 0
            lo = max(hi - 1, 0)
            t = 0.0 if hi == lo else (x - logs[lo]) / (logs[hi] - logs[lo])
            idx.append(((lo, 1 - t), (hi, t)) if hi != lo else ((lo, 1.0),))
        total = sum(wi * wj * wk * self._at(i, j, l_) for i, wi in idx[0] for j, wj in idx[1] for l_, wk in idx[2])
        return max(total * shrink, 1e-6)


def model_table(
    peak_flops: float,
    memory_bandwidth: float,
    *,
    cap: float,
    tile: int,
    floor_s: float,
    bytes_per_element: int = 2,
    sizes: Sequence[int] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    source: str = "",
    date: str = "",
) -> GemmTable:
    """A modelled table: each GEMM's time is the largest of its FLOPs at ``cap x peak`` (each dimension padded
    to the matrix unit's ``tile``), its operands and result through HBM, and a per-call ``floor_s``.

    Example::

        >>> from partitioning.tune.efficiency import model_table
        >>> t = model_table(459e12, 2.76e12, cap=1.0, tile=128, floor_s=2e-6, source="v5p, modelled")
        >>> round(t.efficiency(8192, 8192, 8192), 3), round(t.efficiency(8192, 8192, 128), 3)   # roofline
        (1.0, 0.746)
    """
    points = []
    for m in sizes:
        for n in sizes:
            for k in sizes:
                flops = 2.0 * m * n * k
                padded = 2.0 * math.prod(math.ceil(d / tile) * tile for d in (m, n, k))
                moved = bytes_per_element * (m * k + k * n + m * n)
                t = max(padded / (cap * peak_flops), moved / memory_bandwidth, floor_s)
                points.append((m, n, k, flops / (t * peak_flops)))
    return GemmTable.from_points(points, source=source, date=date, measured=False)


@functools.cache
def load_table(name: str) -> GemmTable:
    """A table shipped in ``partitioning/tune/tables/`` (``sm90_gemm``, ...)."""
    return GemmTable.from_json(json.loads((TABLES / f"{name}.json").read_text()))


def sm90() -> GemmTable:
    """The H100 / H200 table (XLA's measured sm_90 table; see the module docstring)."""
    return load_table("sm90_gemm")


__all__ = ["GemmTable", "model_table", "load_table", "sm90", "TABLES"]
