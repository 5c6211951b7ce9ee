"""Communication terms of the cost model: which collectives a layout runs, per phase, axis and step.

What is gathered, reduced or passed on for each parameter layout (FSDP,
data, tensor and sequence parallelism, pipeline stages, experts) — the
analytic half of :mod:`partitioning.tune.cost`, which adds compute and the
roofline.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 8}, "fsdp")
    >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
    >>> from partitioning.tune.comm import analytic_comm
    >>> comms = analytic_comm(plan.params, {"data": 1, "fsdp": 8}, pt.Rules.preset("fsdp"), w, pt.tune.hardware("h100"),
    ...                       micro_batch=w.batch)
    >>> sorted({c.kind for c in comms})
    ['all-gather', 'reduce-scatter']
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from partitioning.layout import LeafLayout
from partitioning.resolve import axes_tuple
from partitioning.rules import Rules
from partitioning.tune.hardware import Hardware
from partitioning.tune.links import collective_seconds
from partitioning.tune.workload import Workload, local_elements, param_path

PHASES = ("fwd", "bwd", "update")


@dataclasses.dataclass(frozen=True)
class Comm:
    """Collectives of one kind over some mesh axes in one phase, per step and device."""

    axes: tuple[str, ...]
    kind: str
    phase: str
    bytes: float  # full-buffer bytes (gathered result, reduced buffer), summed over executions
    count: float  # executions per step
    group: int
    seconds: float
    what: str = ""
    nodes: int = 1  # how many nodes one group spans: 1 on the fast links inside a node, more over the network
    # On the critical path: the compute waits for it (an activation a tensor-parallel matmul feeds the next one),
    # not hidden behind the phase's compute.
    blocking: bool = False

    @property
    def label(self) -> str:
        return "+".join(self.axes) or "?"


def priced_comm(
    hw: Hardware, mesh: Mapping[str, int], nodes: Mapping[str, int] | None, axes: tuple[str, ...], *args: Any
) -> Comm:
    """A :class:`Comm` over ``axes`` priced at their link level, at the bandwidth its message size reaches
    (:func:`~partitioning.tune.links.collective_seconds`): ``args`` are kind, phase, bytes, count, what.

    Example::

        >>> from partitioning.tune.comm import priced_comm
        >>> h100, mesh = pt.tune.hardware("h100"), {"data": 4, "fsdp": 8}
        >>> c = priced_comm(h100, mesh, {"fsdp": 4}, ("fsdp",), "all-gather", "fwd", 1e9, 1, "weights")
        >>> c.nodes, round(c.seconds * 1e3, 2)       # 4 nodes of 2 fsdp devices: 2 NICs at 47 of 50 GB/s
        (4, 10.68)
    """
    kind, phase, nbytes, count, what = args
    group = math.prod(mesh[a] for a in axes) if axes else 1
    spans = max(1, group // max(1, hw.members_per_node(mesh, axes, nodes))) if axes else 1
    seconds = collective_seconds(hw, mesh, axes, kind, nbytes, count, nodes)
    return Comm(axes, kind, phase, nbytes, count, group, seconds, what, spans)


def token_axes(rules: Rules, mesh: Mapping[str, int], w: Workload) -> list[str]:
    """Mesh axes (size > 1) that split the tokens: the batch axes, then those splitting ``length``."""
    out = [a for a in rules.batch_axes if mesh.get(a, 1) > 1]
    spec = rules.resolve(("batch", "length", "embed"))
    if spec is not None and len(spec) > 1:
        out += [a for a in axes_tuple(spec[1]) if mesh.get(a, 1) > 1 and a not in out]
    return out


def _length_axes(rules: Rules, mesh: Mapping[str, int]) -> list[str]:
    spec = rules.resolve(("batch", "length", "embed"))
    return [a for a in axes_tuple(spec[1]) if mesh.get(a, 1) > 1] if spec is not None and len(spec) > 1 else []


def leaf_axes(leaf: LeafLayout, mesh: Mapping[str, int]) -> list[str]:
    return [a for e in leaf.spec for a in axes_tuple(e) if mesh.get(a, 1) > 1]


OWNED = ("layers", "expert")  # dimensions whose split is the device's share of the work, never gathered


def _owned(names: Sequence[Any], i: int) -> bool:
    """Dimension ``i`` is a stacked ``layers`` axis, or the ``expert`` axis of an expert's weights
    ``(expert, embed, mlp)`` (a router's ``(embed, expert)`` is a dense matmul: gathered)."""
    if i >= len(names) or names[i] not in OWNED:
        return False
    return names[i] == "layers" or "mlp" in names


def shared_axes(leaf: LeafLayout, mesh: Mapping[str, int]) -> list[str]:
    """The leaf's mesh axes (size > 1) except those splitting a ``layers`` or an expert weight's ``expert``
    dimension."""
    names = list(leaf.names or ())
    return [a for i, e in enumerate(leaf.spec) if not _owned(names, i) for a in axes_tuple(e) if mesh.get(a, 1) > 1]


def _repeats(leaf: LeafLayout) -> int:
    """How many times a step uses the leaf's slices one after another (its ``layers`` axis)."""
    if leaf.names and "layers" in leaf.names:
        return int(leaf.shape[list(leaf.names).index("layers")])
    return 1


def _layer_shards(leaf: LeafLayout) -> int:
    """Into how many stages the leaf's stacked ``layers`` dimension is split (1: not stacked or not split)."""
    if leaf.names and "layers" in leaf.names:
        return int(leaf.shards_per_dim[list(leaf.names).index("layers")])
    return 1


def _ordered(mesh: Mapping[str, int], axes: Sequence[str]) -> tuple[str, ...]:
    return tuple(a for a in mesh if a in axes)


def analytic_comm(
    params: Sequence[LeafLayout],
    mesh: Mapping[str, int],
    rules: Rules,
    w: Workload,
    hw: Hardware,
    *,
    micro_batch: int,
    grad_accum: int = 1,
    microbatches: int = 1,
    repeats: int = 1,
    context: str | None = None,
    nodes: Mapping[str, int] | None = None,
    frozen: Collection[str] = (),
) -> list[Comm]:
    """The collectives of one step, per device (see the module docstring), each priced at the link level it runs
    on: inside a node or across nodes, as ``nodes`` (the mesh's ``nodes``; default ``jax.make_mesh``'s layout)
    places the mesh. A param in ``frozen`` (paths without ``params/``) has no gradient to reduce.

    ``context``: how attention runs over a split ``length`` (``all_gather`` when None; ``ring``: each of
    the ``C`` devices passes ``C - 1`` key/value blocks on in the forward pass, and ``C`` blocks with their
    float32 gradients in the backward pass).

    ``microbatches`` / ``repeats``: the pipeline's ``M`` / ``R``. A device runs one chunk of ``L/(S R)``
    of its stage's layers in each of the schedule's ``R M + S - 1`` iterations, on one micro-batch each:
    it gathers the chunk's FSDP weights once per iteration, and its tensor-parallel activations add up to
    ``(R M+S-1)/(R M)`` of the batch's.
    """
    tokens = token_axes(rules, mesh, w)
    buckets: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])  # (axes, kind, phase, what) -> bytes, count

    def add(axes, kind, phase, nbytes, count, what):
        key = (_ordered(mesh, axes), kind, phase, what)
        buckets[key][0] += nbytes * grad_accum
        buckets[key][1] += count * grad_accum

    # A tensor-parallel collective moves the whole residual of the device's tokens: all-reduced, or (with the
    # residual's embed split over the tensor axes, sequence-parallel style) reduce-scattered and gathered again.
    resid = micro_batch * w.seq_len * w.embed / math.prod(mesh[a] for a in tokens)
    resid_bytes = resid * w.compute_bytes
    row: defaultdict[tuple[Any, ...], int] = defaultdict(int)
    col: set[tuple[Any, ...]] = set()
    pipelined = 1
    for leaf in params:
        every = leaf_axes(leaf, mesh)
        axes = shared_axes(leaf, mesh)
        fsdp = [a for a in axes if a in tokens]
        dp = [a for a in tokens if a not in every]
        mp = [a for a in axes if a not in tokens]
        stages = _layer_shards(leaf)
        pipelined = max(pipelined, stages)
        reps = _repeats(leaf) // stages  # the layers this device runs
        # Pipelined, each of the stage's layers runs (R M + S - 1) / R times: one chunk per iteration.
        again = (repeats * microbatches + stages - 1) / repeats if stages > 1 else 1
        trains = param_path(leaf.path) not in frozen
        if fsdp:
            gathered = leaf.per_device_bytes * math.prod(mesh[a] for a in fsdp) * again
            # An accelerator casts a weight to the compute dtype before gathering it (XLA:CPU computes in f32).
            cast = 1.0 if hw.measured else min(1.0, w.compute_bytes / np.dtype(leaf.dtype).itemsize)
            add(fsdp, "all-gather", "fwd", gathered * cast, reps * again, "FSDP weights (forward)")
            add(fsdp, "all-gather", "bwd", gathered * cast, reps * again, "FSDP weights (backward)")
            if trains:
                add(fsdp, "reduce-scatter", "bwd", gathered, reps * again, "FSDP gradients")
        if dp and trains:
            add(dp, "all-reduce", "bwd", leaf.per_device_bytes, 1, "gradients (data parallel)")
        if mp and leaf.names and "embed" in leaf.names:
            e = list(leaf.names).index("embed")
            # strict=False: a PartitionSpec may be shorter than the array's rank (trailing dims unsharded).
            split = [
                i
                for i, (d, n) in enumerate(zip(leaf.spec, leaf.shards_per_dim, strict=False))
                if n > 1 and i != e and not _owned(leaf.names, i) and any(a in mp for a in axes_tuple(d))
            ]
            parent = leaf.path.rsplit("/", 1)[0]
            share = again / microbatches if stages > 1 else 1.0  # of the batch's activations, bubble included
            if split and max(split) < e:
                row[(tuple(mp), leaf.path, reps, again, share)] += 1
            elif split:
                col.add((tuple(mp), parent, reps, again, share))
    for (row_axes, _, reps, again, share), n in row.items():
        add(
            row_axes,
            "all-reduce",
            "fwd",
            n * resid_bytes * reps * share,
            n * reps * again,
            "activations (row-parallel matmuls)",
        )
    for col_axes, _, reps, again, share in col:
        add(
            col_axes,
            "all-reduce",
            "bwd",
            resid_bytes * reps * share,
            reps * again,
            "activation gradients (column-parallel matmuls)",
        )
    seq = _length_axes(rules, mesh)
    if seq and w.heads and w.head_dim:
        kv = local_elements(
            rules, mesh, ("batch", "length", "kv_heads", "kv"), (micro_batch, w.seq_len, w.kv_heads, w.head_dim)
        )
        layers = w.layers // pipelined
        iters = repeats * microbatches + pipelined - 1
        share = iters / (repeats * microbatches) if pipelined > 1 else 1.0
        c = math.prod(mesh[a] for a in seq)
        runs = layers * (iters / repeats if pipelined > 1 else 1)
        if context == "ring":
            sent = 2 * kv * layers * share
            add(
                seq,
                "collective-permute",
                "fwd",
                sent * w.compute_bytes * (c - 1),
                2 * (c - 1) * runs,
                "key/value blocks around the ring",
            )
            add(
                seq,
                "collective-permute",
                "bwd",
                sent * (w.compute_bytes + 4) * c,
                4 * c * runs,
                "key/value blocks and their gradients around the ring",
            )
        else:
            gathered = 2 * kv * w.compute_bytes * c * layers * share
            add(seq, "all-gather", "fwd", gathered, 2 * runs, "keys and values (sequence split)")
            add(seq, "reduce-scatter", "bwd", gathered, 2 * runs, "key and value gradients (sequence split)")
    out = [
        priced_comm(hw, mesh, nodes, axes, kind, phase, nbytes, count, what)
        for (axes, kind, phase, what), (nbytes, count) in buckets.items()
    ]
    # A tensor-parallel matmul's collective feeds the next matmul: XLA runs it in turn with them (no collective
    # matmul by default), as Megatron-LM does; so does attention over a split sequence with its keys and values.
    return [dataclasses.replace(c, blocking=c.what in BLOCKING) for c in out]


BLOCKING = (
    "activations (row-parallel matmuls)",
    "activation gradients (column-parallel matmuls)",
    "keys and values (sequence split)",
    "key and value gradients (sequence split)",
)


def parallel_comm(
    costs: Mapping[str, Any],
    mesh: Mapping[str, int],
    hw: Hardware,
    expert_axes: Sequence[str] = ("expert",),
    nodes: Mapping[str, int] | None = None,
) -> list[Comm]:
    """The pipeline's and the experts' collectives from their analytic costs per step and device
    (:func:`partitioning.plan.parallel.costs_from_records`), half forward and half backward."""
    out = []

    def add(axes, kind, nbytes, count, what):
        axes = _ordered(mesh, [a for a in axes if mesh.get(a, 1) > 1])
        if not axes or not nbytes:
            return
        for phase in ("fwd", "bwd"):
            out.append(priced_comm(hw, mesh, nodes, axes, kind, phase, nbytes / 2, count / 2, what))

    pipe, experts = costs.get("pipeline"), costs.get("experts")
    if pipe and pipe["stages"] > 1:
        add(
            ("stage",),
            "collective-permute",
            pipe["collective_permute_bytes"],
            pipe["collective_permute_count"],
            "activations to the next stage",
        )
        add(("stage",), "all-reduce", pipe["stage_all_reduce_bytes"], 2, "last stage's outputs to every stage")
        if pipe.get("regroup_bytes"):
            add(
                ("stage",),
                "collective-permute",
                pipe["regroup_bytes"],
                2,
                "stored layers to the stages of the circular schedule (gradients back)",
            )
    if experts and experts["expert_shards"] > 1:
        add(
            expert_axes,
            "all-to-all",
            experts["all_to_all_bytes"],
            experts["all_to_all_count"],
            "tokens to their experts and back",
        )
    return out


def bubble_time(compute: Mapping[str, float], stages: int, microbatches: int, repeats: int = 1) -> dict[str, float]:
    """``{"pipeline bubble": s}``: the stages' idle time, ``(S-1)/(R M)`` of their forward and backward compute."""
    if stages <= 1:
        return {}
    return {"pipeline bubble": (stages - 1) / (repeats * microbatches) * (compute["fwd"] + compute["bwd"])}


def _expert_axes(rules: Rules, mesh: Mapping[str, int]) -> list[str]:
    spec = rules.resolve(("batch", "expert", None, "embed"))
    return [a for a in axes_tuple(spec[1]) if mesh.get(a, 1) > 1] if spec is not None and len(spec) > 1 else []


__all__ = [
    "PHASES",
    "Comm",
    "priced_comm",
    "token_axes",
    "leaf_axes",
    "shared_axes",
    "analytic_comm",
    "parallel_comm",
    "bubble_time",
]
