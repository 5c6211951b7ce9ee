"""Metadata boxes that carry logical axis names, and activation constraints.

:class:`LogicallyPartitioned` subclasses Flax's own box, so everything Flax
does with boxes (``nn.scan``/``nn.vmap`` inserting a ``layers`` axis through
``metadata_params``, ``nn.get_partition_spec``, optax states built from boxed
params keeping the boxes) works unchanged. What it changes is ``unbox``: the
constraint goes through this toolkit's rule table and mesh context and is
applied on every platform, the CPU included.

Example::

    >>> from partitioning import with_logical_partitioning
    >>> dense = nn.Dense(64, kernel_init=with_logical_partitioning(
    ...     nn.initializers.lecun_normal(), ("embed", "mlp")))
    >>> variables = jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((8, 32)))
    >>> variables["params"]["kernel"].names
    ('embed', 'mlp')
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import flax.linen.spmd as linen_spmd
import jax
from flax.core import meta
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.context import get_logical_axis_rules, record
from partitioning.errors import RuleError
from partitioning.resolve import axes_tuple, mesh_axis_sizes
from partitioning.rules import Rules, as_rules


class LogicallyPartitioned(nn.LogicallyPartitioned):
    """A parameter value tagged with one logical axis name per dimension.

    Flax's own box with one change: :meth:`unbox` constrains through this
    toolkit's rules and mesh context on every platform.

    Example::

        >>> from partitioning import LogicallyPartitioned
        >>> box = LogicallyPartitioned(jnp.zeros((64, 256)), ("embed", "mlp"))
        >>> box.names, box.value.shape
        (('embed', 'mlp'), (64, 256))
    """

    def unbox(self, apply_constraint: bool = True) -> Any:
        # Flax's DenseGeneral unboxes its kernel while it still has the flattened
        # init shape (fewer dims than names): nothing to constrain yet.
        if not apply_constraint or getattr(self.value, "ndim", len(self.names)) < len(self.names):
            return self.value
        context = jax.sharding.get_abstract_mesh()
        if self.mesh is None and context.empty:  # as Flax: no mesh, no constraint
            return self.value
        if self.mesh is None and _is_explicit(context):
            return param_for_compute(self.value, tuple(self.names), rules=self.rules)
        return with_logical_constraint(self.value, tuple(self.names), rules=self.rules, mesh=self.mesh)


def _is_explicit(mesh: Any) -> bool:
    return not mesh.empty and any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def compute_spec(names: Sequence[Any], rules: Any = None, mesh: Any = None) -> PartitionSpec:
    """A param's spec for computing with it: its rule spec minus :attr:`Rules.token_axes`.

    Those axes split the tokens (the batch, and the sequence under context
    parallelism), so a param sharded over them (FSDP) must be gathered before
    use; its other axes (tensor parallelism) stay sharded. ``batch_axes`` are
    declared with the rule table, or read off its ``batch`` rules; the
    ``length`` rules add theirs. Mesh-axis names resolve against ``mesh`` (else
    the context mesh).

    Example::

        >>> from partitioning.boxes import compute_spec
        >>> compute_spec(("embed", "heads"), "fsdp_tp")
        P(None, 'tensor')
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    token_axes = set(rules.token_axes)
    out = []
    mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    for entry in _constraint_spec(tuple(names), rules, mesh):
        kept = tuple(a for a in axes_tuple(entry) if a not in token_axes)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


def param_for_compute(x: Any, names: Sequence[Any], rules: Any = None) -> Any:
    """On an Explicit mesh, ``x`` resharded to :func:`compute_spec`; ``x`` itself otherwise.

    Explicit axes never move data implicitly, so FSDP's all-gather has to be
    spelled out before a param meets a batch-sharded activation; the gradient
    goes back to the stored layout through reshard's transpose (a
    reduce-scatter). Models call it on params they read: ``Trainer`` applies
    them unboxed, so :meth:`LogicallyPartitioned.unbox` does not run there.

    In a model: ``w = param_for_compute(self.param("w", init, shape), ("embed", "mlp"))``.

    Example::

        >>> from partitioning.boxes import param_for_compute
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1}, axis_types="explicit")
        >>> w = jax.device_put(jnp.ones((64, 256)), jax.NamedSharding(mesh, jax.P("fsdp", None)))  # stored split
        >>> with pt.sharding_context(mesh, "fsdp"):
        ...     param_for_compute(w, ("embed", "mlp")).sharding.spec   # gathered for the matmul
        P(None, None)
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    if not rules or not _is_explicit(jax.sharding.get_abstract_mesh()):
        return x
    return jax.sharding.reshard(x, compute_spec(names, rules))


def logical_spec(names: Sequence[Any], rules: Any = None) -> PartitionSpec | None:
    """The PartitionSpec for ``names`` on an Explicit mesh; ``None`` otherwise.

    For the ``out_sharding=`` of ops whose output sharding JAX cannot infer on
    Explicit axes (a gather, a contraction over a sharded dimension); ``None``
    keeps the Auto-axes behaviour (XLA decides) unchanged.

    Example::

        >>> from partitioning import logical_spec
        >>> logical_spec(("batch", "embed"), "fsdp") is None   # no Explicit mesh: leave it to XLA
        True
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}, axis_types="explicit"), "fsdp"):
        ...     logical_spec(("batch", "length", "embed"))
        P(('data', 'fsdp'), None, None)
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or not _is_explicit(mesh):
        return None
    return _constraint_spec(tuple(names), rules, mesh)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """``x`` constrained to ``spec`` on the context mesh: ``reshard`` on Explicit axes, else a sharding
    constraint; the identity outside a mesh."""
    return _with_sharding_constraint(x, spec)


def with_logical_partitioning(
    fn: Callable[..., Any], names: Sequence[str | None], mesh: Any = None, rules: Any = None
) -> Callable[..., LogicallyPartitioned]:
    """Wraps an initializer so its result is boxed with logical ``names`` (Flax's signature).

    ``mesh`` and ``rules`` are stored on the box, as in Flax: its constraint
    then uses them instead of the context's. Fewer names than dimensions leave
    the trailing dimensions unsharded. The
    initializer may be called with a flattened shape (Flax's ``DenseGeneral``
    does, then reshapes the box's value), so the names are checked against the
    parameter's final shape when it is laid out.

    Example::

        >>> from partitioning import with_logical_partitioning
        >>> init = with_logical_partitioning(nn.initializers.zeros_init(), ("embed",))
        >>> init(jax.random.key(0), (4,)).names
        ('embed',)
    """
    names = tuple(names)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return LogicallyPartitioned(fn(*args, **kwargs), names, mesh=mesh, rules=rules)

    return wrapper


def is_box(x: Any) -> bool:
    """True for ours, Flax's ``nn.LogicallyPartitioned`` and ``nn.Partitioned``.

    Example::

        >>> from partitioning.boxes import is_box
        >>> is_box(nn.Partitioned(jnp.zeros(4), ("fsdp",))), is_box(jnp.zeros(4))
        (True, False)
    """
    return isinstance(x, meta.Partitioned)


def is_logical_box(x: Any) -> bool:
    """True when a box's names are logical (resolved by rules), not mesh axes."""
    return isinstance(x, nn.LogicallyPartitioned)


def unbox(tree: Any) -> Any:
    """The values inside every box (ours or Flax's), never applying a constraint.

    Example::

        >>> from partitioning import unbox, with_logical_partitioning
        >>> init = with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
        >>> dense = nn.Dense(64, kernel_init=init)
        >>> params = unbox(jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((8, 32))))["params"]
        >>> params["kernel"]
        ShapeDtypeStruct(shape=(32, 64), dtype=float32)
    """
    return jax.tree.map(lambda x: x.value if is_box(x) else x, tree, is_leaf=is_box)


def get_partition_spec(tree: Any) -> Any:
    """Flax's ``nn.get_partition_spec``: each box's *logical* names as a PartitionSpec, ``P()`` for arrays.

    Resolve them with :func:`~partitioning.logical_to_mesh` (or use
    :func:`~partitioning.tree_specs`, which resolves and checks divisibility).

    Example::

        >>> from partitioning import LogicallyPartitioned, get_partition_spec
        >>> get_partition_spec({"w": LogicallyPartitioned(jnp.zeros((4, 8)), ("embed", "mlp"))})
        {'w': P('embed', 'mlp')}
    """
    return meta.get_partition_spec(tree)


class Fallback(enum.Enum):
    """What a named dimension nothing assigned (no rule, or every rule's axes taken) means for a constraint.

    ``pt.RulesFallback`` is this enum under Flax's name, with Flax's member
    names as aliases: ``AXIS_IS_UNSHARDED`` is :attr:`UNSHARDED`,
    ``RAISE_ERROR`` is :attr:`ERROR`, ``NO_CONSTRAINT`` is
    :attr:`NO_CONSTRAINT`; Flax's own ``nn.RulesFallback`` is accepted too.
    Each behaves exactly as in Flax.

    Example::

        >>> from partitioning.boxes import Fallback, RulesFallback, with_logical_constraint
        >>> Fallback.RAISE_ERROR is Fallback.ERROR is RulesFallback.RAISE_ERROR
        True
        >>> @jax.jit
        ... def f(h):   # mlp has no rule: XLA chooses its layout
        ...     return with_logical_constraint(h, ("batch", "length", "mlp"), fallback=Fallback.UNCONSTRAINED)
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}), [("batch", "fsdp")]):
        ...     h = f(jnp.ones((8, 16, 256)))
    """

    UNSHARDED = "unsharded"  # the dimension is replicated
    UNCONSTRAINED = "unconstrained"  # that dimension is left to XLA (a toolkit extra)
    ERROR = "error"  # raise (a RuleError, a ValueError)
    NO_CONSTRAINT = "no_constraint"  # the whole array is left unconstrained
    # Flax's member names (``pt.RulesFallback`` is this enum): aliases of the members above.
    AXIS_IS_UNSHARDED = "unsharded"
    RAISE_ERROR = "error"


RulesFallback = Fallback


def _fallback(value: Any) -> Fallback:
    if isinstance(value, Fallback):
        return value
    if isinstance(value, nn.spmd.RulesFallback):
        return {
            nn.spmd.RulesFallback.AXIS_IS_UNSHARDED: Fallback.UNSHARDED,
            nn.spmd.RulesFallback.NO_CONSTRAINT: Fallback.NO_CONSTRAINT,
            nn.spmd.RulesFallback.RAISE_ERROR: Fallback.ERROR,
        }[value]
    try:
        return Fallback(value)
    except ValueError:
        raise RuleError(f"fallback must be one of {[f.value for f in Fallback]}, got {value!r}") from None


_UNASSIGNED = object()  # a named dimension nothing claimed (Flax's fallback modes apply to it)


def _mesh_axes(names: Sequence[Any], rules: Rules, mesh: Any) -> list[Any]:
    """The rule walk for ``names`` with mesh-axis names against ``mesh``; unclaimed dims are ``_UNASSIGNED``."""
    sizes = mesh_axis_sizes(mesh) if mesh is not None and not getattr(mesh, "empty", False) else {}
    return rules.axes(tuple(names), sizes or None, unassigned_as=_UNASSIGNED)


def _constraint_spec(names: Sequence[Any], rules: Rules, mesh: Any = None) -> PartitionSpec:
    return PartitionSpec(*(None if a is _UNASSIGNED else a for a in _mesh_axes(names, rules, mesh)))


def _is_explicit_target(mesh: Any) -> bool:
    return any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def _with_sharding_constraint(x: Any, axis_resources: PartitionSpec | None, mesh: Any = None) -> Any:
    """Constrains ``x`` to ``axis_resources`` on ``mesh`` (else the context mesh); the identity without one.

    Flax's ``_with_sharding_constraint`` (same signature; it is called for
    ``Auto`` axes, so a test that mocks Flax's sees the toolkit's calls too),
    except on ``Explicit`` axes, where a sharding constraint only asserts:
    there it is ``jax.sharding.reshard``. On every platform, the CPU included.
    """
    if axis_resources is None:
        return x
    target = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if _is_explicit_target(target):
        return jax.sharding.reshard(x, NamedSharding(mesh, axis_resources) if mesh is not None else axis_resources)
    return linen_spmd._with_sharding_constraint(x, axis_resources, mesh=mesh)


def _constrain_one(names: Any, x: Any, fallback: Fallback, rules: Rules, mesh: Any) -> Any:
    if names is None:
        return x
    names = tuple(names)
    record(names)
    ndim = getattr(x, "ndim", len(names))
    if len(names) > ndim:
        raise RuleError(f"{len(names)} logical names {names!r} for an activation of rank {ndim} (shape {x.shape})")
    axes = _mesh_axes(names, rules, mesh if mesh is not None else jax.sharding.get_abstract_mesh())
    unassigned = [i for i, a in enumerate(axes) if a is _UNASSIGNED]
    if unassigned:
        if fallback is Fallback.ERROR:
            i = unassigned[0]
            why = (
                "no rule mentions it"
                if names[i] not in rules.logical_names
                else "every rule for it wants a mesh axis another dimension already uses"
            )
            raise RuleError(
                f"activation dimension {i} has logical name {names[i]!r} but {why} "
                f"(names {names!r}; rules cover: {', '.join(rules.logical_names)})"
            )
        if fallback is Fallback.NO_CONSTRAINT:
            return x
        fill = PartitionSpec.UNCONSTRAINED if fallback is Fallback.UNCONSTRAINED else None
        axes = [fill if a is _UNASSIGNED else a for a in axes]
    return _with_sharding_constraint(x, PartitionSpec(*axes), mesh=mesh)


def _is_logical_spec(x: Any) -> bool:
    return x is None or (
        isinstance(x, (PartitionSpec, tuple))
        and all(n is None or isinstance(n, str) or n is PartitionSpec.UNCONSTRAINED for n in x)
    )


def with_logical_constraint(
    x: Any,
    logical_axis_resources: Any,
    rules: Any = None,
    mesh: Any = None,
    fallback: Any = nn.spmd.RulesFallback.AXIS_IS_UNSHARDED,
) -> Any:
    """Constrains an activation's sharding by logical names (Flax's signature and fallbacks).

    ``logical_axis_resources`` is a tuple of names (or a pytree of them
    matching ``x``). Uses ``jax.lax.with_sharding_constraint`` on ``Auto``
    mesh axes and ``jax.sharding.reshard`` on ``Explicit`` ones, on ``mesh``
    or else the context mesh (``jax.set_mesh``); the identity without a mesh
    or without a rule table. Applies on the CPU too. A named dimension
    nothing assigned follows ``fallback``: Flax's ``RulesFallback``
    (``AXIS_IS_UNSHARDED``, the default; ``RAISE_ERROR`` raises a
    ``ValueError`` with or without a mesh; ``NO_CONSTRAINT`` leaves ``x``
    unconstrained) or :class:`Fallback` / its strings ``'unsharded'``,
    ``'unconstrained'`` (that dimension is left to XLA), ``'error'``,
    ``'no_constraint'``.

    Example::

        >>> from partitioning import with_logical_constraint
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp"):
        ...     h = with_logical_constraint(jnp.ones((8, 16, 256)), ("batch", "length", "mlp"))
        >>> h.sharding.spec
        P(('data', 'fsdp'), None, None)
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    if not rules or logical_axis_resources is None:
        return x
    fb = _fallback(fallback)
    one = functools.partial(_constrain_one, fallback=fb, rules=rules, mesh=mesh)
    if _is_logical_spec(logical_axis_resources):
        return one(logical_axis_resources, x)
    return jax.tree.map(one, logical_axis_resources, x, is_leaf=_is_logical_spec)
