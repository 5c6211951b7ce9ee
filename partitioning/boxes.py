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
import jax
from flax.core import meta
from jax.sharding import PartitionSpec

from partitioning.context import get_logical_axis_rules, record
from partitioning.errors import RuleError
from partitioning.resolve import axes_tuple, mesh_axis_sizes
from partitioning.rules import as_rules


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
        if _is_explicit(jax.sharding.get_abstract_mesh()):
            return param_for_compute(self.value, tuple(self.names), rules=self.rules)
        return with_logical_constraint(self.value, tuple(self.names), rules=self.rules)


def _is_explicit(mesh: Any) -> bool:
    return not mesh.empty and any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


def compute_spec(names: Sequence[Any], rules: Any = None) -> PartitionSpec:
    """A param's spec for computing with it: its rule spec minus :attr:`Rules.batch_axes`.

    Those axes split the batch, so a param sharded over them (FSDP) must be
    gathered before use; its other axes (tensor parallelism) stay sharded.
    ``batch_axes`` are declared with the rule table, or read off its ``batch``
    rules.

    Example::

        >>> from partitioning import compute_spec
        >>> compute_spec(("embed", "heads"), "fsdp_tp")
        P(None, 'tensor')
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    batch_axes = set(rules.batch_axes)
    out = []
    for entry in _constraint_spec(tuple(names), rules, Fallback.UNSHARDED, jax.sharding.get_abstract_mesh()):
        kept = tuple(a for a in axes_tuple(entry) if a not in batch_axes)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


def param_for_compute(x: Any, names: Sequence[Any], rules: Any = None) -> Any:
    """On an Explicit mesh, ``x`` resharded to :func:`compute_spec`; ``x`` itself otherwise.

    Explicit axes never move data implicitly, so FSDP's all-gather has to be
    spelled out before a param meets a batch-sharded activation; the gradient
    goes back to the stored layout through reshard's transpose (a
    reduce-scatter). Models call it on params they read: ``Trainer`` applies
    them unboxed, so :meth:`LogicallyPartitioned.unbox` does not run there.

    Example::

        In a model: ``w = param_for_compute(self.param("w", init, shape), ("embed", "mlp"))``.

        >>> from partitioning import param_for_compute
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
    return _constraint_spec(tuple(names), rules, Fallback.UNSHARDED, mesh)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """``x`` constrained to ``spec`` on the context mesh: ``reshard`` on Explicit axes, else a sharding
    constraint; the identity outside a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def with_logical_partitioning(
    fn: Callable[..., Any], names: Sequence[str | None], rules: Any = None
) -> Callable[..., LogicallyPartitioned]:
    """Wraps an initializer so its result is boxed with logical ``names``.

    Fewer names than dimensions leave the trailing dimensions unsharded. The
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
        return LogicallyPartitioned(fn(*args, **kwargs), names, rules=rules)

    return wrapper


def is_box(x: Any) -> bool:
    """True for ours, Flax's ``nn.LogicallyPartitioned`` and ``nn.Partitioned``.

    Example::

        >>> from partitioning import is_box
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


class Fallback(enum.Enum):
    """What a logical name with no rule means for an activation constraint.

    Example::

        >>> from partitioning import Fallback, with_logical_constraint
        >>> @jax.jit
        ... def f(h):   # mlp has no rule: XLA chooses its layout
        ...     return with_logical_constraint(h, ("batch", "length", "mlp"), fallback=Fallback.UNCONSTRAINED)
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}), [("batch", "fsdp")]):
        ...     h = f(jnp.ones((8, 16, 256)))
    """

    UNSHARDED = "unsharded"  # the dimension is replicated
    UNCONSTRAINED = "unconstrained"  # XLA decides
    ERROR = "error"  # raise


def _fallback(value: Any) -> Fallback:
    if isinstance(value, Fallback):
        return value
    if isinstance(value, nn.spmd.RulesFallback):
        return {
            nn.spmd.RulesFallback.AXIS_IS_UNSHARDED: Fallback.UNSHARDED,
            nn.spmd.RulesFallback.NO_CONSTRAINT: Fallback.UNCONSTRAINED,
            nn.spmd.RulesFallback.RAISE_ERROR: Fallback.ERROR,
        }[value]
    try:
        return Fallback(value)
    except ValueError:
        raise RuleError(f"fallback must be one of {[f.value for f in Fallback]}, got {value!r}") from None


def _constraint_spec(names: Sequence[Any], rules, fallback: Fallback, mesh: Any = None) -> PartitionSpec:
    names = tuple(names)
    known = set(rules.logical_names)
    sizes = mesh_axis_sizes(mesh) if mesh is not None and not mesh.empty else {}
    spec = list(rules.resolve(names, mesh=sizes or None))
    for i, n in enumerate(names):
        if isinstance(n, str) and n not in known and n not in sizes:
            if fallback is Fallback.ERROR:
                raise RuleError(
                    f"activation dimension {i} has logical name {n!r} but no rule mentions it "
                    f"(rules cover: {', '.join(rules.logical_names)})"
                )
            if fallback is Fallback.UNCONSTRAINED:
                spec[i] = PartitionSpec.UNCONSTRAINED
    return PartitionSpec(*spec)


def _constrain_one(x: Any, names: Any, rules, fallback: Fallback, mesh) -> Any:
    if names is None:
        return x
    names = tuple(names)
    record(names)
    if len(names) > x.ndim:
        raise RuleError(
            f"{len(names)} logical names {names!r} for an activation of rank {x.ndim} (shape {tuple(x.shape)})"
        )
    spec = _constraint_spec(names, rules, fallback, mesh)
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    if explicit:
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def with_logical_constraint(x: Any, names: Any, *, rules: Any = None, fallback: Any = Fallback.UNSHARDED) -> Any:
    """Constrains an activation's sharding by logical names.

    Uses ``jax.lax.with_sharding_constraint`` on ``Auto`` mesh axes and
    ``jax.sharding.reshard`` on ``Explicit`` ones; the identity outside a mesh
    (``jax.set_mesh``) or outside a rule table. Applies on the CPU too.
    ``fallback`` says what a name no rule mentions means: ``'unsharded'``
    (default), ``'unconstrained'`` (let XLA choose) or ``'error'``.

    Example::

        >>> from partitioning import with_logical_constraint
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp"):
        ...     h = with_logical_constraint(jnp.ones((8, 16, 256)), ("batch", "length", "mlp"))
        >>> h.sharding.spec
        P(('data', 'fsdp'), None, None)
    """
    rules = as_rules(rules) if rules is not None else get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or names is None or mesh.empty:
        return x
    fb = _fallback(fallback)
    if isinstance(names, (PartitionSpec, tuple)) and all(
        n is None or isinstance(n, str) or n is PartitionSpec.UNCONSTRAINED for n in names
    ):
        return _constrain_one(x, names, rules, fb, mesh)
    return jax.tree.map(
        lambda n, a: _constrain_one(a, n, rules, fb, mesh),
        names,
        x,
        is_leaf=lambda n: isinstance(n, (PartitionSpec, tuple)) or n is None,
    )
