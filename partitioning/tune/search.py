"""The search: price every candidate, reject what does not fit (with the reason), rank the rest.

For each :class:`~partitioning.tune.space.Candidate`:

1. the plan (:func:`partitioning.plan.build_plan`, once per mesh and table):
   exact per-device bytes of params, gradients and optimizer state, and the
   dimensions the rules cannot split (rejected when the train step would refuse them);
2. the activation estimate (:func:`partitioning.tune.workload.activation_bytes`);
   the peak is state + activations, rejected above the budget;
3. the analytic step time (:func:`partitioning.tune.cost.analytic_estimate`);
   with pipeline stages or expert layers (``records`` of one traced forward
   pass, :func:`partitioning.parallel.trace.recording`), their collectives and
   the bubble from :func:`partitioning.plan.parallel.costs_from_records`.

A layout that does not fit its device memory is priced again with its
optimizer state in host memory (``train.offload: [optimizer]``, updated on the
device and on the host: :mod:`partitioning.tune.host` prices the host link),
when the hardware profile gives the link's bandwidth.

The fitting candidates are ranked by estimated step time (then peak memory).
:meth:`Search.add_compiled` folds in a compiled view of a finalist: XLA's
memory replaces the estimate (a finalist that does not fit is rejected) and the
compiled step's ops and collectives replace the analytic terms. When nothing
fits, :meth:`Search.nothing_fits` says which budget would and what takes the room.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
    >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
    >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
    >>> from partitioning.tune.search import search
    >>> h100 = pt.tune.hardware("h100")
    >>> s = search(params, opt_state, {"fsdp": pt.Rules.preset("fsdp")}, 8, w, h100, budget=80 * 2**30)
    >>> s.ranked[0].candidate.label, s.ranked[0].estimate.step_time > 0
    ('...', True)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from partitioning.errors import PartitioningError
from partitioning.fmt import fmt_bytes
from partitioning.plan.compiled import normalize_spec
from partitioning.plan.plan import Plan, build_plan
from partitioning.rules import Rules
from partitioning.tune.compiled import compiled_estimate
from partitioning.tune.hardware import Hardware
from partitioning.tune.price import price
from partitioning.tune.space import Candidate, Result, candidates, zero1_rules
from partitioning.tune.workload import Workload

OFFLOAD_UPDATES = ("device", "host")  # the offloaded candidates of a layout that does not fit
REMAT_ORDER = {None: 0, "none": 0, "dots": 1, "dots_no_batch": 2, "offload": 3, "full": 4}


@dataclasses.dataclass
class Search:
    """All candidates priced for one workload, hardware and budget (:func:`search`'s answer).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> w = pt.tune.workload(pt.build_plan(params, opt_state, {"data": 8}, "dp").params, batch_size=32, seq_len=128)
        >>> tables, h100 = {"fsdp": pt.Rules.preset("fsdp")}, pt.tune.hardware("h100")
        >>> s = pt.tune.search(params, opt_state, tables, 8, w, h100, budget=80 * 2**30)
        >>> best = s.ranked[0]                       # a Result: its Candidate, memory and Estimate
        >>> best.candidate.rules_name, best.fits, best.estimate.source, best.estimate.step_time > 0
        ('fsdp', True, '...', True)
    """

    results: list[Result]
    hardware: Hardware
    budget: int
    workload: Workload
    devices: int
    seconds: float = 0.0
    duplicates: int = 0  # layouts equal to an earlier one once size-1 axes are dropped

    @property
    def calibration(self) -> float:
        """The median compiled / analytic step-time ratio over the compiled layouts (1 before any compile)."""
        ratios = sorted(
            r.compiled.step_time / r.analytic.step_time
            for r in self.results
            if r.compiled and r.analytic and r.analytic.step_time > 0
        )
        return ratios[len(ratios) // 2] if ratios else 1.0

    @property
    def ranked(self) -> list[Result]:
        """Fitting candidates, fastest first; within 0.1% of each other the simpler layout first
        (fewer micro-batches, no ZeRO-1, no offload, less recomputation), then the smaller peak."""
        fit = [r for r in self.results if r.fits]
        if not fit:
            return []
        best = max(min(r.step_time for r in fit), 1e-12)

        def key(r: Result) -> tuple:
            c = r.candidate
            return (
                round(r.step_time / best, 3),
                c.grad_accum,
                c.microbatches,
                c.repeats,
                c.zero1,
                len(c.offload),
                REMAT_ORDER.get(c.remat, 0),
                r.peak,
            )

        return sorted(fit, key=key)

    @property
    def rejected(self) -> list[Result]:
        return [r for r in self.results if not r.fits]

    @property
    def best(self) -> Result | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def add_compiled(self, result: Result, view: Mapping[str, Any]) -> None:
        """Folds a compiled view into ``result``: XLA's peak and, from its ops, the compiled estimate."""
        result.compiled_view = dict(view)
        if view.get("status") != "ok":
            return
        mem = view.get("memory")
        if mem:
            result.peak, result.peak_source = float(mem["peak_estimate"]), "compiled"
            if result.peak > self.budget:
                result.reason = (
                    f"memory (compiled): needs {fmt_bytes(result.peak)} per device, "
                    f"more than the budget of {fmt_bytes(self.budget)}"
                )
        if view.get("cost_ops") is not None:
            result.compiled = compiled_estimate(
                view["cost_ops"],
                view.get("collective_ops", []),
                result.candidate.sizes,
                self.hardware,
                model_flops=self.workload.flops_per_step("none")["model"],
                temp_bytes=float((mem or {}).get("temp", 0)),
                analytic=result.analytic,
                nodes=dict(result.candidate.nodes) if result.candidate.nodes else None,
            )
            scale = self.calibration
            for r in self.results:
                r.scale = scale

    def nothing_fits(self) -> str:
        """Why no candidate fits, and the budget that would fit the smallest."""
        priced = [r for r in self.results if r.peak > 0]
        if not priced:
            reasons = sorted({r.reason.split(":")[0] for r in self.results if r.reason})
            return f"no layout of {self.devices:,} devices can run this config ({', '.join(reasons)}): " + (
                (self.results[0].reason or "") if self.results else "no candidates"
            )
        small = min(priced, key=lambda r: r.peak)
        top = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in _largest(small))
        return (
            f"no layout of {self.devices:,} devices fits {fmt_bytes(self.budget)} per device: the smallest peak, "
            f"{fmt_bytes(small.peak)} ({small.peak_source}), is {small.candidate.label}; largest: {top}; "
            f"a budget of {fmt_bytes(small.peak)} (--device-memory {_size_flag(small.peak)}) would fit it, "
            f"or use more devices"
        )

    def to_json(self) -> dict[str, Any]:
        ranked = self.ranked
        return {
            "devices": self.devices,
            "hardware": self.hardware.to_json(),
            "budget_bytes": self.budget,
            "workload": dataclasses.asdict(self.workload),
            "search_s": round(self.seconds, 3),
            "candidates": len(self.results),
            "fitting": len(ranked),
            "duplicates": self.duplicates,
            "calibration": self.calibration,
            "ranked": [r.to_json() for r in ranked],
            "rejected": [r.to_json() for r in self.rejected],
        }


def _size_flag(n: float) -> str:
    """A size at least ``n`` bytes, written for ``--device-memory`` (``93.2GiB``)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{math.ceil(n / size * 10) / 10:g}{unit}"
    return f"{math.ceil(n)}B"


def _largest(r: Result) -> list[tuple[str, float]]:
    parts = [
        ("params", r.state.get("params", 0)),
        ("optimizer state", r.state.get("optimizer", 0)),
        ("gradients", r.state.get("gradients", 0)),
    ]
    parts += [(f"activations ({k})", v) for k, v in r.activations.items() if k != "total" and v]
    return sorted(parts, key=lambda kv: -kv[1])[:3]


def _layout_key(plan: Plan, rules: Rules, c: Candidate) -> tuple:
    """What a layout does, with size-1 mesh axes dropped: the same key is the same program.

    The sizes of the other axes are part of it: ``{data: 2, fsdp: 4}`` and
    ``{data: 4, fsdp: 2}`` give the same specs but different programs.
    """
    sizes = plan.mesh
    specs = tuple((leaf.path, normalize_spec(leaf.spec, sizes)) for leaf in plan.params + plan.opt_state)
    acts = tuple(normalize_spec(rules.resolve(names), sizes) for names in _ACTIVATIONS)
    used = tuple(sorted((a, n) for a, n in sizes.items() if n > 1))
    piped = (c.microbatches, c.repeats) if c.stages > 1 else (1, 1)
    return (c.remat, c.grad_accum, piped, used, specs, acts)


_ACTIVATIONS = (
    ("batch", "length", "embed"),
    ("batch", "length", "mlp"),
    ("batch", "length", "heads", "kv"),
    ("batch", "length", "kv_heads", "kv"),
    ("batch", "length", "vocab"),
)


def search(
    params: Any,
    opt_state: Any,
    tables: Mapping[str, Rules],
    devices: int,
    w: Workload,
    hw: Hardware,
    budget: int,
    *,
    remats: Sequence[str | None] = (None,),
    max_grad_accum: int = 16,
    activations: Mapping[str, set] | None = None,
    on_indivisible: str = "error",
    flops: Mapping[str, Mapping[str, float]] | None = None,
    records: Sequence[Mapping[str, Any]] = (),
    model_axes: Sequence[str] = (),
    frozen: Collection[str] = (),
) -> Search:
    """Prices every candidate (see the module docstring). ``params`` / ``opt_state``: the boxed abstract state.

    ``activations``: per table, the activation name tuples (so rule coverage is
    right); ``flops``: per remat policy, whole-step FLOPs to use instead of the
    analytic count (e.g. from a compiled step); ``records``: one traced forward
    pass's layer stacks and expert layers at the full batch, unpipelined
    (:func:`partitioning.parallel.trace.recording`), which adds ``stage``
    candidates (split of the stacked layers) and the pipeline / expert costs;
    ``model_axes``: mesh axes the model names directly, present in every candidate mesh;
    ``frozen``: paths (without ``params/``) of params that do not train (no gradient priced).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
        >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
        >>> s = pt.tune.search(params, opt_state, {"fsdp": pt.Rules.preset("fsdp")}, 8, w, pt.tune.hardware("h100"),
        ...                       budget=400 * 2**10, remats=("none", "full"))   # a 400 KiB device
        >>> [r.candidate.label for r in s.ranked[:2]]
        [...]
        >>> s.rejected[0].reason
        '...'
    """
    t0 = time.perf_counter()
    rejected: list[tuple[Candidate, str]] = []
    layers = next((int(r["layers"]) for r in records if r["kind"] == "pipeline"), 0)
    cands = candidates(
        devices,
        tables,
        batch_size=w.batch,
        remats=remats,
        max_grad_accum=max_grad_accum,
        layers=layers,
        rejected=rejected,
        model_axes=model_axes,
        seq_len=w.seq_len,
    )
    results = [Result(c, tables[c.rules_name], None, reason=why) for c, why in rejected]
    plans: dict[tuple, Plan | PartitioningError] = {}
    seen: set[tuple] = set()
    duplicates = 0
    for c in cands:
        rules = tables[c.rules_name]
        opt_rules = zero1_rules(rules) if c.zero1 else None
        key = (c.mesh, c.rules_name, c.zero1)
        if key not in plans:
            try:
                plans[key] = build_plan(
                    params,
                    opt_state,
                    c.sizes,
                    rules,
                    optimizer_rules=opt_rules,
                    on_indivisible=on_indivisible,
                    activations=(activations or {}).get(c.rules_name, ()),
                    frozen=frozen,
                )
            except PartitioningError as e:
                plans[key] = e
        plan = plans[key]
        if not isinstance(plan, PartitioningError) and not plan.errors:
            key = _layout_key(plan, rules, c)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
        kw: dict[str, Any] = {"optimizer_rules": opt_rules, "plan": plan, "flops": flops, "records": records}
        results.append(price(params, opt_state, c, rules, w, hw, budget, **kw))
        # A layout its device memory cannot hold may fit with the optimizer state in host memory.
        if (results[-1].reason or "").startswith("memory") and hw.host_bandwidth and opt_state is not None:
            for update in OFFLOAD_UPDATES:
                off = dataclasses.replace(c, offload=("optimizer",), offload_update=update)
                results.append(price(params, opt_state, off, rules, w, hw, budget, **kw))
    return Search(results, hw, int(budget), w, devices, time.perf_counter() - t0, duplicates)


__all__ = ["Result", "Search", "search", "price"]
