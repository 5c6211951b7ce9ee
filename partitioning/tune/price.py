"""One layout priced, no search: its plan, memory, fit and analytic step time.

The steps of :mod:`partitioning.tune.search` for a single
:class:`~partitioning.tune.space.Candidate`, which :func:`~partitioning.tune.search.search`
runs for each candidate and ``model.remat: auto`` (:mod:`partitioning.tune.remat`) and the check
against published measurements run for one forced layout each.

Example (shapes only: nothing is allocated)::

    >>> import dataclasses, optax
    >>> from partitioning.models import GPT
    >>> from partitioning.tune.price import price
    >>> from partitioning.tune.space import Candidate
    >>> model = GPT(vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16, dtype="bfloat16")   # 1.2B
    >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=64, seq_len=2048)
    >>> layouts = pt.build_plan(params, opt_state, {"data": 8}, "dp").params
    >>> w = pt.tune.workload(layouts, batch_size=64, seq_len=2048, compute_dtype="bfloat16", attention="auto")
    >>> c = Candidate((("data", 1), ("fsdp", 8)), "fsdp", remat="full")
    >>> r = price(params, opt_state, c, pt.Rules.preset("fsdp"), w, pt.tune.hardware("h100"), 80 * 2**30)
    >>> r.fits, round(r.step_time, 3), round(r.estimate.mfu, 2), f"{r.peak / 2**30:.1f} GiB"   # cuDNN's attention
    (True, 0.327, 0.39, '11.5 GiB')
    >>> einsums = dataclasses.replace(w, attention="xla")         # the T x T scores in memory
    >>> c = Candidate((("data", 1), ("fsdp", 8)), "fsdp", remat="none")     # every activation kept
    >>> price(params, opt_state, c, pt.Rules.preset("fsdp"), einsums, pt.tune.hardware("h100"), 80 * 2**30).reason
    'memory: needs 118.63 GiB per device (estimate), more than the budget of 80.00 GiB'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from partitioning.errors import PartitioningError
from partitioning.fmt import fmt_bytes
from partitioning.parallel.experts import DISPATCHED, TOKENS
from partitioning.plan.memory_kinds import state_split
from partitioning.plan.parallel import costs_from_records, stacked_bytes
from partitioning.plan.plan import Plan, build_plan
from partitioning.resolve import axes_tuple
from partitioning.rules import Rules
from partitioning.tune.comm import _repeats
from partitioning.tune.compute import attention_kind
from partitioning.tune.cost import analytic_estimate, shared_axes, token_axes
from partitioning.tune.hardware import Hardware
from partitioning.tune.host import host_bytes, host_transfers, unpriced
from partitioning.tune.nodes import placements
from partitioning.tune.space import Candidate, Result
from partitioning.tune.workload import Workload, activation_bytes


def _largest_gathered(plan: Plan, tokens: Sequence[str]) -> float:
    """The largest single weight of one layer gathered over the token axes, in the params' dtype: the gradient
    held before its reduce-scatter (each weight's is reduced as the backward pass makes it)."""
    mesh = plan.mesh
    return max(
        (
            leaf.per_device_bytes * math.prod(mesh[a] for a in shared_axes(leaf, mesh) if a in tokens) / _repeats(leaf)
            for leaf in plan.params
            if any(a in tokens for a in shared_axes(leaf, mesh))
        ),
        default=0.0,
    )


def _gathered_layer_bytes(plan: Plan, tokens: Sequence[str], layers: int, itemsize: int = 0) -> float:
    """One layer's weights gathered over the token axes (FSDP), in ``itemsize``-byte elements where that is
    smaller than the params' own (an accelerator casts a weight to the compute dtype before gathering it)."""
    mesh = plan.mesh
    total = sum(
        leaf.per_device_bytes
        * math.prod(mesh[a] for a in shared_axes(leaf, mesh) if a in tokens)
        * (min(1.0, itemsize / leaf.dtype.itemsize) if itemsize else 1.0)
        for leaf in plan.params
        if any(a in tokens for a in shared_axes(leaf, mesh))
    )
    return total / max(1, layers)


def _records_for(records: Sequence[Mapping[str, Any]], rules: Rules, c: Candidate) -> list[dict[str, Any]]:
    """The traced records (full batch, unpipelined) as candidate ``c`` would trace them."""

    def axes(spec, i):
        return axes_tuple(spec[i]) if spec is not None and len(spec) > i else ()

    out = []
    for rec in records:
        rec = dict(rec)
        if rec["kind"] == "pipeline":
            shape = tuple(rec["shape"])
            rec.update(
                stages=c.stages,
                microbatches=c.microbatches if c.stages > 1 else 1,
                repeats=c.repeats if c.stages > 1 else 1,
                shape=(shape[0] // c.grad_accum, *shape[1:]),
                batch_axes=tuple(rules.batch_axes),
            )
        elif rec["kind"] == "experts":
            rec.update(
                groups=max(1, int(rec["groups"]) // c.grad_accum),
                batch_axes=axes(rules.resolve(TOKENS), 0),
                expert_axes=axes(rules.resolve(DISPATCHED), 1),
            )
        out.append(rec)
    return out


def price(
    params: Any,
    opt_state: Any,
    c: Candidate,
    rules: Rules,
    w: Workload,
    hw: Hardware,
    budget: float,
    *,
    optimizer_rules: Rules | None = None,
    plan: Plan | PartitioningError | None = None,
    activations: Sequence[Any] = (),
    on_indivisible: str = "error",
    flops: Mapping[str, Mapping[str, float]] | None = None,
    records: Sequence[Mapping[str, Any]] = (),
    frozen: Collection[str] = (),
    recompute: float | None = None,
) -> Result:
    """One layout priced, no search: ``c``'s mesh, remat, micro-batches with ``rules`` (and ``optimizer_rules``).

    The steps of the module docstring for one candidate: its plan (or ``plan``, already built), memory,
    fit against ``budget`` and the analytic estimate. A layout the rules cannot split comes back with
    its ``reason``. Arguments as for :func:`search` (``frozen``: paths of params that do not train;
    ``recompute``: the share of the forward matmuls the backward pass runs again, for a remat policy the
    toolkit has no name for, priced with ``c.remat``'s memory).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> from partitioning.tune.price import price
        >>> from partitioning.tune.space import Candidate
        >>> model = GPT(vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16, dtype="bfloat16")   # 1.2B
        >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=64, seq_len=2048)
        >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")
        >>> w = pt.tune.workload(plan.params, batch_size=64, seq_len=2048, compute_dtype="bfloat16", attention="auto")
        >>> c = Candidate((("data", 1), ("tensor", 8)), "tp", remat="full")
        >>> r = price(params, opt_state, c, pt.Rules.preset("tp"), w, pt.tune.hardware("h100"), 80 * 2**30)
        >>> r.fits, r.reason       # 16 heads over 8 devices: divisible
        (True, None)
        >>> round(r.step_time, 3), round(r.estimate.mfu, 2), r.estimate.bottleneck   # the all-reduces wait
        (0.644, 0.2, 'compute')
    """
    if plan is None:
        try:
            plan = build_plan(
                params,
                opt_state,
                c.sizes,
                rules,
                optimizer_rules=optimizer_rules,
                on_indivisible=on_indivisible,
                activations=activations,
                frozen=frozen,
            )
        except PartitioningError as e:
            plan = e
    r = Result(c, rules, optimizer_rules)
    if isinstance(plan, PartitioningError):
        r.reason = f"rules: {plan}"
        return r
    if plan.errors:
        r.reason = f"indivisible: {plan.errors[0]}"
        return r
    why = unpriced(c, hw)
    if why:
        r.reason = why
        return r
    tot = plan.totals
    r.state = {k: float(tot[k]["per_device"]) for k in ("params", "optimizer", "gradients")}
    tokens = token_axes(rules, c.sizes, w)
    frozen = frozenset(frozen) | plan.frozen
    attention = attention_kind(w, hw)
    cast = 0 if hw.measured else w.compute_bytes  # XLA:CPU gathers the params' dtype; accelerators the compute's
    r.activations = activation_bytes(
        w,
        rules,
        c.sizes,
        remat=c.remat or "none",
        micro_batch=w.batch // c.grad_accum,
        gathered_layer_bytes=_gathered_layer_bytes(plan, tokens, w.layers // c.stages, cast),
        gathered_grad_bytes=_largest_gathered(plan, tokens),
        grad_bytes=r.state["gradients"],
        grad_accum=c.grad_accum,
        stages=c.stages,
        microbatches=c.microbatches,
        repeats=c.repeats,
        context=c.context,
        attention=attention,
    )
    # Offloaded state is on the device only where the step uses it: the larger of the passes (with the
    # activations) and the update.
    host_act = r.activations.pop("host", 0.0)
    split = state_split(r.state["params"], r.state["optimizer"], r.state["gradients"], c.offload, c.offload_update)
    r.peak = max(split["passes"] + r.activations["total"], split["update"])
    r.host = host_bytes(c, r.state, host_act)
    parallel = (
        costs_from_records(
            _records_for(records, rules, c), c.sizes, passes=c.grad_accum, stage_weight_bytes=stacked_bytes(plan.params)
        )
        if records
        else None
    )
    # On a cluster (more devices than a node holds) each placement of the axes on nodes is priced; the fastest
    # is kept (jax.make_mesh's own, tried first, unless another is faster by more than 0.1%).
    spots: list[dict[str, int] | None] = (
        [dict(c.nodes)] if c.nodes is not None else list(placements(c.sizes, hw.node_size))
    ) or [None]
    for spot in spots:
        est = analytic_estimate(
            plan.params,
            r.state,
            c.sizes,
            rules,
            w,
            hw,
            remat=c.remat or "none",
            grad_accum=c.grad_accum,
            flops_total=(flops or {}).get(c.remat or "none"),
            temp_bytes=r.activations["total"],
            parallel=parallel,
            context=c.context,
            nodes=spot,
            frozen=frozen,
            recompute=recompute,
        )
        comm, other = host_transfers(c, r.state, host_act, hw)  # the host link, where offload uses it
        est.comm += comm
        est.other.update(other)
        if spot is not None:
            r.placements.append((spot, est.step_time))
        if r.analytic is None or est.step_time < r.analytic.step_time * 0.999:
            r.analytic = est
            r.candidate = dataclasses.replace(c, nodes=tuple(spot.items()) if spot is not None else c.nodes)
    r.placements.sort(key=lambda p: (p[0] != dict(r.candidate.nodes or ()), p[1]))
    if r.peak > budget:
        r.reason = (
            f"memory: needs {fmt_bytes(r.peak)} per device (estimate), more than the budget of {fmt_bytes(budget)}"
        )
    elif hw.host_memory and r.host > hw.host_memory:
        r.reason = (
            f"host memory: needs {fmt_bytes(r.host)} per device (estimate), more than the "
            f"{fmt_bytes(hw.host_memory)} of host memory a {hw.name} has per device"
        )
    return r


__all__ = ["price"]
