"""Hardware profiles: what one accelerator computes, holds and moves, and how fast each mesh axis talks.

A :class:`Hardware` is a roofline's inputs: peak dense bf16 FLOP/s, HBM bytes
and bandwidth per device, and the interconnect. Two interconnect shapes:

- ``nodes`` (GPUs): ``node_size`` devices behind a switch (NVLink), each with
  ``link_bandwidth`` bytes/s of egress; nodes joined by a network giving each
  device ``network_bandwidth`` bytes/s (its share of the node's NICs).
- ``torus`` (TPUs): chips on a ``torus_dims``-dimensional torus (ICI) with
  ``link_bandwidth`` bytes/s per torus axis (both directions of the ring), up
  to ``node_size`` chips (a pod); pods joined by the data-centre network
  (DCN) at ``network_bandwidth`` bytes/s per chip.

:meth:`Hardware.bandwidth` is the per-device bandwidth of a collective over
some mesh axes: an all-gather or reduce-scatter of a ``B``-byte buffer takes
``latency + B / W``, an all-reduce twice that (:func:`collective_time`). Mesh axes
are laid out like ``jax.make_mesh``: the last axis varies fastest, so it is
the one inside a node / on the first torus dimensions.

Every number of :data:`PROFILES` cites its public source. The ``cpu`` profile
is measured on the spot (:mod:`partitioning.tune.measure`). Any other machine
is a YAML file with the same keys (:func:`partitioning.tune.hardware_file.load_hardware`).

Example::

    >>> hw = pt.tune.hardware("v5p")
    >>> hw.bandwidth({"fsdp": 256, "tensor": 8}, ["tensor"])   # one torus axis (16x16x8 slice)
    180000000000.0
    >>> pt.tune.hardware("h100").bandwidth({"data": 256, "tensor": 8}, ["data"])   # one GPU per node in each group
    50000000000.0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.errors import ConfigError, did_you_mean
from partitioning.plan.flops import PEAK_TFLOPS
from partitioning.tune.host_link import host_link

GB, GIB = 10**9, 2**30
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One device type and its interconnect (see the module docstring for the two topologies).

    Example::

        >>> hw = pt.tune.hardware("v5p")
        >>> hw.peak_flops / hw.link_bandwidth          # FLOPs per byte over one ICI axis
        2550.0
    """

    name: str
    peak_flops: float  # dense bf16 FLOP/s per device
    memory: int  # HBM bytes per device
    memory_bandwidth: float  # HBM bytes/s per device
    topology: str  # "nodes" | "torus"
    node_size: int  # devices per node (nodes) / chips per pod (torus)
    link_bandwidth: float  # bytes/s: per device inside a node (nodes) / per torus axis (torus)
    network_bandwidth: float  # bytes/s per device across nodes / pods
    torus_dims: int = 0
    latency: float = 1e-5  # seconds: the fixed cost of one collective
    overlap: bool = True  # collectives run beside compute (async), not in turn with it
    collective_bandwidth: Mapping[str, float] = dataclasses.field(default_factory=dict)  # per kind, replaces links
    # Bytes/s at which a step's fresh temporary memory is faulted in (the CPU runtime maps it anew each
    # step and the kernel zeroes every page); None where device memory is pooled (GPUs, TPUs).
    alloc_bandwidth: float | None = None
    # True for the profile of the machine that compiles (the measured cpu): its compiled ops' bytes and
    # collectives are its own. For any other hardware they are XLA:CPU's, which computes bf16 in f32.
    measured: bool = False
    # The share of peak_flops a training step's matmuls reach (kernel efficiency, and the work between them
    # they wait on). 1.0 is the bare roofline; the built-in profiles' values are calibrated on published
    # measurements (docs/performance.md).
    efficiency: float = 1.0
    description: str = ""
    sources: tuple[str, ...] = ()
    # The host (offload): bytes/s between host memory and one device each way, host RAM per device, a device's
    # share of the host's memory bandwidth; None: not published (tune/host_link.py), offload is not priced.
    host_bandwidth: float | None = None
    host_memory: int | None = None
    host_memory_bandwidth: float | None = None

    @property
    def matmul_flops(self) -> float:
        """FLOP/s per device a step's matmuls run at: ``peak_flops x efficiency``."""
        return self.peak_flops * self.efficiency

    def torus_shape(self, devices: int) -> tuple[int, ...]:
        """The physical torus of a ``devices``-chip slice, smallest dimension first (prime factors dealt out evenly)."""
        dims = [1] * max(1, self.torus_dims)
        n = min(devices, self.node_size) if self.node_size else devices
        for p in sorted(_prime_factors(n), reverse=True):
            i = min(range(len(dims)), key=lambda j: (dims[j], j))
            dims[i] *= p
        return tuple(sorted(dims))

    def _torus_axes(self, mesh: Mapping[str, int]) -> dict[str, set[int]]:
        """Mesh axis -> the torus dimensions it spans: the last (fastest) mesh axis on the smallest dimensions,
        so an 8-way axis of a 16x16x8 slice takes one whole dimension."""
        caps = list(self.torus_shape(math.prod(mesh.values())))
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

    def bandwidth(
        self,
        mesh: Mapping[str, int],
        axes: Sequence[str],
        kind: str = "all-gather",
        nodes: Mapping[str, int] | None = None,
    ) -> float:
        """Bytes/s per device for a collective over ``axes`` of ``mesh`` (``{axis: size}``, in order).

        ``nodes`` (``{axis: nodes it spans}``, a mesh's ``nodes``) places the
        mesh on nodes as a hybrid mesh does; without it the devices are laid
        out as ``jax.make_mesh`` does (consecutive devices share a node).

        Example::

            >>> h100 = pt.tune.hardware("h100")
            >>> h100.bandwidth({"data": 4, "fsdp": 8}, ["fsdp"]) / 1e9                       # NVLink
            450.0
            >>> h100.bandwidth({"data": 4, "fsdp": 8}, ["fsdp"], nodes={"fsdp": 4}) / 1e9    # 2 GPUs per node
            100.0
        """
        axes = [a for a in axes if mesh.get(a, 1) > 1]
        if kind in self.collective_bandwidth:
            return float(self.collective_bandwidth[kind])
        if not axes:
            return math.inf
        inside, group = self.members_per_node(mesh, axes, nodes), math.prod(mesh[a] for a in axes)
        if self.topology == "torus":
            local_mesh = {a: s // (nodes or {}).get(a, 1) for a, s in mesh.items()} if nodes else mesh
            spanned = set().union(*(self._torus_axes(local_mesh)[a] for a in axes if local_mesh[a] > 1))
            local = max(1, len(spanned)) * self.link_bandwidth
        else:
            local = self.link_bandwidth
        if group <= inside:
            return local
        # Across nodes / pods a hierarchical collective splits the buffer over the
        # group's members in one node, each sending its part over its own NIC share.
        return min(local, self.network_bandwidth * inside)

    def members_per_node(
        self, mesh: Mapping[str, int], axes: Sequence[str], nodes: Mapping[str, int] | None = None
    ) -> int:
        """How many devices of one collective group over ``axes`` share a node (see :meth:`bandwidth`).

        Example::

            >>> pt.tune.hardware("h100").members_per_node({"data": 4, "fsdp": 8}, ["fsdp"], {"fsdp": 4})
            2
        """
        if nodes is None:
            return _members_per_node(mesh, axes, self.node_size)
        return math.prod(int(mesh[a]) // int(nodes.get(a, 1)) for a in axes if a in mesh)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["collective_bandwidth"] = dict(self.collective_bandwidth)
        d["sources"] = list(self.sources)
        return d


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def _members_per_node(mesh: Mapping[str, int], axes: Sequence[str], node_size: int) -> int:
    """How many devices of one collective group sit in the same node (consecutive device ids)."""
    sizes = list(mesh.items())
    inside = 1
    for i, (name, size) in enumerate(sizes):
        if name not in axes:
            continue
        stride = math.prod(s for _, s in sizes[i + 1 :])
        inside *= 1 if stride >= node_size else min(size, max(1, node_size // stride))
    return inside


def collective_time(hw: Hardware, kind: str, nbytes: float, group: int, bandwidth: float, count: float = 1) -> float:
    """Seconds for ``count`` collectives of kind ``kind`` moving ``nbytes`` (per device, full buffer) in total.

    An all-gather or reduce-scatter costs ``bytes / W``, an all-reduce twice
    that, an all-to-all a quarter (a bidirectional ring) and a permute the
    buffer once, plus ``latency`` each. Like the published analyses ("How to
    Scale Your Model", Part 3: ``V / W (n-1)/n -> V / W``) the ring's
    ``(n-1)/n`` is taken as 1: exact for large groups, and for small ones it
    stands for the peak that collectives seldom reach (an 8xH100 all-reduce
    measures ~370 of NVLink's 450 GB/s, Part 12).

    Example::

        >>> from partitioning.tune.hardware import collective_time
        >>> collective_time(pt.tune.hardware("v5p"), "all-reduce", 2 * 10**9, 2048, 5.4e11)   # ~7.4 ms
        0.00741...
    """
    if group <= 1 or nbytes <= 0:
        return 0.0
    factor = {"all-reduce": 2.0, "all-to-all": 0.25}.get(kind, 1.0)
    return count * hw.latency + factor * nbytes / bandwidth


# -- the published profiles ------------------------------------------------------------------------
# SB = "How to Scale Your Model" (Austin et al., Google DeepMind, 2025), https://jax-ml.github.io/scaling-book/
#   Part 2 (tpus): the TPU spec tables; Part 5 (training): C = 4.6e14, W = 2 * 9e10 for v5p;
#   Part 12 (gpus): GPU tables, "GPU egress 450e9, node egress 400e9" for H100 / B200 DGX SuperPODs.


# Efficiency (the share of peak FLOP/s a training step's matmuls reach), calibrated on published measurements
# (tests/tune/published.py, docs/performance.md): MaxText's TPU tables (commit 632f65147) and Megatron-LM's
# A100 weak-scaling table (Narayanan et al. 2021, Table 1), each on the rows at the extremes of its table,
# checked on the others. The h200's is measured: benchmarks/gpu on one H200 (benchmarks/results/
# gpu_h200_run1.json), calibrated on its sequence-2,048 row and checked on its 4,096 row (tests/tune/measured.py).
# GPUs without rows of their own (the H100 included: none was measured) take the A100's.
EFFICIENCY = {"v5p": 0.726, "v5e": 0.770, "v4": 0.777, "a100-80g": 0.488, "h200": 0.568}
GPU_EFFICIENCY = EFFICIENCY["a100-80g"]


def _peak(kind: str) -> float:
    """FLOP/s from the one peak table (plan.flops, which MFU in training logs also reads)."""
    return dict(PEAK_TFLOPS)[kind] * 1e12


_SB_TPU = "https://jax-ml.github.io/scaling-book/tpus/"
_SB_TRAIN = "https://jax-ml.github.io/scaling-book/training/"
_SB_GPU = "https://jax-ml.github.io/scaling-book/gpus/"

PROFILES: dict[str, Hardware] = {
    "h100": Hardware(
        name="h100",
        efficiency=GPU_EFFICIENCY,
        description="NVIDIA H100 SXM 80GB, 8 per node (NVLink 4), 8x400 Gb/s InfiniBand per node",
        peak_flops=_peak("h100"),  # datasheet: 1,979 TFLOP/s bf16 with sparsity -> 989 dense
        memory=80 * GB,
        memory_bandwidth=3.35e12,  # datasheet: 80 GB HBM3, 3.35 TB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=450e9,  # NVLink 4: 900 GB/s bidirectional = 450 GB/s egress (SB Part 12)
        network_bandwidth=50e9,  # one 400 Gb/s NIC per GPU: node egress 400 GB/s / 8 (SB Part 12)
        latency=1e-5,
        sources=(
            "https://www.nvidia.com/en-us/data-center/h100/",
            _SB_GPU,
            "https://docs.nvidia.com/dgx-superpod-reference-architecture-dgx-h100.pdf",
        ),
    ),
    "h200": Hardware(
        name="h200",
        efficiency=EFFICIENCY["h200"],
        description="NVIDIA H200 SXM 141GB, 8 per node (NVLink 4), 8x400 Gb/s InfiniBand per node",
        peak_flops=_peak("h200"),  # datasheet: 1,979 TFLOP/s bf16 with sparsity (same Hopper die as H100)
        memory=141 * GB,
        memory_bandwidth=4.8e12,  # datasheet: 141 GB HBM3e, 4.8 TB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=450e9,
        network_bandwidth=50e9,
        latency=1e-5,
        sources=("https://www.nvidia.com/en-us/data-center/h200/", _SB_GPU),
    ),
    "a100-80g": Hardware(
        name="a100-80g",
        efficiency=EFFICIENCY["a100-80g"],
        description="NVIDIA A100 SXM 80GB, 8 per node (NVLink 3), 8x200 Gb/s InfiniBand per node",
        peak_flops=_peak("a100"),  # datasheet: 312 TFLOP/s bf16 dense
        memory=80 * GB,
        memory_bandwidth=2.039e12,  # datasheet: 80 GB HBM2e, 2,039 GB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=300e9,  # NVLink 3: 600 GB/s bidirectional = 300 GB/s egress
        network_bandwidth=25e9,  # DGX A100: one 200 Gb/s HDR NIC per GPU
        latency=1e-5,
        sources=(
            "https://www.nvidia.com/en-us/data-center/a100/",
            "https://docs.nvidia.com/dgx-superpod-reference-architecture-dgx-a100.pdf",
        ),
    ),
    "v4": Hardware(
        name="v4",
        efficiency=EFFICIENCY["v4"],
        description="Google TPU v4, 3D torus, 4096-chip pods",
        peak_flops=_peak("tpu v4"),
        memory=32 * GIB,
        memory_bandwidth=1.2e12,  # SB Part 2 table; 32 GiB HBM2
        topology="torus",
        torus_dims=3,
        node_size=4096,  # pod 16x16x16 (SB Part 2)
        link_bandwidth=9e10,  # ICI 4.5e10 one-way per link, 9e10 both ways (SB Part 2)
        network_bandwidth=2.5e10 / 4,  # DCN ~2.5e10 per host of 4 chips (SB Part 2)
        latency=1e-5,
        sources=(_SB_TPU, "https://cloud.google.com/tpu/docs/v4"),
    ),
    "v5e": Hardware(
        name="v5e",
        efficiency=EFFICIENCY["v5e"],
        description="Google TPU v5e, 2D torus, 256-chip pods",
        peak_flops=_peak("tpu v5e"),
        memory=16 * GIB,
        memory_bandwidth=8.1e11,  # SB Part 2 table; 16 GiB HBM2e
        topology="torus",
        torus_dims=2,
        node_size=256,  # pod 16x16
        link_bandwidth=1e11,  # ICI 5e10 one-way per link, 1e11 both ways (SB Part 2)
        network_bandwidth=2.5e10 / 8,  # DCN ~2.5e10 per host of 8 chips (4x2 hosts)
        latency=1e-5,
        sources=(_SB_TPU, "https://cloud.google.com/tpu/docs/v5e"),
    ),
    "v5p": Hardware(
        name="v5p",
        efficiency=EFFICIENCY["v5p"],
        description="Google TPU v5p, 3D torus, 8960-chip pods",
        peak_flops=_peak("tpu v5p"),
        memory=95 * GIB,
        memory_bandwidth=2.76e12,  # Cloud docs: 459 TFLOP/s, 95 GiB, 2,765 GB/s
        topology="torus",
        torus_dims=3,
        node_size=8960,  # pod 16x20x28 (SB Part 2)
        # SB Part 5 derives its crossovers with W = 2 * 9e10 per axis ("1D data parallelism over ICI");
        # Part 2's table lists 1e11 one-way in a later revision. The published analysis uses 9e10.
        link_bandwidth=1.8e11,
        network_bandwidth=2.5e10 / 4,  # DCN ~2.5e10 per host of 4 chips (SB Part 5, "Scaling between pods")
        latency=1e-5,
        sources=(_SB_TRAIN, _SB_TPU, "https://cloud.google.com/tpu/docs/v5p"),
    ),
}

# The host link of each profile that publishes one, and its sources (partitioning.tune.host_link).
PROFILES = {k: dataclasses.replace(p, **host_link(k, p.sources)) for k, p in PROFILES.items()}

ALIASES = {"a100": "a100-80g", "v4p": "v4", "tpu-v4": "v4", "tpu-v5e": "v5e", "tpu-v5p": "v5p", "h100-sxm": "h100"}


def profile_names() -> list[str]:
    """The built-in profiles, plus ``cpu`` (measured).

    Example::

        >>> "h100" in pt.tune.profile_names(), pt.tune.profile_names()[-1]
        (True, 'cpu')
    """
    return [*PROFILES, "cpu"]


def hardware(name: str) -> Hardware:
    """A built-in profile by name (``cpu`` is measured: see :func:`partitioning.tune.measure.measure_cpu`).

    Example::

        >>> pt.tune.hardware("h100").peak_flops
        989000000000000.0
    """
    if not isinstance(name, str):
        raise ConfigError(
            f"--hardware {name!r}: expected a profile name ({', '.join(profile_names())})", arg="hardware"
        )
    key = ALIASES.get(name.lower(), name.lower())
    if key in PROFILES:
        return PROFILES[key]
    raise ConfigError(
        f"--hardware {name!r}: no such profile; choose one of {', '.join(profile_names())} "
        f"or give a YAML file{did_you_mean(key, profile_names())}",
        arg="hardware",
    )


__all__ = ["Hardware", "PROFILES", "hardware", "profile_names", "collective_time", "KINDS"]
