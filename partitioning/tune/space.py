"""The search space: every layout the tuner prices for a device count.

A :class:`Candidate` is a mesh (a factorization of the devices over the axes
its rule table uses), a rule table (the presets and the config's own), ZeRO-1
(the optimizer state also split over ``data`` when ``data`` only splits the
batch), a remat policy (when the model has a ``remat`` option), a number of
micro-batches (gradient accumulation) and, with a ``stage`` axis, the
pipeline's micro-batches ``M`` (``S, 2S, 4S, 8S``: the bubble
``(S-1)/(M+S-1)`` against smaller matmuls) and repeats ``R`` (1: GPipe; 2, 4:
the circular schedule, bubble ``(S-1)/(R M+S-1)`` against more shifts and
the weights regrouped). Candidates whose batch or layers
cannot be split as asked are rejected here, with the reason; the rest are
priced by :mod:`partitioning.tune.search`.

Example::

    >>> from partitioning.tune.space import candidates
    >>> cands = candidates(8, {"fsdp": pt.Rules.preset("fsdp")}, batch_size=32, remats=("none", "full"))
    >>> len(cands), cands[0].label
    (..., 'fsdp {data: 1, fsdp: 8} remat none')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.fmt import fmt_mesh
from partitioning.resolve import axes_tuple
from partitioning.rules import Rules
from partitioning.tune.cost import Estimate

# Mesh order, outermost first: pipeline stages across hosts, tensor parallelism on the fastest links.
AXES = ("stage", "data", "fsdp", "context", "expert", "tensor")
CONTEXT_STRATEGIES = ("all_gather", "ring")  # attention over a split `length` (partitioning.parallel.context)
PIPELINE_MICROBATCHES = (1, 2, 4, 8)  # M / S
PIPELINE_REPEATS = (1, 2, 4)  # R: chunks of layers per stage
# Large dimensions only: a ZeRO-1 split that does not divide would make the train step refuse the layout.
ZERO1_RULES = [["embed", "data"], ["mlp", "data"], ["vocab", "data"]]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout: mesh, rule table, ZeRO-1, remat, micro-batches (accumulated; pipelined).

    Example::

        >>> c = pt.tune.Candidate((("data", 2), ("fsdp", 4)), "fsdp", zero1=True)
        >>> c.label, c.stages
        ('fsdp +zero1 {data: 2, fsdp: 4}', 1)
    """

    mesh: tuple[tuple[str, int], ...]
    rules_name: str
    remat: str | None = None  # None: the model has no remat option
    grad_accum: int = 1
    zero1: bool = False
    microbatches: int = 1  # pipeline micro-batches (a `stage` axis of size > 1)
    repeats: int = 1  # pipeline repeats: chunks of layers per stage (circular for > 1)
    context: str | None = None  # ring | all_gather: attention over a `length` the mesh splits; None: not split
    # The axes that span nodes ({axis: nodes}, mesh.nodes): None until priced on a cluster, () on one node.
    nodes: tuple[tuple[str, int], ...] | None = None
    offload: tuple[str, ...] = ()  # state in host memory (train.offload)
    offload_update: str = "device"  # where an offloaded optimizer state is updated (train.offload_update)

    @property
    def stages(self) -> int:
        return dict(self.mesh).get("stage", 1)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def devices(self) -> int:
        return math.prod(s for _, s in self.mesh)

    @property
    def label(self) -> str:
        parts = [self.rules_name + (" +zero1" if self.zero1 else ""), fmt_mesh(self.mesh)]
        if self.remat is not None:
            parts.append(f"remat {self.remat}")
        if self.grad_accum > 1:
            parts.append(f"x{self.grad_accum} micro-batches")
        if self.stages > 1:
            parts.append(f"M={self.microbatches}" + (f" R={self.repeats}" if self.repeats > 1 else ""))
        if self.context is not None:
            parts.append(f"attention {self.context}")
        if self.nodes:
            parts.append(f"nodes {fmt_mesh(self.nodes)}")
        if self.offload:
            host = " (update on host)" if "optimizer" in self.offload and self.offload_update == "host" else ""
            parts.append(f"offload {'+'.join(self.offload)}{host}")
        return " ".join(parts)

    def overrides(self, rules: Rules, optimizer_rules: Rules | None) -> list[str]:
        """``--set`` overrides that turn a run config into this layout."""
        sets = [
            "mesh.shape={" + ", ".join(f"{a}: {s}" for a, s in self.mesh) + "}",
            f"mesh.devices={self.devices}",
            f"rules={_flow(rules.to_config())}",
            f"optimizer_rules={_flow(optimizer_rules.to_config()) if optimizer_rules is not None else 'null'}",
            f"train.grad_accum={self.grad_accum}",
            f"train.microbatches={self.microbatches if self.stages > 1 else 'null'}",
            f"train.pipeline_repeats={self.repeats if self.stages > 1 else 1}",
            f"mesh.nodes={fmt_mesh(self.nodes) if self.nodes else 'null'}",
        ]
        if self.remat is not None:
            sets.append(f"model.remat={self.remat}")
        if self.context is not None:
            sets.append(f"model.context_parallel={self.context}")
        sets.append(f"train.offload=[{', '.join(self.offload)}]")
        if self.offload:
            sets.append(f"train.offload_update={self.offload_update}")
        return sets

    def to_json(self) -> dict[str, Any]:
        return {
            "mesh": self.sizes,
            "rules": self.rules_name,
            "zero1": self.zero1,
            "remat": self.remat,
            "grad_accum": self.grad_accum,
            "microbatches": self.microbatches,
            "repeats": self.repeats,
            "context": self.context,
            "nodes": dict(self.nodes) if self.nodes else None,
            "offload": list(self.offload),
            "offload_update": self.offload_update,
            "label": self.label,
        }


def _flow(pairs: Any) -> str:
    """YAML flow style for a rule table's config form (pairs, or a mapping with extra / batch_axes / follows)."""

    def one(x):
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}: {one(v)}" for k, v in x.items()) + "}"
        return "null" if x is None else "[" + ", ".join(one(y) for y in x) + "]" if isinstance(x, list) else str(x)

    return one(pairs)


def length_axes(rules: Rules) -> tuple[str, ...]:
    """The mesh axes a rule table splits the activations' ``length`` over."""
    spec = rules.resolve(("batch", "length"))
    return axes_tuple(spec[1]) if spec is not None and len(spec) > 1 else ()


def table_axes(rules: Rules) -> list[str]:
    """The mesh axes a rule table names, in the canonical order (:data:`AXES`, then others)."""
    named = {a for _, axes in rules for a in axes_tuple(axes)} | set(rules.declared_batch_axes or ())
    return [a for a in AXES if a in named] + sorted(named - set(AXES))


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every ``k``-tuple of positive integers whose product is ``n``."""
    if k == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, k - 1)]


def zero1_rules(rules: Rules) -> Rules:
    """The optimizer-state table of ZeRO-1: the params' table, with what is left split over ``data``."""
    return rules + Rules(ZERO1_RULES)


def batch_shards(rules: Rules, sizes: Mapping[str, int]) -> int:
    return math.prod(sizes.get(a, 1) for a in rules.batch_axes)


def candidates(
    devices: int,
    tables: Mapping[str, Rules],
    *,
    batch_size: int,
    remats: Sequence[str | None] = (None,),
    max_grad_accum: int = 16,
    layers: int = 0,
    rejected: list[tuple[Candidate, str]] | None = None,
    model_axes: Sequence[str] = (),
    seq_len: int = 0,
) -> list[Candidate]:
    """Every layout of ``devices`` over the rule ``tables`` (see the module docstring).

    Example::

        >>> layouts = pt.tune.candidates(8, {"fsdp": pt.Rules.preset("fsdp")}, batch_size=8)
        >>> [c.label for c in layouts][:3]
        ['fsdp {data: 1, fsdp: 8}', 'fsdp {data: 2, fsdp: 4}', 'fsdp +zero1 {data: 2, fsdp: 4}']

    ``model_axes``: mesh axes the model names directly (mesh-axis names, e.g.
    ``einsum(..., out_sharding=P('fsdp', ...))``): every mesh has them, so the
    model traces on every candidate.

    Layouts whose batch does not split (``batch_size / grad_accum`` not a
    multiple of the batch shards, or of the pipeline micro-batches times
    them), whose ``layers`` (the stacked layer count) do not split into the
    ``stage`` axis or whose ``seq_len`` does not split over the axes ``length``
    takes go to ``rejected`` with the reason. A layout that splits ``length`` is
    priced with each attention strategy (:data:`CONTEXT_STRATEGIES`).
    """
    out = []
    for name, rules in tables.items():
        seq_axes = length_axes(rules)
        axes = table_axes(rules)
        if "data" not in axes:
            axes = ["data", *axes]
        axes += [a for a in model_axes if a not in axes]
        for sizes_t in factorizations(devices, len(axes)):
            sizes = dict(zip(axes, sizes_t, strict=True))
            mesh = tuple(sizes.items())
            shards = batch_shards(rules, sizes)
            stages = sizes.get("stage", 1)
            # A table that splits nothing over `data` keeps it for the batch only: ZeRO-1 is an option.
            param_axes = {a for n, ax in rules if n != "batch" for a in axes_tuple(ax)}
            zero1s = (False, True) if sizes["data"] > 1 and "data" not in param_axes else (False,)
            if stages > 1 and (not layers or layers % stages):
                if rejected is not None:
                    why = (
                        f"stages: {layers} stacked layers do not split into {stages} stages"
                        if layers
                        else "stages: the model has no stacked `layers` axis to split into pipeline stages"
                    )
                    rejected.append((Candidate(mesh, name, remats[0], 1, False, stages), why))
                continue
            split = math.prod(sizes.get(a, 1) for a in seq_axes)
            contexts: tuple[str | None, ...] = CONTEXT_STRATEGIES if split > 1 else (None,)
            if split > 1 and seq_len and seq_len % split:
                if rejected is not None:
                    why = f"length: {seq_len} tokens do not split over the {split} devices of {', '.join(seq_axes)}"
                    rejected.append((Candidate(mesh, name, remats[0], 1, False, context=contexts[0]), why))
                continue
            g = 1
            while g <= max_grad_accum and batch_size % g == 0:
                rows = batch_size // g
                ms = [stages * k for k in PIPELINE_MICROBATCHES] if stages > 1 else [1]
                for zero1 in zero1s:
                    for remat in remats:
                        fits = [m for m in ms if rows % m == 0 and (rows // m) % shards == 0]
                        if not fits:
                            if rejected is not None and g == 1:
                                what = (
                                    f"the {shards} batch shards"
                                    if stages == 1
                                    else f"{stages} pipeline micro-batches of {shards} batch shards"
                                )
                                rejected.append(
                                    (
                                        Candidate(mesh, name, remat, g, zero1, ms[0]),
                                        f"batch: {batch_size} sequences do not split over {what}",
                                    )
                                )
                            continue
                        rs = [r for r in PIPELINE_REPEATS if layers % (stages * r) == 0] if stages > 1 else [1]
                        out += [
                            Candidate(mesh, name, remat, g, zero1, m, r, ctx)
                            for m in fits
                            for r in rs
                            for ctx in contexts
                        ]
                g *= 2
    return out


@dataclasses.dataclass
class Result:
    """One priced candidate: memory, fit (or why not), estimate, and its compiled view when it has one.

    Example: see :class:`~partitioning.tune.search.Search`, whose ``ranked`` are Results.
    """

    candidate: Candidate
    rules: Rules
    optimizer_rules: Rules | None
    state: dict[str, float] = dataclasses.field(default_factory=dict)
    activations: dict[str, float] = dataclasses.field(default_factory=dict)
    peak: float = 0.0
    host: float = 0.0  # bytes per device in host memory (offloaded state and activations)
    peak_source: str = "estimate"
    reason: str | None = None
    analytic: Estimate | None = None
    compiled: Estimate | None = None
    compiled_view: dict[str, Any] | None = None
    scale: float = 1.0  # analytic estimates: times the compiled / analytic ratio of compiled layouts
    # Every placement of the mesh on nodes that was priced ({axis: nodes}, analytic step time), the chosen first.
    placements: list[tuple[dict[str, int], float]] = dataclasses.field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.reason is None

    @property
    def estimate(self) -> Estimate | None:
        return self.compiled or self.analytic

    @property
    def step_time(self) -> float:
        if self.compiled:
            return self.compiled.step_time
        return self.analytic.step_time * self.scale if self.analytic else math.inf

    def to_json(self) -> dict[str, Any]:
        view = self.compiled_view or {}
        return {
            **self.candidate.to_json(),
            "rules_table": self.rules.to_list(),
            "optimizer_rules": self.optimizer_rules.to_list() if self.optimizer_rules is not None else None,
            "step_time_s": self.step_time,
            "placements": [{"nodes": n, "step_time_s": t} for n, t in self.placements],
            "analytic_scale": self.scale if not self.compiled else 1.0,
            "state_bytes": self.state,
            "activation_bytes": self.activations,
            "peak_bytes": self.peak,
            "host_bytes": self.host,
            "peak_source": self.peak_source,
            "fits": self.fits,
            "reason": self.reason,
            "estimate": self.estimate.to_json() if self.estimate else None,
            "analytic": self.analytic.to_json() if self.analytic else None,
            "compiled": (
                {
                    "status": view.get("status"),
                    "reason": view.get("reason"),
                    "memory": view.get("memory"),
                    "collectives": view.get("collectives"),
                    "compile_s": view.get("compile_s"),
                }
                if self.compiled_view
                else None
            ),
        }


__all__ = [
    "Candidate",
    "Result",
    "candidates",
    "factorizations",
    "table_axes",
    "zero1_rules",
    "batch_shards",
    "AXES",
    "PIPELINE_MICROBATCHES",
    "PIPELINE_REPEATS",
]
