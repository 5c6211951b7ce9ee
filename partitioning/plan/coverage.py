"""Rule coverage: which logical names a model uses, which rules claim them, which never fire.

Counted over parameters *and* activations. Activations are found by tracing a
forward pass (``jax.eval_shape``, nothing runs) while recording every name
tuple resolved (:mod:`partitioning.context`), so every constraint — the
toolkit's ``with_logical_constraint`` or Flax's own ``nn.with_logical_constraint``
— reports the names it was called with.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> model = GPT(embed=64, mlp=128, layers=4)
    >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=16)
    >>> from partitioning.plan.coverage import rule_coverage
    >>> mesh = {"data": 1, "fsdp": 8}
    >>> acts = pt.plan.activation_names(model, params, mesh, "fsdp", batch_size=8, seq_len=64)
    >>> cov = rule_coverage(pt.tree_layouts(params, mesh, "fsdp"), pt.Rules.preset("fsdp"), acts)
    >>> cov.uncovered, [u.index for u in cov.unused]   # fsdp's fallbacks found every array split: not reported
    (['heads', 'kv', 'kv_heads', 'layers', 'length'], [])
    >>> mine = pt.Rules([("batch", ("data", "fsdp")), ("embed", "fsdp"), ("mlp", "fsdp")])  # a table you wrote
    >>> [u.rule for u in rule_coverage(pt.tree_layouts(params, mesh, mine), mine, acts).unused]
    [['mlp', 'fsdp']]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from partitioning.boxes import unbox
from partitioning.context import axis_rules, recording
from partitioning.data.batch import batch_shapes, stream_keys
from partitioning.layout import LeafLayout
from partitioning.mesh import abstract_mesh
from partitioning.model.interface import as_model
from partitioning.model.task import as_task, model_inputs
from partitioning.resolve import axes_tuple, mesh_axis_sizes
from partitioning.rules import as_rules


@dataclasses.dataclass(frozen=True)
class UnusedRule:
    """A rule that claims no dimension of any parameter or activation."""

    index: int
    rule: list[Any]
    origin: str


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Logical names seen, rules that fired, names no rule mentions, rules that never fire."""

    names: frozenset[str]
    fired: frozenset[int]
    uncovered: list[str]
    unused: list[UnusedRule]


def rule_coverage(
    layouts: Sequence[LeafLayout], rules: Any, activations: Iterable[tuple[Any, ...]] = (), mesh: Any = None
) -> Coverage:
    """Coverage of ``rules`` over parameter ``layouts`` and activation name tuples.

    With ``mesh`` (a Mesh or ``{axis: size}``), names that are its axes are
    mesh-axis names, not logical names missing a rule.

    Example::

        >>> from partitioning.plan.coverage import rule_coverage
        >>> rules = pt.Rules([("embed", "fsdp"), ("mlp", "fsdp")])
        >>> w = pt.LogicallyPartitioned(jax.ShapeDtypeStruct((64, 256), jnp.float32), ("embed", "mlp"))
        >>> rule_coverage(pt.tree_layouts({"w": w}, {"fsdp": 8}, rules), rules).unused   # fsdp is taken by embed
        [UnusedRule(index=1, rule=['mlp', 'fsdp'], origin='rules[1]')]
    """
    rules = as_rules(rules)
    sizes = mesh_axis_sizes(mesh) or None
    dims = [d for layout in layouts for d in layout.dims]
    for names in activations:
        dims += rules.explain(names, mesh=sizes)
    names_used = frozenset(d.name for d in dims if isinstance(d.name, str))
    fired = frozenset(d.rule_index for d in dims if d.rule_index is not None)
    known = set(rules.logical_names)
    followed = {n for n in names_used if rules.follows.get(n) in known}
    uncovered = sorted(names_used - known - followed - set(sizes or ()))
    unused = [
        UnusedRule(i, [r[0], list(r[1]) if isinstance(r[1], tuple) else r[1]], rules.origins[i])
        for i, r in enumerate(rules)
        if i not in fired and not _quiet(rules, i, dims)
    ]
    return Coverage(names_used, fired, uncovered, unused)


def _quiet(rules: Any, i: int, dims: Sequence[Any]) -> bool:
    # Not the user's table: a preset's "never split" rule (`[lora, null]`: LoRA's rank axis) changes no layout
    # where nothing has the name, and a preset's fallback (fsdp's `[vocab, fsdp]`, for an array without an
    # `embed` dimension) that found its axis taken on every array it met did its job: the array was already
    # split. Neither is worth a warning on every model; a rule the user wrote still is.
    name, axes = rules[i]
    if not rules.origins[i].startswith("presets/"):
        return False
    met = [d for d in dims if d.name == name]
    taken = f"skipped rule {i} "
    return axes is None or (
        bool(met) and all(any(n.startswith(taken) and "already used by dim" in n for n in d.notes) for d in met)
    )


def unused_mesh_axes(
    mesh: Any, rules: Any, layouts: Iterable[LeafLayout] = (), optimizer_rules: Any = None
) -> list[str]:
    """Mesh axes of size > 1 that nothing uses: every device along them would repeat the same work.

    An axis is used when a rule of ``rules`` or ``optimizer_rules`` names it (as
    a target or in ``batch_axes``) or a layout's spec holds it (a model that
    annotates with mesh-axis names). Size-1 axes are never reported.

    Example::

        >>> from partitioning.plan.coverage import unused_mesh_axes
        >>> unused_mesh_axes({"data": 1, "fsdp": 4, "tensr": 2}, "fsdp")
        ['tensr']
    """
    named: set[str] = set()
    for table in (rules, optimizer_rules):
        if table is None:
            continue
        table = as_rules(table)
        named |= {a for _, axes in table for a in axes_tuple(axes)} | set(table.batch_axes)
    for layout in layouts:
        for entry in layout.spec:
            named |= set(axes_tuple(entry))
    return [a for a, n in mesh_axis_sizes(mesh).items() if n > 1 and a not in named]


def activation_names(
    model: Any,
    params: Any,
    mesh: Any,
    rules: Any,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    batch: Any = None,
    task: Any = None,
    collections: Any = None,
    axis_types: Any = None,
) -> set[tuple[Any, ...]]:
    """Logical names of every constraint in a forward pass (traced only, nothing runs).

    Constraints made with the toolkit's ``with_logical_constraint`` and with
    Flax's own (``nn.with_logical_constraint``, boxes, NNX variables) are all
    seen (:func:`partitioning.context.recording`). The pass is traced on an
    abstract ``mesh`` with its own axis types (a Mesh) or ``axis_types``
    (``"auto"`` by default for a ``{axis: size}`` mapping, ``"explicit"``).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> model = GPT(embed=64, mlp=128, layers=4)
        >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=16)
        >>> acts = pt.plan.activation_names(model, params, {"data": 1, "fsdp": 8}, "fsdp", batch_size=8, seq_len=64)
        >>> ("batch", "length", "embed") in acts
        True
    """
    abstract = abstract_mesh(mesh, axis_types)
    rules = as_rules(rules).validate(mesh_axis_sizes(abstract))
    adapter = as_model(model)
    batch = batch_shapes(batch, batch_size, seq_len, "activation_names")
    args, kwargs = model_inputs(as_task(task), batch)
    variables = {"params": unbox(params), **unbox(collections or {})}
    rngs = stream_keys(0, 0, ("dropout",))
    with recording() as seen, jax.sharding.use_abstract_mesh(abstract), axis_rules(rules):
        jax.eval_shape(lambda v, a, kw: adapter.apply(v, a, kw, rngs=rngs, train=True), variables, args, kwargs)
    if rules.declared_batch_axes is None:
        # The input batch itself is laid out by the `batch` rules (dim 0 of every leaf).
        seen |= {("batch",) + (None,) * (len(x.shape) - 1) for x in jax.tree.leaves(batch) if len(x.shape)}
    return seen


__all__ = ["Coverage", "UnusedRule", "rule_coverage", "activation_names", "unused_mesh_axes"]
