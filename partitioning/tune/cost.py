"""The cost model: a train step's time as a roofline of compute and per-axis communication, each term shown.

A step has three phases: the forward pass, the backward pass (with any
recomputation) and the optimizer update; with micro-batches the first two
run once per micro-batch. Per phase ``p``:

- **compute** ``C_p = max(FLOPs_p / peak, HBM bytes_p / HBM bandwidth)`` per
  device (analytic: per op of the compiled step when there is one);
- **communication** ``X_p = sum over its collectives of latency + f * bytes / W(axes)``
  with ``f = 1`` for an all-gather or reduce-scatter, ``2`` for an all-reduce
  (:func:`~partitioning.tune.hardware.collective_time`), ``W`` the per-device
  bandwidth of the mesh axes it runs over (:meth:`Hardware.bandwidth`).

A collective can only hide behind the compute of its own phase (a gradient
all-reduce cannot start before the backward pass makes the gradient), so

    overlapped:   T = sum_p max(C_p, X_p)        not overlapped:   T = sum_p (C_p + X_p)

and the estimate is the overlapped one when the hardware runs collectives
asynchronously (``Hardware.overlap``), the other one on the CPU. On the CPU a
step also pays for faulting in its fresh temporary memory (``temp bytes /
Hardware.alloc_bandwidth``, added to either; accelerators pool their memory). This is the
model of "How to Scale Your Model" (Part 5), which compares forward and backward
FLOPs with the collectives of the same pass.

Analytic communication per step and device (:func:`analytic_comm`), from the
plan's layouts; "token axes" split the batch (or the sequence):

- a parameter split over token axes (FSDP) is all-gathered in the forward
  and again in the backward pass, and its gradient reduce-scattered, over
  those axes, once per layer and micro-batch;
- token axes that do not split a parameter (data parallelism) all-reduce
  its gradient, once per micro-batch;
- a parameter split over other axes (tensor parallelism) with an ``embed``
  dimension: split dimensions before ``embed`` contract into the residual
  stream (row-parallel: an all-reduce of the ``(batch, length, embed)``
  activation in the forward pass), after it expand from it (column-parallel:
  one all-reduce of the activation's gradient per module in the backward pass);
- a sequence split over an axis (``length``) all-gathers keys and values for
  attention in the forward pass and reduce-scatters their gradients; as a ring
  (``context="ring"``) it passes key/value blocks on (collective-permutes) instead;
- a split of a stacked ``layers`` dimension (pipeline stages) or of an
  ``expert`` dimension is the device's own share of the work: it is never
  gathered; instead (:func:`parallel_comm`) the stages pass each micro-batch's
  activations on (a collective-permute per iteration, forward and backward, and
  the last stage's outputs to all), idle a bubble of ``(S-1)/(R M)`` of their
  compute (:func:`bubble_time`; ``R`` repeats: the circular schedule, which also
  regroups the stored layers into its chunks once per pass) and, under FSDP,
  gather a chunk's weights once per schedule iteration; expert layers send the dispatched tokens to their
  experts' devices and back (an all-to-all each way, forward and backward).

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
    >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
    >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
    >>> from partitioning.tune.cost import analytic_estimate
    >>> state = {k: plan.totals[k]["per_device"] for k in ("params", "gradients", "optimizer")}
    >>> est = analytic_estimate(plan.params, state, {"data": 8}, pt.Rules.preset("dp"), w, pt.tune.hardware("h100"),
    ...                         remat="full", grad_accum=1)
    >>> est.step_time > 0, sorted(est.per_axis()), est.bottleneck
    (True, [...], '...')
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from partitioning.layout import LeafLayout
from partitioning.rules import Rules
from partitioning.tune.comm import (
    PHASES,
    Comm,
    _expert_axes,
    _repeats,
    analytic_comm,
    bubble_time,
    leaf_axes,
    parallel_comm,
    shared_axes,
    token_axes,
)
from partitioning.tune.compute import compute_terms
from partitioning.tune.hardware import Hardware
from partitioning.tune.workload import Workload


@dataclasses.dataclass
class Estimate:
    """The terms of one layout's step time (see the module docstring) and their roofline.

    Example: see :class:`~partitioning.tune.search.Search` (``result.estimate``).
    """

    source: str  # "analytic" | "compiled"
    flops: dict[str, float]  # per device, per phase
    hbm_bytes: dict[str, float]  # per device, per phase
    compute: dict[str, float]  # seconds per phase: max(flops / peak, bytes / HBM bandwidth)
    comm: list[Comm]
    overlap: bool
    model_flops: float  # whole step, all devices (for MFU)
    devices: int
    peak_flops: float
    other: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds outside the phases
    matmul_flops: float = 0.0  # FLOP/s the matmuls run at in the compute terms (their mean); 0: peak_flops
    memory: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per phase bound by HBM bandwidth
    contention: float = 0.0  # the share of a hidden collective's time the compute beside it loses (Hardware's)

    def comm_time(self, phase: str | None = None) -> float:
        return sum(c.seconds for c in self.comm if phase is None or c.phase == phase)

    def per_axis(self) -> dict[str, float]:
        """Seconds of communication per mesh axis (``a+b`` for collectives over several)."""
        out: dict[str, float] = defaultdict(float)
        for c in self.comm:
            out[c.label] += c.seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def blocking_time(self, phase: str) -> float:
        """Seconds of the phase's collectives its compute waits for (:attr:`Comm.blocking`)."""
        return sum(c.seconds for c in self.comm if c.phase == phase and c.blocking)

    def phase_time(self, p: str) -> float:
        """Overlapped: the larger of the phase's compute (with the collectives it waits for, and what the hidden
        ones take from it) and the collectives it hides."""
        blocking = self.blocking_time(p)
        hidden = self.comm_time(p) - blocking
        return max(self.compute[p] + blocking + self.contention * hidden, hidden)

    @property
    def overlapped(self) -> float:
        return sum(self.phase_time(p) for p in PHASES) + sum(self.other.values())

    @property
    def serial(self) -> float:
        return sum(self.compute[p] + self.comm_time(p) for p in PHASES) + sum(self.other.values())

    @property
    def step_time(self) -> float:
        return self.overlapped if self.overlap else self.serial

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_time * self.devices * self.peak_flops) if self.step_time else 0.0

    @property
    def bottleneck(self) -> str:
        """What bounds the step: ``compute``, ``memory bandwidth`` or ``comm <axis>``.

        Each phase's time goes to its binding term (overlapped: the larger of
        compute and the hidden communication, the latter to its busiest axis, and
        the collectives the compute waits for to their axes; not overlapped:
        every term its own time); the largest total wins.
        """
        score: dict[str, float] = defaultdict(float)
        for p in PHASES:
            if self.memory:
                kind = "memory bandwidth" if self.memory.get(p, 0.0) * 2 > self.compute[p] else "compute"
            else:
                rate = self.matmul_flops or self.peak_flops
                kind = "compute" if self.flops[p] / rate >= self.compute[p] * 0.999 else "memory bandwidth"
            axes: dict[str, float] = defaultdict(float)
            waits: dict[str, float] = defaultdict(float)
            for c in self.comm:
                if c.phase == p:
                    (waits if c.blocking and self.overlap else axes)[f"comm {c.label}"] += c.seconds
            hidden = sum(axes.values())
            for a, t in waits.items():  # on the critical path: its own time, overlapped or not
                score[a] += t
            if not self.overlap:
                score[kind] += self.compute[p]
                for a, t in axes.items():
                    score[a] += t
            elif self.phase_time(p) > hidden or not axes:
                score[kind] += self.compute[p] + self.contention * hidden
            else:
                score[max(axes, key=lambda a: axes[a])] += hidden
        for k, v in self.other.items():
            score[k] += v
        return max(score, key=lambda k: score[k]) if score else "compute"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "step_time_s": self.step_time,
            "overlapped_s": self.overlapped,
            "serial_s": self.serial,
            "overlap": self.overlap,
            "mfu": self.mfu,
            "bottleneck": self.bottleneck,
            "flops": self.flops,
            "hbm_bytes": self.hbm_bytes,
            "compute_s": self.compute,
            "memory_bound_s": self.memory,
            "matmul_flops": self.matmul_flops,
            "comm_s": {p: self.comm_time(p) for p in PHASES},
            "comm_per_axis_s": self.per_axis(),
            "other_s": self.other,
            "collectives": [dataclasses.asdict(c) | {"axes": list(c.axes)} for c in self.comm],
        }


def compute_parallelism(params: Sequence[LeafLayout], mesh: Mapping[str, int], rules: Rules, w: Workload) -> int:
    """Devices that share the step's FLOPs: token axes times the axes splitting layer weights (the rest copy)."""
    tokens = token_axes(rules, mesh, w)
    model = {
        a
        for leaf in params
        if _repeats(leaf) > 1 or leaf.names and ("mlp" in leaf.names or "expert" in leaf.names)
        for a in leaf_axes(leaf, mesh)
        if a not in tokens
    }
    return math.prod(mesh[a] for a in tokens) * math.prod(mesh[a] for a in model)


def analytic_estimate(
    params: Sequence[LeafLayout],
    state_bytes: Mapping[str, float],
    mesh: Mapping[str, int],
    rules: Rules,
    w: Workload,
    hw: Hardware,
    *,
    remat: str,
    grad_accum: int,
    flops_total: Mapping[str, float] | None = None,
    temp_bytes: float = 0.0,
    parallel: Mapping[str, Any] | None = None,
    context: str | None = None,
    nodes: Mapping[str, int] | None = None,
    frozen: Collection[str] = (),
    recompute: float | None = None,
) -> Estimate:
    """The analytic :class:`Estimate` of one layout (``nodes``: where its axes sit on nodes, see
    :func:`~partitioning.tune.comm.analytic_comm`).

    ``state_bytes``: per-device ``params``, ``gradients``, ``optimizer`` bytes
    (the plan's totals). Compute: :func:`~partitioning.tune.compute.compute_terms` (each matmul at its
    shape's efficiency, attention by implementation); ``flops_total``: whole-step ``fwd`` / ``bwd`` FLOPs
    (e.g. from a compiled step, scaled) to run at the same rate instead of the analytic count.
    ``temp_bytes``: the step's temporaries per device (see :func:`temporaries_time`).
    ``parallel``: the pipeline's and experts' analytic costs
    (:func:`partitioning.plan.parallel.costs_from_records`): their collectives and the bubble.
    ``context``: attention over a split ``length`` (``ring`` or ``all_gather``, :func:`analytic_comm`).
    ``frozen``: paths (without ``params/``) of params that do not train: no weight-gradient FLOPs, no
    gradient collectives. ``recompute``: the share of the forward matmuls a remat policy the toolkit has no
    name for runs again (:func:`~partitioning.tune.compute.compute_terms`).
    """
    devices = math.prod(mesh.values())
    micro = w.batch // grad_accum
    pipe = (parallel or {}).get("pipeline") or {}
    stages, m, r = int(pipe.get("stages", 1)), int(pipe.get("microbatches", 1)), int(pipe.get("repeats", 1))
    comp = compute_terms(
        params,
        mesh,
        rules,
        w,
        hw,
        remat=remat,
        grad_accum=grad_accum,
        state_bytes=state_bytes,
        frozen=frozen,
        microbatches=m,
        recompute=recompute,
    )
    if flops_total:  # another count of the same work (a compiled step's): the matmuls' time scaled to it
        par = compute_parallelism(params, mesh, rules, w)
        given = {"fwd": flops_total["fwd"] / par, "bwd": (flops_total["bwd"] + flops_total.get("recompute", 0)) / par}
        for p, f in given.items():
            if comp.flops[p]:
                comp.matmul[p] *= f / comp.flops[p]
                comp.flops[p] = f
    compute = comp.seconds
    memory = {p: comp.memory[p] / (hw.efficiency if p != "update" else 1.0) for p in PHASES}
    comm = analytic_comm(
        params,
        mesh,
        rules,
        w,
        hw,
        micro_batch=micro,
        grad_accum=grad_accum,
        microbatches=m,
        repeats=r,
        context=context,
        nodes=nodes,
        frozen=frozen,
    )
    comm += parallel_comm(parallel or {}, mesh, hw, _expert_axes(rules, mesh), nodes)
    other = {**temporaries_time(hw, temp_bytes), **bubble_time(compute, stages, m, r)}
    return Estimate(
        "analytic",
        comp.flops,
        comp.hbm_bytes,
        compute,
        comm,
        hw.overlap,
        w.flops_per_step(remat)["model"],
        devices,
        hw.peak_flops,
        other,
        comp.rate * hw.efficiency,
        memory,
        hw.contention,
    )


def temporaries_time(hw: Hardware, temp_bytes: float) -> dict[str, float]:
    """``{"temporaries": seconds}`` where fresh temporary memory costs time each step (the CPU), else ``{}``."""
    if not hw.alloc_bandwidth or not temp_bytes:
        return {}
    return {"temporaries": temp_bytes / hw.alloc_bandwidth}


__all__ = [
    "Comm",
    "Estimate",
    "PHASES",
    "temporaries_time",
    "analytic_comm",
    "analytic_estimate",
    "compute_parallelism",
    "token_axes",
    "parallel_comm",
    "bubble_time",
    "shared_axes",
]
