"""Layout: pytrees of boxed / abstract arrays -> PartitionSpecs -> NamedShardings.

Takes the output of ``jax.eval_shape`` of an init (params, optax state, a
whole train state) and gives one sharding per leaf, in the *unboxed* tree
structure (the structure the arrays have after ``meta.unbox``). Boxed leaves
with logical names go through the rule table; Flax ``nn.Partitioned`` boxes
name mesh axes directly; unboxed leaves and scalars are replicated. Flax NNX
state works too: a Variable's ``out_sharding`` names (``nnx.with_partitioning``)
are logical names, resolved by the same rules.

Example::

    >>> from partitioning.models import MLP
    >>> model, x = MLP(), jnp.zeros((8, 16), jnp.int32)
    >>> mesh, rules = pt.make_mesh({"data": 1, "fsdp": -1}), pt.Rules.preset("fsdp")
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, rules)
    >>> params = jax.jit(model.init, out_shardings=shardings)(jax.random.key(0), x)
    >>> pt.unbox(params)["params"]["embedding"].sharding.spec
    P(None, 'fsdp')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.annotations import apply_annotations, named_by
from partitioning.boxes import is_box, is_logical_box
from partitioning.context import context_sizes
from partitioning.errors import ShardingError
from partitioning.paths import path_str
from partitioning.replication import check_replication
from partitioning.resolve import REMEDY, DimExplanation, axes_tuple, mesh_axis_sizes
from partitioning.rules import Rules, as_rules


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """Everything known about how one leaf is laid out on the mesh.

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> leaf = pt.tree_layouts(abstract, pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp")[0]
        >>> leaf.path, leaf.spec, leaf.per_device_bytes, leaf.replicated
        ('params/embedding', P(None, 'fsdp'), 8192, False)
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    names: tuple[Any, ...] | None  # logical names (None: unboxed leaf)
    spec: PartitionSpec
    dims: tuple[DimExplanation, ...]  # empty for unboxed / mesh-named leaves
    shards_per_dim: tuple[int, ...]
    named_by: str | None = None  # the annotation row that named it (partitioning.annotations)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def per_device_bytes(self) -> int:
        local = math.prod(-(-s // n) for s, n in zip(self.shape, self.shards_per_dim, strict=True))
        return local * np.dtype(self.dtype).itemsize

    @property
    def replicated(self) -> bool:
        return all(n == 1 for n in self.shards_per_dim)


def _is_nnx_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _is_leaf(x: Any) -> bool:
    return is_box(x) or _is_nnx_variable(x)


def _as_box(leaf: Any) -> Any:
    """An NNX Variable annotated with ``out_sharding`` logical names -> a Linen box.

    So Linen boxes and NNX variables resolve through one engine and a rule
    table means the same thing for both.
    """
    if not _is_nnx_variable(leaf):
        return leaf
    names = leaf.get_metadata().get("out_sharding")
    value = leaf.get_value() if hasattr(leaf, "get_value") else leaf.value
    return nn.LogicallyPartitioned(value, tuple(names)) if names is not None else value


def _shards(spec: PartitionSpec, ndim: int, sizes: dict[str, int]) -> tuple[int, ...]:
    out = []
    for i in range(ndim):
        entry = spec[i] if i < len(spec) else None
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            out.append(1)
        else:
            out.append(math.prod(sizes.get(a, 1) for a in axes_tuple(entry)))
    return tuple(out)


def _layout_one(path: str, leaf: Any, mesh: Any, rules: Rules, on_indivisible: str) -> LeafLayout:
    sizes = mesh_axis_sizes(mesh)
    leaf = _as_box(leaf)
    value = leaf.value if is_box(leaf) else leaf
    shape = tuple(int(s) for s in getattr(value, "shape", ()))
    dtype = np.dtype(getattr(value, "dtype", np.float32))
    if is_logical_box(leaf):
        names = tuple(leaf.names)
        box_rules = as_rules(leaf.rules) if leaf.rules is not None else rules
        spec, dims = box_rules.resolve_explained(names, shape, mesh, on_indivisible=on_indivisible, path=path)
        shards = _shards(spec, len(shape), sizes)
        return LeafLayout(path, shape, dtype, names, spec, tuple(dims), shards, named_by(leaf))
    if is_box(leaf):  # nn.Partitioned: names are mesh axes already
        spec = PartitionSpec(*leaf.names)
        shards = _shards(spec, len(shape), sizes)
        for i, (s, n) in enumerate(zip(shape, shards, strict=True)):
            if s % n:
                raise ShardingError(
                    f"{path}: dim {i} (size {s}) is not divisible by mesh axes {axes_tuple(spec[i])!r} of size {n}"
                )
        return LeafLayout(path, shape, dtype, tuple(leaf.names), spec, (), shards)
    spec = PartitionSpec()
    return LeafLayout(path, shape, dtype, None, spec, (), (1,) * len(shape))


def name_failures(failed: dict[str, list[str]]) -> list[str]:
    """``paths: failure`` per indivisible dimension (``failed``: the failure -> the arrays it fails in); an
    optimizer state's copy of a failing parameter (mu, nu, ...) is that parameter's failure, named once."""
    out = []
    for why, paths in failed.items():
        params = {p.split("/", 1)[1] for p in paths if p.startswith("params/")}
        named = [p for p in paths if not any(p.endswith(f"/{q}") and p != f"params/{q}" for q in params)]
        out.append(f"{', '.join(named)}: {why}")
    return out


def indivisible_error(failed: dict[str, list[str]]) -> ShardingError:
    """One error naming every array that does not divide (see :func:`name_failures`), with the fix."""
    # A dimension named by a mesh axis (nn.Partitioned, NNX) has no rule to change: only its size.
    remedy = REMEDY if any("(mesh axis " not in why for why in failed) else REMEDY.replace("the rule or ", "")
    return ShardingError(f"{'; '.join(name_failures(failed))}; {remedy}", arg="on_indivisible")


def tree_layouts(
    tree: Any,
    mesh: Any,
    rules: Any = None,
    *,
    on_indivisible: str = "error",
    warn_replicated: bool = True,
    annotations: Any = None,
) -> list[LeafLayout]:
    """One :class:`LeafLayout` per leaf, in flattening order.

    Warns (:class:`~partitioning.ReplicationWarning`) when most of the tree
    would be replicated because nothing matched its names
    (``warn_replicated=False``: never). ``annotations`` (an
    :class:`~partitioning.Annotations` or its rows) name leaves by path first.

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> for leaf in pt.tree_layouts(abstract, pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp")[:3]:
        ...     print(leaf.path, leaf.names, leaf.spec, leaf.per_device_bytes)
        params/embedding ('vocab', 'embed') P(None, 'fsdp') 8192
        params/unembed ('embed', 'vocab') P('fsdp', None) 8192
        params/wi_0 ('embed', 'mlp') P('fsdp', None) 8192
    """
    return _tree_layouts(apply_annotations(tree, annotations), mesh, rules, on_indivisible, warn_replicated, 4)


def _tree_layouts(tree: Any, mesh: Any, rules: Any, on_indivisible: str, warn: bool, depth: int) -> list[LeafLayout]:
    rules = as_rules(rules)
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_leaf)[0]
    layouts: list[LeafLayout] = []
    failed: dict[str, list[str]] = {}  # an indivisible dimension (less the path) -> the arrays it fails in
    for kp, leaf in leaves:
        path = path_str(kp)
        try:
            layouts.append(_layout_one(path, leaf, mesh, rules, on_indivisible))
        except ShardingError as e:
            if e.arg != "on_indivisible" or not str(e).startswith(f"{path}: "):
                raise
            failed.setdefault(str(e)[len(path) + 2 :].split("; change the")[0], []).append(path)
    if failed:  # every array that does not divide, in one line (k and v alike), not only the first
        raise indivisible_error(failed)
    if warn:
        check_replication(layouts, mesh_axis_sizes(mesh), rules, stacklevel=depth)  # depth: the user's frame
    return layouts


def tree_specs(
    tree: Any,
    mesh: Any,
    rules: Any = None,
    *,
    on_indivisible: str = "error",
    warn_replicated: bool = True,
    annotations: Any = None,
) -> Any:
    """A PartitionSpec per leaf of ``tree``, in its unboxed structure.

    Divisibility against ``mesh`` is checked up front; the error names the
    parameter path, dimension, sizes and mesh axes.

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> pt.tree_specs(abstract, {"data": 1, "fsdp": 8}, "fsdp")["params"]["embedding"]
        P(None, 'fsdp')
    """
    return _tree_specs(apply_annotations(tree, annotations), mesh, rules, on_indivisible, warn_replicated, 5)


def _tree_specs(tree: Any, mesh: Any, rules: Any, on_indivisible: str, warn: bool, depth: int) -> Any:
    layouts = _tree_layouts(tree, mesh, rules, on_indivisible, warn, depth)
    treedef = jax.tree_util.tree_structure(tree, is_leaf=_is_leaf)
    return jax.tree_util.tree_unflatten(treedef, [leaf.spec for leaf in layouts])


def tree_shardings(
    tree: Any,
    mesh: jax.sharding.Mesh,
    rules: Any = None,
    *,
    on_indivisible: str = "error",
    warn_replicated: bool = True,
    annotations: Any = None,
) -> Any:
    """A NamedSharding per leaf of ``tree`` (boxed or not), in its unboxed structure.

    Warns like :func:`tree_layouts` (``warn_replicated``); ``annotations`` as there.

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> shardings = pt.tree_shardings(abstract, pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp")
        >>> shardings["params"]["wi_0"]
        NamedSharding(mesh=Mesh('data': 1, 'fsdp': 8, ...), spec=P('fsdp', None), ...)
    """
    specs = _tree_specs(apply_annotations(tree, annotations), mesh, rules, on_indivisible, warn_replicated, 5)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def logical_names(tree: Any) -> Any:
    """Each leaf's logical names (a tuple), or None for unboxed leaves; unboxed structure.

    Example::

        >>> from partitioning import logical_names
        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> logical_names(abstract)["params"]["embedding"]
        ('vocab', 'embed')
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_leaf)
    boxes = [_as_box(leaf) for leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, [tuple(b.names) if is_logical_box(b) else None for b in boxes])


def per_device_bytes(layouts: list[LeafLayout]) -> int:
    """Bytes one device holds for these leaves (every device holds the same).

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> pt.layout.per_device_bytes(pt.tree_layouts(abstract, pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp"))
        49152
    """
    return sum(leaf.per_device_bytes for leaf in layouts)


def _is_spec_or_box(x: Any) -> bool:
    return isinstance(x, PartitionSpec) or is_box(x)


def logical_to_mesh(tree: Any, rules: Any = None) -> Any:
    """Flax-compatible: maps a pytree of logical PartitionSpecs (or boxes) to mesh specs.

    Under a mesh (``jax.set_mesh``) mesh-axis names resolve as in
    :func:`~partitioning.logical_to_mesh_axes`.

    Example::

        >>> from jax.sharding import PartitionSpec as P
        >>> pt.logical_to_mesh({"w": P("embed", "mlp")}, "fsdp")
        {'w': P('fsdp', None)}
    """
    return _logical_to_mesh(tree, as_rules(rules), context_sizes())


def _logical_to_mesh(tree: Any, rules: Rules, sizes: Any) -> Any:
    def one(x: Any) -> Any:
        return rules.resolve(tuple(x.names) if is_box(x) else x, mesh=sizes)

    return jax.tree.map(one, tree, is_leaf=_is_spec_or_box)


def logical_to_mesh_sharding(tree: Any, mesh: jax.sharding.Mesh, rules: Any = None) -> Any:
    """Flax-compatible: a pytree of logical PartitionSpecs (or boxes) -> NamedShardings.

    A name no rule mentions that is an axis of ``mesh`` gets that axis when
    the rules left it free (see :func:`~partitioning.logical_to_mesh_axes`).

    Example::

        >>> from jax.sharding import PartitionSpec as P
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> pt.logical_to_mesh_sharding({"w": P("embed", "mlp")}, mesh, "fsdp")["w"].spec
        P('fsdp', None)
    """
    specs = _logical_to_mesh(tree, as_rules(rules), mesh_axis_sizes(mesh) or None)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


__all__ = [
    "LeafLayout",
    "name_failures",
    "indivisible_error",
    "tree_layouts",
    "tree_specs",
    "tree_shardings",
    "logical_names",
    "per_device_bytes",
    "path_str",
    "logical_to_mesh",
    "logical_to_mesh_sharding",
]
