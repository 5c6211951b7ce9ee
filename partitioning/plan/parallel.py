"""Analytic costs of pipeline stages and expert parallelism, from the shapes a forward pass traced.

The records come from :func:`partitioning.parallel.trace.recording` (one per
layer stack and per expert layer). Per device and per train step:

- **pipeline** (``stage`` axis, ``S`` stages, ``M`` micro-batches, ``R``
  repeats: the circular schedule for ``R > 1``): the bubble ``(S-1)/(R M+S-1)``
  (beside GPipe's ``(S-1)/(M+S-1)``); the shifts — one collective-permute of
  one micro-batch's activations per iteration, forward and backward:
  ``2 (R M+S-1)`` of them; the last stage's outputs reaching every stage once,
  and the inputs' gradient likewise (two all-reduces over ``stage`` of the
  batch's activations); for ``R > 1`` the stored blocks of layers regrouped
  into the stages' chunks (``regroup_bytes``: the weights that move, forward,
  and their gradients back);
- **experts** (``expert`` axis): the all-to-all of the dispatched tokens,
  ``(tokens, experts, capacity, embed)`` per device, twice forward (dispatch,
  combine) and twice backward, per expert layer.

:func:`parallel_costs` traces the model itself (what ``plan`` prints, from Python);
:func:`costs_from_records` works on records already traced.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> model = GPT(embed=64, mlp=128, layers=4)
    >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=16)
    >>> costs = pt.plan.parallel_costs(model, params, {"stage": 4, "data": 2}, "pp", batch_size=32, seq_len=128,
    ...                           microbatches=8)
    >>> costs["pipeline"]["bubble"], costs["pipeline"]["collective_permute_bytes"]
    (0.2727..., 1441792)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from partitioning.data.batch import batch_shapes, batch_size_of
from partitioning.mesh import abstract_mesh
from partitioning.parallel.pipeline import check_microbatches, microbatching
from partitioning.parallel.schedule import bubble_fraction, stage_chunks
from partitioning.parallel.trace import recording
from partitioning.plan.coverage import activation_names
from partitioning.resolve import mesh_axis_sizes
from partitioning.rules import as_rules


def _shards(axes: Sequence[str], mesh: Mapping[str, int]) -> int:
    return math.prod(int(mesh.get(a, 1)) for a in axes)


def regrouped_fraction(stages: int, repeats: int) -> float:
    """The largest share of a stage's stored layers that the circular schedule runs on another stage.

    Example::

        >>> from partitioning.plan.parallel import regrouped_fraction
        >>> regrouped_fraction(4, 1), regrouped_fraction(2, 2), regrouped_fraction(4, 2)
        (0.0, 0.5, 1.0)
    """
    if stages <= 1 or repeats <= 1:
        return 0.0
    chunks = stage_chunks(stages, repeats)
    stays = [len({s * repeats + j for j in range(repeats)} & set(c)) for s, c in enumerate(chunks)]
    return 1.0 - min(stays) / repeats


def stacked_bytes(params: Sequence[Any]) -> float:
    """Per device, the bytes of the stacked layers' params (plan leaves with a ``layers`` dimension)."""
    return float(sum(leaf.per_device_bytes for leaf in params if leaf.names and "layers" in tuple(leaf.names)))


def pipeline_cost(
    rec: Mapping[str, Any], mesh: Mapping[str, int], stage_weight_bytes: float | None = None
) -> dict[str, Any]:
    """The analytic figures of one layer stack (see the module docstring).

    ``stage_weight_bytes``: per device, the stacked layers' params (for the circular regrouping);
    default: the stack's bytes over the stages (weights split over nothing else).
    """
    s, m, r = int(rec["stages"]), int(rec["microbatches"]), int(rec.get("repeats", 1))
    shape = tuple(rec["shape"])
    rows = shape[0] // m
    local_rows = max(1, rows // _shards(rec["batch_axes"], mesh))
    micro_bytes = local_rows * math.prod(shape[1:]) * np.dtype(rec["dtype"]).itemsize
    iterations = r * m + s - 1 if s > 1 else 0
    if stage_weight_bytes is None:
        stage_weight_bytes = float(rec.get("param_bytes", 0)) / max(1, s)
    return {
        "stages": s,
        "microbatches": m,
        "repeats": r,
        "layers": int(rec["layers"]),
        "layers_per_stage": int(rec["layers"]) // s,
        "layers_per_chunk": int(rec["layers"]) // (s * r),
        "iterations": iterations,
        "bubble": bubble_fraction(s, m, r),
        "bubble_gpipe": bubble_fraction(s, m),
        "micro_batch_rows": rows,
        "activation_bytes": micro_bytes,
        # forward and backward: one shift per iteration each
        "collective_permute_count": 2 * iterations,
        "collective_permute_bytes": 2 * iterations * micro_bytes,
        # the last stage's outputs to every stage (forward) and the inputs' gradient (backward)
        "stage_all_reduce_bytes": 2 * m * micro_bytes if s > 1 else 0,
        # circular: the stored blocks of layers to the stages that run them (forward), gradients back
        "regroup_bytes": 2 * regrouped_fraction(s, r) * stage_weight_bytes,
    }


def expert_cost(rec: Mapping[str, Any], mesh: Mapping[str, int], layers: int = 1) -> dict[str, Any]:
    """The analytic all-to-all of one expert layer, times ``layers`` (its scan length)."""
    e, c, d = int(rec["experts"]), int(rec["capacity"]), int(rec["embed"])
    groups = int(rec["groups"])
    shards = _shards(rec["batch_axes"], mesh)
    ep = _shards(rec["expert_axes"], mesh)
    local_groups = max(1, groups // shards)
    buffer = local_groups * e * c * d * np.dtype(rec["dtype"]).itemsize
    exchanged = buffer if ep > 1 else 0
    return {
        "experts": e,
        "top_k": int(rec["top_k"]),
        "capacity": c,
        "expert_shards": ep,
        "layers": layers,
        "dispatch_bytes": buffer,
        # dispatch + combine, forward and backward, per layer
        "all_to_all_count": 4 * layers if ep > 1 else 0,
        "all_to_all_bytes": 4 * layers * exchanged,
    }


def costs_from_records(
    records: Sequence[Mapping[str, Any]],
    mesh: Mapping[str, int],
    passes: int = 1,
    stage_weight_bytes: float | None = None,
) -> dict[str, Any]:
    """``{"pipeline": ..., "experts": ...}`` per step for the records of one traced forward pass.

    Either is None when the model has no layer stack / expert layer. ``passes``
    forward passes make a step (``grad_accum``). Expert layers inside a layer
    stack (traced once or a few times) run once per stacked layer. ``stage_weight_bytes``:
    as for :func:`pipeline_cost`.
    """
    stacks = [r for r in records if r["kind"] == "pipeline"]
    experts = [r for r in records if r["kind"] == "experts"]
    out: dict[str, Any] = {
        "pipeline": pipeline_cost(stacks[0], mesh, stage_weight_bytes) if stacks else None,
        "experts": (
            expert_cost(experts[0], mesh, layers=stacks[0]["layers"] if stacks else len(experts)) if experts else None
        ),
    }
    for cost in out.values():
        for key in list(cost or {}):
            if key.endswith(("_bytes", "_count")) and key not in ("activation_bytes", "dispatch_bytes"):
                cost[key] *= passes
    return out


def parallel_costs(
    model: Any,
    params: Any,
    mesh: Any,
    rules: Any,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    batch: Any = None,
    task: Any = None,
    microbatches: int | None = None,
    grad_accum: int = 1,
    axis_types: Any = None,
    repeats: int = 1,
) -> dict[str, Any]:
    """``{"pipeline": ..., "experts": ...}``: the analytic costs per train step and device of ``model`` laid out
    by ``rules`` on ``mesh`` (``{axis: size}`` or a Mesh) — what ``partitioning plan`` prints beside the
    compiled collectives. Traces one forward pass (``jax.eval_shape``; nothing runs, nothing is allocated).

    ``params``: abstract boxed params (:func:`~partitioning.train.state.abstract_train_state`);
    ``microbatches`` / ``grad_accum`` / ``repeats`` (``pipeline_repeats``) as for the Trainer; ``axis_types``
    as for :func:`~partitioning.plan.activation_names`. Either entry is None when the model has no
    layer stack / expert layer.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> model = GPT(embed=64, mlp=128, layers=2, moe={"experts": 4, "top_k": 2})
        >>> params, _ = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> pt.plan.parallel_costs(model, params, {"data": 1, "fsdp": 2, "expert": 4}, "ep", batch_size=32,
        ...                   seq_len=128)["experts"]["all_to_all_bytes"]
        2621440
    """
    sizes = mesh_axis_sizes(mesh)
    rules = as_rules(rules)
    full = batch_shapes(batch, batch_size, seq_len, "parallel_costs")
    g = max(1, int(grad_accum))
    forward = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // g, *x.shape[1:]), x.dtype), full)
    abstract = abstract_mesh(mesh, axis_types)
    m, _, _ = check_microbatches(abstract, rules, microbatches, batch_size_of(forward), repeats=repeats)
    with microbatching(m, repeats), recording() as records:
        activation_names(model, params, abstract, rules, batch=forward, task=task)
    return costs_from_records(records, sizes, passes=g)


__all__ = [
    "pipeline_cost",
    "expert_cost",
    "costs_from_records",
    "parallel_costs",
    "regrouped_fraction",
    "stacked_bytes",
]
