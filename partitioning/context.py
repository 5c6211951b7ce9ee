"""The rule context: one store (Flax's), and inside it Flax's own name resolution is the rule walk.

:func:`axis_rules`, :func:`set_logical_axis_rules` and
:func:`get_logical_axis_rules` (Flax's names and signatures) keep the table in
Flax's own thread-local store, holding a :class:`~partitioning.Rules` (a
tuple of pairs, so Flax reads it as is): Flax's and the toolkit's context
managers nest in any order and always agree.

Flax resolves logical names in three places:

- Linen's ``_logical_to_mesh_axes`` (``nn.with_logical_constraint``, Flax's
  boxes, ``nn.get_partition_spec``) — the same ordered walk as ours;
- NNX's ``apply_rules`` (eager sharding of every new variable) and
  ``from_sharding_rules`` (``nnx.get_partition_spec``) — with a dict: the last
  rule for a name wins, and a name with no rule is passed through as a mesh
  axis.

When the thread's rule store holds a toolkit :class:`~partitioning.Rules`
(inside :func:`~partitioning.axis_rules` or
:func:`~partitioning.sharding_context`), all three defer to
:func:`partitioning.resolve.walk`, including its mesh-axis names and trailing
dimensions, so a Linen model, an NNX model and the toolkit's own layout agree
name for name. With any other table (or none) Flax is untouched. The hooks
are installed once, when this module is imported.

The same hooks feed a recorder: inside :func:`recording`, every tuple of names
resolved for a parameter or an activation — by the toolkit or by Flax — is
collected, which is how ``plan`` sees activations a third-party model
constrains with Flax's own ``nn.with_logical_constraint``.

Example::

    >>> from partitioning.context import recording
    >>> class Block(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         return nn.with_logical_constraint(nn.Dense(64)(x), ("activation_batch", "activation_embed"))
    >>> x = jnp.ones((8, 64))
    >>> variables = jax.eval_shape(Block().init, jax.random.key(0), x)
    >>> with recording() as seen, pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp"):
    ...     _ = jax.eval_shape(Block().apply, variables, x)
    >>> ("activation_batch", "activation_embed") in seen
    True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import flax.core.spmd as flax_spmd
import flax.linen.spmd as linen_spmd
import jax
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.follows import canonical
from partitioning.resolve import axes_tuple, fill_mesh_axis_names, mesh_axis_sizes
from partitioning.rules import Rules, as_rules

_local = threading.local()


def get_logical_axis_rules() -> Rules:
    """The rule table of this thread's innermost rule context (ours or Flax's: they are one).

    Example::

        >>> from partitioning import axis_rules, get_logical_axis_rules
        >>> with axis_rules("fsdp"):
        ...     get_logical_axis_rules()[1]
        ('embed', 'fsdp')
    """
    return as_rules(None)


def set_logical_axis_rules(rules: Any) -> None:
    """Sets this thread's rule table (the one Flax's ``nn`` functions read too).

    Example::

        >>> from partitioning import get_logical_axis_rules, set_logical_axis_rules
        >>> set_logical_axis_rules("fsdp")
        >>> get_logical_axis_rules()[1]
        ('embed', 'fsdp')
        >>> set_logical_axis_rules(None)   # back to no rules
    """
    flax_spmd.set_logical_axis_rules(as_rules(rules) if rules is not None else Rules())


@contextlib.contextmanager
def axis_rules(rules: Any):
    """Context manager that sets the rule table for this thread.

    Example::

        >>> from partitioning import axis_rules, logical_to_mesh_axes
        >>> with axis_rules([("embed", "fsdp")]):
        ...     logical_to_mesh_axes(("embed", None))
        P('fsdp', None)
    """
    rules = as_rules(rules) if rules is not None else Rules()
    with flax_spmd.logical_axis_rules(rules):
        yield rules


def logical_to_mesh_axes(array_dim_names: Sequence[Any] | None, rules: Any = None) -> PartitionSpec | None:
    """Flax-compatible: the PartitionSpec for logical dimension names (rules: argument or context).

    Exactly :func:`flax.linen.logical_to_mesh_axes`; under a mesh
    (``jax.set_mesh``) a name no rule mentions that is a free mesh axis also
    gets that axis (after the rules, never taking an axis a rule assigned).

    Example::

        >>> from partitioning import logical_to_mesh_axes
        >>> logical_to_mesh_axes(("embed", "mlp"), "fsdp_tp")
        P('fsdp', 'tensor')
    """
    return as_rules(rules).resolve(array_dim_names, mesh=context_sizes())


@contextlib.contextmanager
def recording() -> Iterator[set[tuple[Any, ...]]]:
    """Collects, in this thread, every tuple of names resolved for a parameter or activation."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    seen: set[tuple[Any, ...]] = set()
    stack.append(seen)
    try:
        yield seen
    finally:
        stack.pop()


def record(names: Iterable[Any] | None) -> None:
    """Adds ``names`` to the innermost :func:`recording` of this thread (if any)."""
    stack = getattr(_local, "stack", None)
    if stack and names is not None:
        stack[-1].add(tuple(names))


def context_sizes(mesh: Any = None) -> dict[str, int] | None:
    """``{axis: size}`` of ``mesh`` or else the context mesh (``jax.set_mesh``); None without one."""
    mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if mesh is None or getattr(mesh, "empty", False):
        return None
    return mesh_axis_sizes(mesh) or None


def _toolkit_rules(local: Any = None) -> Rules | None:
    """The toolkit table in force (a variable's own ``sharding_rules`` first), or None.

    An empty table is no table, as for Flax: NNX then passes names through as mesh axes.
    """
    rules = flax_spmd.get_logical_axis_rules()
    if not isinstance(rules, Rules) or not (rules or local):
        return None
    return Rules(local) + rules if local else rules


def _resolve(names: Iterable[Any], rules: Rules, mesh: Any = None) -> PartitionSpec:
    record(names)
    if mesh is None:  # a Variable's own ``mesh=`` metadata, when NNX is placing it (see _nnx_shard_value)
        mesh = getattr(_local, "variable_mesh", None)
    return rules.resolve(tuple(names), mesh=context_sizes(mesh))


_flax_apply_rules = flax_spmd.apply_rules
_flax_from_sharding_rules = flax_spmd.from_sharding_rules
_flax_composite_rules = flax_spmd.composite_rules
_flax_shard_value = flax_spmd.shard_value
_flax_logical_to_mesh_axes = getattr(linen_spmd, "_logical_to_mesh_axes", None)
_UNASSIGNED = getattr(linen_spmd, "_unassigned_axis", None)


def _nnx_apply_rules(sharding: Any, sharding_rules: Any = None) -> Any:
    """NNX eager sharding's name -> mesh-axis step: the walk under a toolkit table."""
    rules = _toolkit_rules(sharding_rules)
    if rules is not None:
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, _resolve(sharding.spec, rules, sharding.mesh))
        if isinstance(sharding, (PartitionSpec, tuple)):
            return _resolve(sharding, rules)
    return _flax_apply_rules(sharding, sharding_rules)


def _nnx_shard_value(value: Any, out_sharding: Any, sharding_rules: Any, mesh: Any) -> Any:
    """NNX's eager placement of a new Variable: mesh-axis names resolve against its own ``mesh=`` too."""
    previous = getattr(_local, "variable_mesh", None)
    _local.variable_mesh = mesh
    try:
        return _flax_shard_value(value, out_sharding, sharding_rules, mesh)
    finally:
        _local.variable_mesh = previous


def _nnx_from_sharding_rules(sharding: Any, sharding_rules: Any) -> Any:
    """``nnx.get_partition_spec``'s name -> mesh-axis step: the walk under a toolkit table."""
    if isinstance(sharding_rules, Rules) and isinstance(sharding, (PartitionSpec, tuple)):
        return tuple(_resolve(sharding, sharding_rules))
    return _flax_from_sharding_rules(sharding, sharding_rules)


def _linen_logical_to_mesh_axes(array_dim_names: Sequence[Any] | None, rules: Any = None) -> Any:
    """Linen's walk (Flax's own code), recorded; then, inside the toolkit's context (or for a toolkit table)
    and under a mesh, mesh-axis names. A table passed explicitly is the one walked, as in Flax.

    Dims nothing claimed stay Flax's "unassigned" so its fallback modes apply unchanged.
    """
    record(array_dim_names)
    flax_walk = _flax_logical_to_mesh_axes
    if array_dim_names is None or flax_walk is None:  # as Flax: an unnamed array has no axes
        return None
    context = flax_spmd.get_logical_axis_rules()
    table = rules if rules is not None else context
    if isinstance(table, Rules) and table.follows:
        array_dim_names = canonical(array_dim_names, table.follows)  # activation_embed -> embed, ...
    result = flax_walk(array_dim_names, rules)
    toolkit = isinstance(table, Rules) or isinstance(context, Rules)
    sizes = context_sizes()
    if result is None or not toolkit or not sizes or _UNASSIGNED is None or not isinstance(table, (tuple, list)):
        return result
    owner = {a: i for i, entry in enumerate(result) if isinstance(entry, (str, tuple)) for a in axes_tuple(entry)}
    fill_mesh_axis_names(table, tuple(array_dim_names), result, _UNASSIGNED, owner, sizes)
    return result


def _composite_rules(rule1: Any, rule2: Any) -> Any:
    """NNX's merge of the context's and a variable's own rules: with a toolkit table, one ordered table."""
    if isinstance(rule1, Rules) or isinstance(rule2, Rules):
        return Rules(rule2 or ()) + Rules(rule1 or ()) if rule2 else Rules(rule1 or ())
    return _flax_composite_rules(rule1, rule2)


def install() -> None:
    """Points Flax's resolvers at the ones above (once; they defer to Flax outside the toolkit's context)."""
    if getattr(flax_spmd.apply_rules, "__module__", "") == __name__:
        return
    flax_spmd.apply_rules = _nnx_apply_rules
    flax_spmd.from_sharding_rules = _nnx_from_sharding_rules
    flax_spmd.composite_rules = _composite_rules
    flax_spmd.shard_value = _nnx_shard_value
    if _flax_logical_to_mesh_axes is not None:
        linen_spmd._logical_to_mesh_axes = _linen_logical_to_mesh_axes


install()

__all__ = [
    "axis_rules",
    "get_logical_axis_rules",
    "set_logical_axis_rules",
    "logical_to_mesh_axes",
    "recording",
    "record",
    "install",
]
