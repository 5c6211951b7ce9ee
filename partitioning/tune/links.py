"""Collectives by message size and link: the bandwidth a collective reaches on each link level, latency included.

A profile's :class:`Link` levels are where a collective group's devices talk:
``links[0]`` inside a node (NVLink; the ICI torus inside a TPU slice) and
``links[1]`` across nodes (the node's NICs; DCN between TPU slices). A link
has a peak ``bandwidth`` per device and either measured curves (per collective
kind and group size: the full buffer's bytes against the ``W`` it reached, in
the cost model's convention ``seconds = f bytes / W``, ``f`` = 1 for an
all-gather or reduce-scatter, 2 for an all-reduce, 1/4 for an all-to-all) or,
where only the peak and a latency are published, the latency-bandwidth form
``seconds = latency + f bytes / (share x bandwidth)``.

:func:`effective_bandwidth` is the ``W`` of one collective of ``message``
bytes over a group of ``group`` devices, ``inside`` of them in each node: on
one node, the first level's; across nodes, a hierarchical collective: the
buffer is split over the ``inside`` members, each sending its part over its
own NIC share to the other ``group / inside`` nodes, and the slower of the
two levels bounds it (the form :meth:`~partitioning.tune.hardware.Hardware.bandwidth`
gives at the peak). Curves are interpolated in log-log space, held flat above
their largest message and at the smallest message's time below it; between
the measured group sizes, the nearest in log2.

Sources, in the profiles: ``tables/sm90_nvlink.json`` (XLA's collective table
for sm_90, groups of 2, 4 and 8 H100s of one node); NDR InfiniBand at 46-48 of
its 50 GB/s per NIC (the NCCL maintainers, NVIDIA/nccl-tests#290) and ~46 us
for a small all-reduce across two nodes (NVIDIA/nccl#1244); the TPU links at
the profiles' peak and latency ("How to Scale Your Model", Parts 2 and 3).

Example::

    >>> from partitioning.tune.links import effective_bandwidth
    >>> h100 = pt.tune.hardware("h100")
    >>> [round(effective_bandwidth(h100, "all-gather", m, 8, 8) / 1e9) for m in (2**20, 2**26, 2**31)]   # NVLink
    [34, 314, 402]
    >>> round(effective_bandwidth(h100, "all-gather", 2**31, 64, 8) / 1e9)    # 8 nodes: the NICs bound it
    373
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.tune.efficiency import TABLES

KIND_FACTOR = {"all-reduce": 2.0, "all-to-all": 0.25}  # f in seconds = f * bytes / W (1 for the others)


@dataclasses.dataclass(frozen=True)
class Curve:
    """Measured ``(message bytes, W bytes/s)`` points of one collective kind and group size, sorted by size."""

    points: tuple[tuple[float, float], ...]

    def rate(self, message: float) -> float:
        """``W`` at ``message`` bytes (log-log interpolation; flat above, the smallest's time below)."""
        sizes = [p[0] for p in self.points]
        if message >= sizes[-1]:
            return self.points[-1][1]
        if message <= sizes[0]:
            return self.points[0][1] * max(message, 1.0) / sizes[0]
        i = bisect.bisect_right(sizes, message)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        t = (math.log(message) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


@dataclasses.dataclass(frozen=True)
class Link:
    """One link level (see the module docstring): peak ``bandwidth`` per device, ``latency`` of one collective,
    the ``share`` of the peak large messages reach, and measured ``curves`` (``"kind group"`` -> curve)."""

    name: str
    bandwidth: float
    latency: float
    share: float = 1.0
    curves: Mapping[str, Curve] = dataclasses.field(default_factory=dict)
    source: str = ""

    def rate(self, kind: str, group: int, message: float, bandwidth: float | None = None) -> float:
        """``W`` of one ``kind`` collective of ``message`` bytes over ``group`` devices on this link.

        ``bandwidth``: the peak to use instead of the link's own (a torus: the link times the dimensions the
        group spans)."""
        peak = self.bandwidth if bandwidth is None else bandwidth
        curve = self._curve(kind, group)
        if curve is not None:
            return curve.rate(message) * peak / self.bandwidth
        f = KIND_FACTOR.get(kind, 1.0)
        return f * message / (self.latency + f * message / (self.share * peak)) if message > 0 else peak

    def _curve(self, kind: str, group: int) -> Curve | None:
        sizes = [int(k.rsplit(" ", 1)[1]) for k in self.curves if k.rsplit(" ", 1)[0] == kind]
        if not sizes:
            return None
        near = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(max(group, 1))), s))
        return self.curves[f"{kind} {near}"]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "share": self.share,
            "curves": sorted(self.curves),
            "source": self.source,
        }


def effective_bandwidth(hw: Any, kind: str, message: float, group: int, inside: int, local: float = 0.0) -> float:
    """``W`` of one collective of ``message`` bytes over ``group`` devices, ``inside`` of them in each node, on
    ``hw``'s links (see the module docstring). ``local``: the peak inside a node for this group (a torus: its
    link times the dimensions spanned); default the first level's."""
    links: Sequence[Link] = hw.links
    first = links[0]
    peak = local or first.bandwidth
    if group <= inside or len(links) < 2:
        return first.rate(kind, group, message, peak)
    nodes = max(1, group // max(1, inside))
    # Each of the `inside` members carries 1/inside of the buffer over its own NIC share, to `nodes` peers.
    network = inside * links[1].rate(kind, nodes, message / max(1, inside))
    within = first.rate(kind, inside, message, peak) if inside > 1 else math.inf
    return min(within, network)


def collective_seconds(
    hw: Any,
    mesh: Mapping[str, int],
    axes: Sequence[str],
    kind: str,
    nbytes: float,
    count: float,
    nodes: Mapping[str, int] | None = None,
) -> float:
    """Seconds of ``count`` collectives over ``axes`` moving ``nbytes`` (full buffers) in all: on ``hw``'s links
    each at the bandwidth its message size reaches (:func:`effective_bandwidth`), else
    :func:`collective_time` at the peak of :meth:`~partitioning.tune.hardware.Hardware.bandwidth`.

    Example::

        >>> from partitioning.tune.links import collective_seconds
        >>> h100 = pt.tune.hardware("h100")
        >>> t = [collective_seconds(h100, {"fsdp": 8}, ["fsdp"], "all-gather", 2**30, n) for n in (1, 1024)]
        >>> round(t[0] * 1e3, 2), round(t[1] * 1e3, 2)       # one 1 GiB buffer, or 1024 of 1 MiB
        (2.73, 31.88)
    """
    axes = [a for a in axes if mesh.get(a, 1) > 1]
    group = math.prod(mesh[a] for a in axes) if axes else 1
    if group <= 1 or nbytes <= 0 or count <= 0:
        return 0.0
    if not hw.links or kind in hw.collective_bandwidth:
        return collective_time(hw, kind, nbytes, group, hw.bandwidth(mesh, axes, kind, nodes), count)
    inside = hw.members_per_node(mesh, axes, nodes)
    message = nbytes / count
    w = effective_bandwidth(hw, kind, message, group, inside, local_peak(hw, mesh, axes, nodes))
    return count * KIND_FACTOR.get(kind, 1.0) * message / w


def collective_time(hw: Any, kind: str, nbytes: float, group: int, bandwidth: float, count: float = 1) -> float:
    """Seconds for ``count`` collectives of kind ``kind`` moving ``nbytes`` (per device, full buffer) in total, at
    a fixed ``bandwidth``: the profile's ``latency`` each and the bytes at the peak (profiles without links).

    An all-gather or reduce-scatter costs ``bytes / W``, an all-reduce twice
    that, an all-to-all a quarter (a bidirectional ring) and a permute the
    buffer once, plus ``latency`` each. Like the published analyses ("How to
    Scale Your Model", Part 3: ``V / W (n-1)/n -> V / W``) the ring's
    ``(n-1)/n`` is taken as 1.

    Example::

        >>> from partitioning.tune.hardware import collective_time
        >>> collective_time(pt.tune.hardware("v5p"), "all-reduce", 2 * 10**9, 2048, 5.4e11)   # ~7.4 ms
        0.00741...
    """
    if group <= 1 or nbytes <= 0:
        return 0.0
    return count * hw.latency + KIND_FACTOR.get(kind, 1.0) * nbytes / bandwidth


# -- where a collective runs: nodes, and the torus inside a slice ----------------------------------------------


def members_per_node(
    mesh: Mapping[str, int], axes: Sequence[str], node_size: int, nodes: Mapping[str, int] | None = None
) -> int:
    """How many devices of one collective group over ``axes`` share a node: ``nodes`` (``{axis: nodes it spans}``)
    as a hybrid mesh places them, else consecutive device ids (``jax.make_mesh``)."""
    if nodes is not None:
        return math.prod(int(mesh[a]) // int(nodes.get(a, 1)) for a in axes if a in mesh)
    sizes = list(mesh.items())
    inside = 1
    for i, (name, size) in enumerate(sizes):
        if name not in axes:
            continue
        stride = math.prod(s for _, s in sizes[i + 1 :])
        inside *= 1 if stride >= node_size else min(size, max(1, node_size // stride))
    return inside


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def torus_shape(torus_dims: int, node_size: int, devices: int) -> tuple[int, ...]:
    """The physical torus of a ``devices``-chip slice, smallest dimension first (prime factors dealt out evenly)."""
    dims = [1] * max(1, torus_dims)
    n = min(devices, node_size) if node_size else devices
    for p in sorted(_prime_factors(n), reverse=True):
        i = min(range(len(dims)), key=lambda j: (dims[j], j))
        dims[i] *= p
    return tuple(sorted(dims))


def torus_axes(hw: Any, mesh: Mapping[str, int]) -> dict[str, set[int]]:
    """Mesh axis -> the torus dimensions it spans: the last (fastest) mesh axis on the smallest dimensions,
    so an 8-way axis of a 16x16x8 slice takes one whole dimension."""
    caps = list(torus_shape(hw.torus_dims, hw.node_size, math.prod(mesh.values())))
    out: dict[str, set[int]] = {}
    i = 0
    for name, size in reversed(list(mesh.items())):
        spans: set[int] = set()
        s = int(size)
        while s > 1 and i < len(caps):
            g = math.gcd(s, caps[i])
            if g == 1:
                i += 1
                continue
            spans.add(i)
            caps[i] //= g
            s //= g
            if caps[i] == 1:
                i += 1
        out[name] = spans or ({0} if size > 1 else set())
    return out


def local_peak(hw: Any, mesh: Mapping[str, int], axes: Sequence[str], nodes: Mapping[str, int] | None = None) -> float:
    """The peak bytes/s per device inside a node for a group over ``axes``: the node's links, or on a torus the
    ICI link times the torus dimensions the group spans in its slice."""
    if hw.topology != "torus":
        return float(hw.link_bandwidth)
    local = {a: s // (nodes or {}).get(a, 1) for a, s in mesh.items()} if nodes else dict(mesh)
    spanned = set().union(*(torus_axes(hw, local)[a] for a in axes if local.get(a, 1) > 1))
    return max(1, len(spanned)) * float(hw.link_bandwidth)


def ib_link(bandwidth: float = 50e9) -> Link:
    """NDR InfiniBand, one 400 Gb/s NIC per GPU: 47 of 50 GB/s at large messages (46-48 GB/s per NIC,
    NVIDIA/nccl-tests#290) and ~46 us for a small collective across nodes (NVIDIA/nccl#1244)."""
    return Link(
        "infiniband",
        bandwidth,
        46e-6,
        0.94,
        source="NVIDIA/nccl-tests#290 (46-48 GB/s per NDR NIC), NVIDIA/nccl#1244 (46 us across two nodes)",
    )


@functools.cache
def nvlink_h100() -> Link:
    """NVLink 4 in an 8x H100 node: XLA's measured collective table (``tables/sm90_nvlink.json``)."""
    data = json.loads((TABLES / "sm90_nvlink.json").read_text())
    curves = {k: Curve(tuple((float(b), gb * 1e9) for b, gb in pts)) for k, pts in data["curves"].items()}
    return Link("nvlink", 450e9, 13e-6, 1.0, curves, source=str(data["source"]))


def alpha_beta(name: str, bandwidth: float, latency: float, share: float = 1.0, source: str = "") -> Link:
    """A link known by its peak, latency and the share of the peak large messages reach.

    Example::

        >>> from partitioning.tune.links import alpha_beta
        >>> ici = alpha_beta("ici", 1.8e11, 1e-5)
        >>> ici.rate("all-gather", 8, 1.8e6) / 1e9, ici.rate("all-gather", 8, 1.8e12) / 1e9   # latency, then peak
        (90.0, 179.999...)
    """
    return Link(name, bandwidth, latency, share, source=source)


__all__ = [
    "Curve",
    "Link",
    "effective_bandwidth",
    "collective_seconds",
    "collective_time",
    "members_per_node",
    "torus_shape",
    "torus_axes",
    "local_peak",
    "ib_link",
    "nvlink_h100",
    "alpha_beta",
    "KIND_FACTOR",
]
