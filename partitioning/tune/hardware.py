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
from partitioning.tune.efficiency import GemmTable, model_table, sm90
from partitioning.tune.host_link import host_link
from partitioning.tune.links import (
    Link,
    alpha_beta,
    collective_time,
    ib_link,
    local_peak,
    members_per_node,
    nvlink_h100,
    torus_shape,
)

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
    # The share of the priced kernels' speed a training step keeps (launch gaps, the work between kernels):
    # 1.0 is the bare model; the built-in profiles' values are calibrated on published runs (docs/tune.md).
    efficiency: float = 1.0
    description: str = ""
    sources: tuple[str, ...] = ()
    # The host (offload): bytes/s between host memory and one device each way, host RAM per device, a device's
    # share of the host's memory bandwidth; None: not published (tune/host_link.py), offload is not priced.
    host_bandwidth: float | None = None
    host_memory: int | None = None
    host_memory_bandwidth: float | None = None
    gemm: GemmTable | None = None  # the share of peak each GEMM shape reaches (None: every shape at peak)
    links: tuple[Link, ...] = ()  # collectives by message size: inside a node, across nodes (none: the peaks)
    # The share of a collective's time the compute beside it loses (GPUs: NCCL's kernels run on the SMs the
    # matmuls need); calibrated with the efficiency. 0: collectives hide for free (TPUs' ICI DMA engines).
    contention: float = 0.0

    @property
    def matmul_flops(self) -> float:
        """FLOP/s per device of a step's large matmuls: ``peak_flops x efficiency`` (x the GEMM table's plateau)."""
        plateau = self.gemm.efficiency(16384, 16384, 16384) if self.gemm else 1.0
        return self.peak_flops * self.efficiency * plateau

    def torus_shape(self, devices: int) -> tuple[int, ...]:
        """The physical torus of a ``devices``-chip slice, smallest dimension first (prime factors dealt out evenly)."""
        return torus_shape(self.torus_dims, self.node_size, devices)

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
        local = local_peak(self, mesh, axes, nodes)
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
        return members_per_node(mesh, axes, self.node_size, nodes)

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("gemm", "links")}
        d["collective_bandwidth"] = dict(self.collective_bandwidth)
        d["sources"] = list(self.sources)
        d["gemm"] = self.gemm.to_json() if self.gemm else None
        d["links"] = [link.to_json() for link in self.links]
        return d


# -- the published profiles ------------------------------------------------------------------------
# SB = "How to Scale Your Model" (Austin et al., Google DeepMind, 2025), https://jax-ml.github.io/scaling-book/
#   Part 2 (tpus): the TPU spec tables; Part 5 (training): C = 4.6e14, W = 2 * 9e10 for v5p;
#   Part 12 (gpus): GPU tables, "GPU egress 450e9, node egress 400e9" for H100 / B200 DGX SuperPODs.


# Efficiency and contention, calibrated on published runs (tests/tune/validation.py: the calibration half of the
# rows, by id; the held-out half checks, docs/tune.md): per profile the pair whose predicted step times are
# right on its calibration rows (least squares of the log error). The h200 takes the h100's (one die).
CALIBRATED = {
    "v5p": (0.855, 0.0),
    "v5e": (0.874, 0.0),
    "v4": (0.799, 0.0),
    "a100-80g": (0.711, 0.0),
    "h100": (1.0, 0.5),
}
CALIBRATED["h200"] = CALIBRATED["h100"]
EFFICIENCY = {name: e for name, (e, _) in CALIBRATED.items()}


def _peak(kind: str) -> float:
    """FLOP/s from the one peak table (plan.flops, which MFU in training logs also reads)."""
    return dict(PEAK_TFLOPS)[kind] * 1e12


_SB_TPU = "https://jax-ml.github.io/scaling-book/tpus/"
_SB_TRAIN = "https://jax-ml.github.io/scaling-book/training/"
_SB_GPU = "https://jax-ml.github.io/scaling-book/gpus/"
_MAMF = "https://github.com/stas00/ml-engineering/tree/master/compute/accelerator"
_NCCL = "https://github.com/NVIDIA/nccl-tests/issues/212"

# GEMM tables (partitioning/tune/efficiency.py): the H100 / H200 one is XLA's measured sm_90 table; the others are
# models (measured: false) from published figures until a GPU session measures them (bench_gpu.py --only gemm).
_A100_GEMM = model_table(
    312e12,
    2.039e12,
    cap=0.869,
    tile=128,
    floor_s=5e-6,
    source=f"a model: at most 271.2 of 312 TFLOP/s (the A100 SXM's measured maximum achievable matmul FLOPS, "
    f"{_MAMF}), the HBM roofline, 5 us a call (XLA's sm_90 table: a 256^3 GEMM)",
    date="2025-06",
)


def _tpu(peak: float, hbm: float, link: float, network: float) -> dict[str, Any]:
    """A TPU's GEMM model (128x128 matrix units, SB Part 2; the share large GEMMs reach is in the calibrated
    efficiency) and its links at the profile's peaks and latency (SB Parts 2 and 3)."""
    src = f"a model: 128x128 MXUs and the HBM roofline ({_SB_TPU})"
    return {
        "gemm": model_table(peak, hbm, cap=1.0, tile=128, floor_s=2e-6, source=src, date="2025"),
        "links": (alpha_beta("ici", link, 1e-5, source=_SB_TPU), alpha_beta("dcn", network, 1e-5, source=_SB_TPU)),
    }


PROFILES: dict[str, Hardware] = {
    "h100": Hardware(
        name="h100",
        efficiency=CALIBRATED["h100"][0],
        contention=CALIBRATED["h100"][1],
        description="NVIDIA H100 SXM 80GB, 8 per node (NVLink 4), 8x400 Gb/s InfiniBand per node",
        peak_flops=_peak("h100"),  # datasheet: 1,979 TFLOP/s bf16 with sparsity -> 989 dense
        memory=80 * GB,
        memory_bandwidth=3.35e12,  # datasheet: 80 GB HBM3, 3.35 TB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=450e9,  # NVLink 4: 900 GB/s bidirectional = 450 GB/s egress (SB Part 12)
        network_bandwidth=50e9,  # one 400 Gb/s NIC per GPU: node egress 400 GB/s / 8 (SB Part 12)
        latency=1e-5,
        gemm=sm90(),
        links=(nvlink_h100(), ib_link()),
        sources=(
            "https://www.nvidia.com/en-us/data-center/h100/",
            _SB_GPU,
            "https://docs.nvidia.com/dgx-superpod-reference-architecture-dgx-h100.pdf",
        ),
    ),
    "h200": Hardware(
        name="h200",
        efficiency=CALIBRATED["h200"][0],
        contention=CALIBRATED["h200"][1],
        description="NVIDIA H200 SXM 141GB, 8 per node (NVLink 4), 8x400 Gb/s InfiniBand per node",
        peak_flops=_peak("h200"),  # datasheet: 1,979 TFLOP/s bf16 with sparsity (same Hopper die as H100)
        memory=141 * GB,
        memory_bandwidth=4.8e12,  # datasheet: 141 GB HBM3e, 4.8 TB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=450e9,
        network_bandwidth=50e9,
        latency=1e-5,
        gemm=sm90(),  # XLA's sm_90 table: the H100's die
        links=(nvlink_h100(), ib_link()),
        sources=("https://www.nvidia.com/en-us/data-center/h200/", _SB_GPU),
    ),
    "a100-80g": Hardware(
        name="a100-80g",
        efficiency=CALIBRATED["a100-80g"][0],
        contention=CALIBRATED["a100-80g"][1],
        description="NVIDIA A100 SXM 80GB, 8 per node (NVLink 3), 8x200 Gb/s InfiniBand per node",
        peak_flops=_peak("a100"),  # datasheet: 312 TFLOP/s bf16 dense
        memory=80 * GB,
        memory_bandwidth=2.039e12,  # datasheet: 80 GB HBM2e, 2,039 GB/s
        topology="nodes",
        node_size=8,
        link_bandwidth=300e9,  # NVLink 3: 600 GB/s bidirectional = 300 GB/s egress
        network_bandwidth=25e9,  # DGX A100: one 200 Gb/s HDR NIC per GPU
        latency=1e-5,
        gemm=_A100_GEMM,
        # NVLink: ~20% protocol overhead (NCCL's maintainers, nccl-tests#212); HDR NICs as NDR's, at half the rate.
        links=(alpha_beta("nvlink", 300e9, 13e-6, 0.82, source=_NCCL), ib_link(25e9)),
        sources=(
            "https://www.nvidia.com/en-us/data-center/a100/",
            "https://docs.nvidia.com/dgx-superpod-reference-architecture-dgx-a100.pdf",
        ),
    ),
    "v4": Hardware(
        name="v4",
        efficiency=CALIBRATED["v4"][0],
        contention=CALIBRATED["v4"][1],
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
        **_tpu(_peak("tpu v4"), 1.2e12, 9e10, 2.5e10 / 4),
        sources=(_SB_TPU, "https://cloud.google.com/tpu/docs/v4"),
    ),
    "v5e": Hardware(
        name="v5e",
        efficiency=CALIBRATED["v5e"][0],
        contention=CALIBRATED["v5e"][1],
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
        **_tpu(_peak("tpu v5e"), 8.1e11, 1e11, 2.5e10 / 8),
        sources=(_SB_TPU, "https://cloud.google.com/tpu/docs/v5e"),
    ),
    "v5p": Hardware(
        name="v5p",
        efficiency=CALIBRATED["v5p"][0],
        contention=CALIBRATED["v5p"][1],
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
        **_tpu(_peak("tpu v5p"), 2.76e12, 1.8e11, 2.5e10 / 4),
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


__all__ = ["Hardware", "PROFILES", "hardware", "profile_names", "collective_time", "KINDS", "Link", "GemmTable"]
