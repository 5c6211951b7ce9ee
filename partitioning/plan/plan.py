"""The plan: every array's layout and per-device memory, before anything is allocated.

Input is abstract (``jax.eval_shape`` of the init: boxed params and optimizer
state) and a mesh — a real ``Mesh``, an ``AbstractMesh`` or just
``{axis: size}``, so a 16384-device mesh is planned without any device.
Output is a :class:`Plan`: one :class:`~partitioning.shardings.LeafLayout` per array, totals per
device for params, optimizer state and gradients beside the ideal ``total / devices``, and warnings:

- the largest parameters left fully replicated (with their gradient and optimizer state, what each costs per
  device and its share of the total);
- logical names the model uses that no rule mentions (those dimensions are unsharded);
- rules that never claim a dimension of any parameter or activation;
- mesh axes that split no parameter (pure data parallelism over them: the state is copied across the axis —
  by design for a ``data`` axis, a mistake for one meant to shard);
- dimensions the rules could not split (indivisible sizes) — errors when
  ``on_indivisible='error'``, since the train step would refuse them.

Gradients are laid out like the params (the train step's reduction produces them in the params' shardings) and cost
what they cost — trainable ones only: a ``frozen`` param (:mod:`partitioning.finetune.trainable`) costs its stored
bytes, no gradient or optimizer state. The totals split ``params`` into ``trainable`` and ``frozen``.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
    ...                                             batch_size=8, seq_len=16)
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 8}, "fsdp")
    >>> plan.totals["params"]["per_device"], plan.totals["params"]["ideal"]   # bytes per device
    (98592, 98592.0)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from jax.sharding import PartitionSpec

from partitioning.finetune.quantize import weight_counts
from partitioning.fmt import fmt_bytes, fmt_rule, fmt_spec
from partitioning.layout import LeafLayout, name_failures, tree_layouts
from partitioning.mesh import MeshSpec
from partitioning.plan.axes import memory_by_axis
from partitioning.plan.coverage import UnusedRule, rule_coverage
from partitioning.plan.memory_kinds import per_array, state_split
from partitioning.plan.waste import IdleAxis, Replicated, idle_axes, replicated_params
from partitioning.resolve import REMEDY, IndivisibleWarning, mesh_axis_sizes
from partitioning.rules import Rules, as_rules

TOP_REPLICATED = 5
# A replicated parameter is worth a warning when it costs at least this share
# of a device's state memory; smaller ones (norm scales) are listed, not flagged.
REPLICATED_WARN_SHARE = 0.01
CATEGORIES = ("params", "optimizer", "gradients")


# -- the plan ----------------------------------------------------------------------


def _prefixed(layouts: list[LeafLayout], prefix: str) -> list[LeafLayout]:
    return [dataclasses.replace(leaf, path=f"{prefix}/{leaf.path}" if leaf.path else prefix) for leaf in layouts]


@dataclasses.dataclass
class Plan:
    """Per-array layouts, per-device totals and warnings for one mesh and rule table.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
        ...                                             batch_size=8, seq_len=16)
        >>> plan = pt.build_plan(params, opt_state, {"data": 2, "fsdp": 4}, "fsdp")
        >>> round(plan.totals["total"]["per_device"] / plan.totals["total"]["ideal"], 2)   # 2x the ideal
        2.0
        >>> plan.warnings()[0]
        "mesh axis 'data' (size 2) shards no parameter: params, gradients and optimizer state are replicated 2x ..."
    """

    mesh: dict[str, int]
    rules: Rules
    optimizer_rules: Rules
    on_indivisible: str
    params: list[LeafLayout]
    opt_state: list[LeafLayout]
    indivisible: list[str]
    uncovered_names: list[str]
    unused_rules: list[UnusedRule]
    replicated: list[Replicated]
    idle_axes: list[IdleAxis] = dataclasses.field(default_factory=list)
    # Analytic pipeline / expert costs (partitioning.plan.parallel), when the model has them.
    parallel: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Paths (without `params/`) of the frozen params: no gradient, no optimizer state.
    frozen: frozenset[str] = frozenset()
    # State kept in host memory (partitioning.train.offload) and where the optimizer update runs.
    offload: tuple[str, ...] = ()
    offload_update: str = "device"

    def trains(self, leaf: LeafLayout) -> bool:
        """Whether a param layout trains (has a gradient)."""
        return leaf.path[len("params/") :] not in self.frozen

    @property
    def trainable_params(self) -> list[LeafLayout]:
        return [leaf for leaf in self.params if self.trains(leaf)]

    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def num_params(self) -> int:
        return sum(weight_counts(self.params).values())  # a quantized base counts its float weights

    @property
    def active_params(self) -> int | None:
        """Parameters one token uses: each expert weight counts ``top_k / experts`` of itself (None without experts).

        An expert weight is a leaf with an ``expert`` axis before its last (``(expert, embed, mlp)``, GPT-OSS's
        biases ``(expert, mlp)`` / ``(expert, embed)``); a router ends with it (``(embed, expert)``, its bias
        ``(expert,)``: a score for every expert) and is used whole by every token.
        """
        experts = (self.parallel or {}).get("experts")
        if not experts:
            return None
        e, k = int(experts["experts"]), int(experts["top_k"])

        def used(leaf: LeafLayout) -> int:
            names = leaf.names or ()
            return leaf.size // e * k if "expert" in names[:-1] else leaf.size

        return sum(used(leaf) for leaf in self.params)

    @property
    def totals(self) -> dict[str, dict[str, float]]:
        """Per category: ``per_device`` bytes, ``total`` bytes and ``ideal`` = total / devices."""

        def cat(layouts):
            total = sum(leaf.nbytes for leaf in layouts)
            return {
                "per_device": sum(leaf.per_device_bytes for leaf in layouts),
                "total": total,
                "ideal": total / self.devices,
            }

        trainable = self.trainable_params
        out = {"params": cat(self.params), "optimizer": cat(self.opt_state), "gradients": cat(trainable)}
        out["total"] = {k: sum(out[c][k] for c in CATEGORIES) for k in ("per_device", "total", "ideal")}
        # The params again, split: not part of the total.
        out["trainable"] = cat(trainable)
        out["frozen"] = cat([leaf for leaf in self.params if not self.trains(leaf)])
        return out

    @property
    def memory_kinds(self) -> dict[str, dict[str, float]]:
        """The state per device by memory kind (``train.offload``), kept apart from :attr:`totals`.

        ``device``: ``per_device`` is the larger of ``passes`` (forward and backward) and ``update``;
        ``host``: ``per_device`` held in pinned host memory between steps.
        """
        totals = self.totals
        p, o, g = (totals[c]["per_device"] for c in CATEGORIES)
        split = state_split(p, o, g, self.offload, self.offload_update)
        return {
            "device": {"per_device": split["device"], "passes": split["passes"], "update": split["update"]},
            "host": {"per_device": split["host"]},
        }

    def memory_kind(self, leaf: LeafLayout) -> str:
        """Where an array of the state lives between steps: ``device`` or ``pinned_host`` (offloaded)."""
        name = "params" if leaf.path.startswith("params/") else "optimizer"
        return "pinned_host" if name in self.offload else "device"

    @property
    def replicated_share(self) -> float:
        """Share of a device's state bytes (params + grads + optimizer) in fully replicated arrays."""
        if self.devices == 1:
            return 0.0
        rep = sum(
            (1 + self.trains(leaf)) * leaf.per_device_bytes for leaf in self.params if leaf.replicated and leaf.size > 1
        )
        rep += sum(leaf.per_device_bytes for leaf in self.opt_state if leaf.replicated and leaf.size > 1)
        total = self.totals["total"]["per_device"]
        return rep / total if total else 0.0

    @property
    def errors(self) -> list[str]:
        """Problems that make the train step refuse this layout."""
        return list(self.indivisible) if self.on_indivisible == "error" else []

    def warnings(self) -> list[str]:
        """One line per warning, most expensive first."""
        out = []
        for r in self.replicated:
            if r.share >= REPLICATED_WARN_SHARE:
                out.append(
                    f"replicated: {r.path} {tuple(r.shape)} is whole on every device: "
                    f"{fmt_bytes(r.per_device_cost)} per device with its gradient and optimizer state "
                    f"({r.share:.1%} of per-device memory)"
                )
        for a in self.idle_axes:
            what = (
                "params and gradients (the optimizer state is sharded over it)"
                if a.shards_optimizer
                else "params, gradients and optimizer state"
            )
            out.append(
                f"mesh axis {a.axis!r} (size {a.size}) shards no parameter: {what} are replicated {a.size}x across it"
            )
        if self.devices > 1 and not self.rules.batch_axes:
            out.append(
                "the batch is not split: no rule maps 'batch' to a mesh axis and no batch_axes are "
                "declared, so every device computes the whole batch; add e.g. [batch, [data, fsdp]]"
            )
        if self.uncovered_names:
            out.append(
                "no rule mentions logical name(s) "
                + ", ".join(map(repr, self.uncovered_names))
                + ": those dimensions are unsharded"
            )
        for u in self.unused_rules:
            rule = f"rule {u.index} {fmt_rule(u.rule)}"
            out.append(f"{rule} never claims a dimension of any parameter or activation ({u.origin})")
        for msg in self.indivisible:
            if self.on_indivisible == "error":
                out.append(f"error: {msg}; {REMEDY}")
            else:
                out.append(f"indivisible: {msg}; falling back to the next rule or unsharded")
        return out

    def expected_specs(self) -> dict[str, Any]:
        """The spec the rules ask for each train-step input / output, by path (for the compiled self-check)."""
        specs: dict[str, Any] = {leaf.path: leaf.spec for leaf in self.params + self.opt_state}
        specs["step"] = PartitionSpec()
        specs["batch/inputs"] = specs["batch/targets"] = self.rules.batch_spec(2)
        return specs

    def rows(self, which: str = "params") -> list[dict[str, Any]]:
        layouts = self.params if which == "params" else self.opt_state
        return [{**_row(leaf), "memory_kind": self.memory_kind(leaf)} for leaf in layouts]

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (see the README for the keys)."""
        split = per_array(self) if self.offload else {}
        return {
            "mesh": dict(self.mesh),
            "devices": self.devices,
            "rules": self.rules.to_list(),
            "optimizer_rules": self.optimizer_rules.to_list(),
            "on_indivisible": self.on_indivisible,
            "parameters": self.num_params,
            "trainable_parameters": sum(leaf.size for leaf in self.trainable_params),
            "active_parameters": self.active_params,
            "leaves": [{**r, **_kinds(split.get(r["path"]))} for r in self.rows("params")],
            "optimizer_leaves": self.rows("optimizer"),
            "totals": self.totals,
            "memory_kinds": self.memory_kinds,
            "offload": {"state": list(self.offload), "update": self.offload_update},
            "replicated_share": self.replicated_share,
            "warnings": {
                "replicated": [dataclasses.asdict(r) for r in self.replicated],
                "uncovered_names": self.uncovered_names,
                "unused_rules": [dataclasses.asdict(u) for u in self.unused_rules],
                "indivisible": self.indivisible,
                "idle_axes": [dataclasses.asdict(a) for a in self.idle_axes],
                "messages": self.warnings(),
            },
            "errors": self.errors,
            "axes": memory_by_axis(self.params + self.opt_state, self.mesh),
            "parallel": dict(self.parallel),
        }


def _kinds(split: tuple[int, int] | None) -> dict[str, int]:
    # Offloaded: the param with its gradient and optimizer state, on the device and on the host.
    return {} if split is None else {"device_bytes": split[0], "host_bytes": split[1]}


def _row(leaf: LeafLayout) -> dict[str, Any]:
    claimed = []
    for d in leaf.dims:
        claimed.append(
            None if d.rule is None else {"rule": d.rule_index, "logical": d.rule[0], "mesh_axes": d.mesh_axes}
        )
    return {
        "path": leaf.path,
        "shape": list(leaf.shape),
        "dtype": str(leaf.dtype),
        "logical": None
        if leaf.names is None
        else [n if isinstance(n, str) or n is None else str(n) for n in leaf.names],
        "spec": fmt_spec(leaf.spec),
        "claimed_by": claimed,
        "per_device_bytes": leaf.per_device_bytes,
        "total_bytes": leaf.nbytes,
        "replicated": leaf.replicated,
        "named_by": leaf.named_by,  # the annotation row that named it, or None
    }


def _layouts(tree: Any, mesh: Any, rules: Rules, prefix: str, failed: dict[str, list[str]]) -> list[LeafLayout]:
    """Layouts with indivisible dimensions falling back, never raising; each failure's paths added to ``failed``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IndivisibleWarning)
        layouts = tree_layouts(tree, mesh, rules, on_indivisible="replicate", warn_replicated=False)
    for w in caught:
        if issubclass(w.category, IndivisibleWarning):
            path, why = str(w.message).split(": ", 1)
            paths = failed.setdefault(why.split("; falling back")[0], [])
            paths.extend([f"{prefix}/{path}"] if f"{prefix}/{path}" not in paths else [])
    return _prefixed(layouts, prefix)


def build_plan(
    params: Any,
    opt_state: Any,
    mesh: Any,
    rules: Any,
    *,
    optimizer_rules: Any = None,
    on_indivisible: str = "error",
    activations: Iterable[tuple[Any, ...]] = (),
    top: int = TOP_REPLICATED,
    parallel: dict[str, Any] | None = None,
    frozen: Iterable[str] = (),
    offload: Iterable[str] = (),
    offload_update: str = "device",
) -> Plan:
    """The plan for abstract (boxed) ``params`` and ``opt_state`` on ``mesh`` under ``rules``.

    ``mesh`` may be ``{axis: size}``. ``activations`` are the logical-name tuples
    the model constrains activations with (see :func:`activation_names`), so a
    ``batch`` rule is not reported as unused. ``parallel`` are the pipeline /
    expert costs (:func:`partitioning.plan.parallel.costs_from_records`).
    ``frozen`` are the paths (without ``params/``) of params that do not train
    (``trainer.frozen``): no gradient is priced for them. ``offload`` / ``offload_update``: the state kept in
    host memory and where its update runs (``train.offload``): see :attr:`Plan.memory_kinds`.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
        ...                                             batch_size=8, seq_len=16)
        >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 8}, "fsdp")
        >>> plan.errors, len(plan.params), plan.num_params
        ([], 12, 197184)
    """
    rules = as_rules(rules)
    opt_rules = as_rules(optimizer_rules) if optimizer_rules is not None else rules
    sizes = mesh_axis_sizes(mesh)
    rules.validate(sizes)
    opt_rules.validate(sizes)
    failed: dict[str, list[str]] = {}  # one line per failure, naming each parameter once (not per moment)
    p_layouts = _layouts(params, sizes, rules, "params", failed)
    o_layouts = _layouts(opt_state, sizes, opt_rules, "opt_state", failed)

    cov = rule_coverage(p_layouts + (o_layouts if opt_rules is rules else []), rules, activations, sizes)

    plan = Plan(
        mesh=dict(sizes),
        rules=rules,
        optimizer_rules=opt_rules,
        on_indivisible=on_indivisible,
        params=p_layouts,
        opt_state=o_layouts,
        indivisible=name_failures(failed),
        uncovered_names=cov.uncovered,
        unused_rules=cov.unused,
        replicated=[],
        parallel=dict(parallel or {}),
        frozen=frozenset(frozen),
        offload=tuple(offload),
        offload_update=offload_update,
    )
    plan.replicated = replicated_params(plan, top)
    plan.idle_axes = idle_axes(plan)
    return plan


def mesh_sizes(shape: Mapping[str, int], devices: int) -> dict[str, int]:
    """Concrete ``{axis: size}`` of an ordered mesh shape (one ``-1`` allowed) for ``devices``.

    Example::

        >>> from partitioning.plan.plan import mesh_sizes
        >>> mesh_sizes({"data": 1, "fsdp": -1}, 2048)
        {'data': 1, 'fsdp': 2048}
    """
    return MeshSpec.from_mapping(dict(shape)).resolve(devices)


__all__ = ["Plan", "Replicated", "IdleAxis", "build_plan", "mesh_sizes"]
