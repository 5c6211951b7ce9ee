"""Meshes from ordered ``{axis: size}`` mappings, where their axes span nodes, and the mesh + rules context.

On a cluster ``nodes`` says which axes (or which factor of an axis' size)
span nodes (processes; slices on TPUs): the mesh is then built with
:func:`jax.experimental.mesh_utils.create_hybrid_device_mesh`, so each
node's devices fill the rest of the mesh and the chatty axes (fsdp, tensor)
stay on the fast links inside it. With one process it is a plan only: the
mesh is the same, and ``plan`` and ``tune`` price the split.

Example::

    >>> from partitioning import make_mesh, sharding_context
    >>> mesh = make_mesh({"data": 2, "fsdp": -1, "tensor": 1})   # 8 devices -> (2, 4, 1)
    >>> with sharding_context(mesh, "fsdp"):   # jax.set_mesh(mesh) and the fsdp rule table, restored on exit
    ...     y = pt.with_logical_constraint(jnp.ones((8, 64)), ("batch", "embed"))
    >>> y.sharding.spec
    P(('data', 'fsdp'), None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, AxisType, Mesh

from partitioning.context import axis_rules
from partitioning.errors import MeshError, did_you_mean
from partitioning.fmt import fmt_mesh
from partitioning.rules import as_rules

AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """An ordered mesh shape, possibly with one ``-1`` (the rest of the devices).

    Example::

        >>> from partitioning.mesh import MeshSpec
        >>> MeshSpec.from_mapping({"data": 2, "fsdp": -1}).resolve(8)
        {'data': 2, 'fsdp': 4}
    """

    axes: tuple[tuple[str, int], ...]
    axis_types: str = "auto"
    nodes: tuple[tuple[str, int], ...] = ()  # axis -> nodes it spans (size > 1 only), in mesh order

    @classmethod
    def from_mapping(
        cls,
        shape: Mapping[str, int] | Sequence[tuple[str, int]],
        axis_types: str = "auto",
        nodes: Mapping[str, int] | None = None,
    ) -> MeshSpec:
        items: list[tuple[str, int]] = list(shape.items()) if isinstance(shape, Mapping) else [(n, s) for n, s in shape]
        if not items:
            raise MeshError("mesh needs at least one axis, e.g. {data: -1}")
        names = [n for n, _ in items]
        for n, s in items:
            if not isinstance(n, str) or not n:
                raise MeshError(f"mesh axis names must be non-empty strings, got {n!r}")
            if isinstance(s, bool) or not isinstance(s, int) or (s < 1 and s != -1):
                raise MeshError(f"mesh axis {n!r}: size must be a positive integer or -1, got {s!r}")
        if len(set(names)) != len(names):
            raise MeshError(f"mesh axis named twice in {names}")
        if sum(1 for _, s in items if s == -1) > 1:
            raise MeshError(
                f"mesh {dict(items)} has more than one -1; at most one axis can take the rest of the devices"
            )
        if axis_types not in AXIS_TYPES:
            raise MeshError(
                f"axis_types must be one of {sorted(AXIS_TYPES)}, got {axis_types!r}"
                f"{did_you_mean(str(axis_types), AXIS_TYPES)}"
            )
        problem = nodes_problem(dict(items), nodes or {})
        if problem:
            raise MeshError(f"nodes: {problem}", arg="nodes")
        spans = tuple((n, int((nodes or {}).get(n, 1))) for n in names if int((nodes or {}).get(n, 1)) > 1)
        return cls(tuple((n, int(s)) for n, s in items), axis_types, spans)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def node_count(self) -> int:
        """How many nodes the mesh spans (1: no ``nodes``)."""
        return math.prod(n for _, n in self.nodes)

    def resolve(self, n_devices: int) -> dict[str, int]:
        """The concrete ``{axis: size}`` for ``n_devices`` devices."""
        fixed = math.prod(s for _, s in self.axes if s != -1)
        has_rest = any(s == -1 for _, s in self.axes)
        if has_rest:
            if n_devices % fixed:
                raise MeshError(
                    f"mesh {self.describe()}: the fixed axes need a multiple of {fixed} devices, "
                    f"but there are {n_devices}"
                )
            return {n: (n_devices // fixed if s == -1 else s) for n, s in self.axes}
        if fixed != n_devices:
            raise MeshError(
                f"mesh {self.describe()} needs {fixed} devices, but there are {n_devices}; "
                f"change a size or use -1 for one axis"
            )
        return dict(self.axes)

    def describe(self) -> str:
        return fmt_mesh(self.axes)

    def split(self, n_devices: int) -> tuple[dict[str, int], dict[str, int]]:
        """``(inside, across)``: each axis' size inside one node and its number of nodes (sizes multiply).

        Example::

            >>> from partitioning.mesh import MeshSpec
            >>> MeshSpec.from_mapping({"data": 4, "fsdp": -1}, nodes={"data": 2}).split(32)
            ({'data': 2, 'fsdp': 8}, {'data': 2, 'fsdp': 1})
        """
        sizes = self.resolve(n_devices)
        problem = nodes_problem(sizes, dict(self.nodes))
        if problem:
            raise MeshError(f"nodes: {problem}", arg="nodes")
        across = {a: dict(self.nodes).get(a, 1) for a in sizes}
        return {a: s // across[a] for a, s in sizes.items()}, across


def nodes_problem(shape: Mapping[str, int], nodes: Mapping[str, int]) -> str | None:
    """What is wrong with ``nodes`` for a mesh ``shape`` (sizes, ``-1`` not yet resolved), or None.

    Example::

        >>> from partitioning.mesh import nodes_problem
        >>> nodes_problem({"data": 4, "fsdp": 8}, {"data": 3})
        'data: 3 nodes do not divide its size 4; use 1, 2 or 4'
    """
    for axis, n in nodes.items():
        if axis not in shape:
            return f"{axis!r} is not a mesh axis ({', '.join(shape)}){did_you_mean(str(axis), [str(a) for a in shape])}"
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return f"{axis}: the number of nodes must be a positive integer, got {n!r}"
        size = shape[axis]
        if size != -1 and size % n:
            divisors = [d for d in range(1, size + 1) if size % d == 0]
            if len(divisors) > 6:  # the nearest ones: a long list hides the answer
                near = [max(d for d in divisors if d < n), min((d for d in divisors if d > n), default=size)]
                return f"{axis}: {n} nodes do not divide its size {size}; use a divisor of {size}, e.g. {_either(near)}"
            return f"{axis}: {n} nodes do not divide its size {size}; use {_either(divisors)}"
    return None


def _either(xs: Sequence[Any]) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " or " + xs[-1]


def _granule(device: Any) -> int:
    """A device's node: its slice on TPUs (slices meet over the data-centre network), else its process."""
    if device.platform == "tpu" and getattr(device, "slice_index", None) is not None:
        return int(device.slice_index)
    return int(device.process_index)


def node_ids(sizes: Mapping[str, int], nodes: Mapping[str, int]) -> np.ndarray:
    """The node of each mesh position (an array of the mesh's shape) when ``nodes`` splits it as
    :func:`~jax.experimental.mesh_utils.create_hybrid_device_mesh` does: along an axis of ``s`` devices over
    ``n`` nodes, positions ``0 .. s/n - 1`` are on the first node.

    Example::

        >>> from partitioning.mesh import node_ids
        >>> node_ids({"data": 2, "fsdp": 4}, {"fsdp": 2}).tolist()
        [[0, 0, 1, 1], [0, 0, 1, 1]]
    """
    shape, across = [int(s) for s in sizes.values()], [int(nodes.get(a, 1)) for a in sizes]
    coords = [c // (s // n) for c, s, n in zip(np.indices(shape), shape, across, strict=True)]
    return np.ravel_multi_index(tuple(coords), across)


def mesh_node_ids(mesh: Mesh) -> np.ndarray | None:
    """The node (process; slice on TPUs) of each device of a built mesh; None when all are on one node.

    Example::

        >>> from partitioning.mesh import mesh_node_ids
        >>> mesh_node_ids(pt.make_mesh({"data": 2, "fsdp": 4})) is None   # one process
        True
    """
    ids = np.vectorize(_granule, otypes=[int])(mesh.devices)
    return ids if len(np.unique(ids)) > 1 else None


def _hybrid(spec: MeshSpec, devices: Sequence[Any], sizes: dict[str, int]) -> np.ndarray | None:
    """``spec``'s devices laid out over its nodes (None: one node, the ordinary layout); refused, with what
    would work, when its nodes are not the processes (slices)."""
    keys = sorted({_granule(d) for d in devices})
    if not spec.nodes or len(keys) == 1:
        return None
    inside, across = spec.split(len(devices))
    unit = "slices" if devices[0].platform == "tpu" else "processes"
    if spec.node_count != len(keys):
        hint = _suggest(sizes, len(keys), [a for a, _ in spec.nodes])
        raise MeshError(
            f"nodes: {fmt_mesh(spec.nodes)} puts the mesh on {spec.node_count} nodes, but its devices belong to "
            f"{len(keys)} {unit} (one per node); "
            + (f"use nodes {fmt_mesh(hint)}" if hint else f"no split of {fmt_mesh(sizes)} makes {len(keys)} nodes"),
            arg="nodes",
        )
    held = [sum(1 for d in devices if _granule(d) == k) for k in keys]
    if set(held) != {math.prod(inside.values())}:
        raise MeshError(
            f"nodes: {fmt_mesh(spec.nodes)} needs {math.prod(inside.values())} devices on each of "
            f"{len(keys)} nodes, but the {unit} hold {', '.join(map(str, held))}",
            arg="nodes",
        )
    return mesh_utils.create_hybrid_device_mesh(
        list(inside.values()),
        list(across.values()),
        devices,
        process_is_granule=devices[0].platform != "tpu",
        allow_split_physical_axes=True,
    )


def _suggest(sizes: Mapping[str, int], count: int, prefer: Sequence[str]) -> dict[str, int] | None:
    """``nodes`` for ``count`` nodes: one axis of ``prefer`` if it can, else the outer axes first."""
    for a in [a for a in prefer if a in sizes] + [a for a in sizes if a not in prefer]:
        if sizes[a] % count == 0:
            return {a: count}
    left, out = count, {}
    for a in sizes:
        if (g := math.gcd(left, sizes[a])) > 1:
            out[a], left = g, left // g
    return out if left == 1 else None


def make_mesh(
    shape: Mapping[str, int] | Sequence[tuple[str, int]] | MeshSpec,
    axis_types: str = "auto",
    devices: Sequence[Any] | None = None,
    nodes: Mapping[str, int] | None = None,
) -> Mesh:
    """A :class:`jax.sharding.Mesh` from an ordered ``{axis: size}`` mapping.

    One size may be ``-1`` (filled from the device count). Device order comes
    from :func:`jax.make_mesh`, which knows the hardware topology. ``nodes``
    (``{axis: number of nodes}``) says which axes span nodes on a cluster, one
    process per node (slices on TPUs): the rest of the mesh stays inside a node
    (see the module docstring).

    Example::

        >>> from partitioning import make_mesh
        >>> mesh = make_mesh({"data": 2, "fsdp": -1})
        >>> dict(mesh.shape)
        {'data': 2, 'fsdp': 4}
        >>> dict(make_mesh({"data": 2, "fsdp": -1}, nodes={"data": 2}).shape)   # one process: the same mesh
        {'data': 2, 'fsdp': 4}
        >>> make_mesh({"data": 2, "fsdp": -1}, nodes={"data": 4})
        Traceback (most recent call last):
        partitioning.errors.MeshError: nodes: data: 4 nodes do not divide its size 2; use 1 or 2
    """
    if isinstance(shape, MeshSpec):
        spec = shape if nodes is None else MeshSpec.from_mapping(shape.axes, shape.axis_types, nodes)
    else:
        spec = MeshSpec.from_mapping(shape, axis_types, nodes)
    visible = devices is None
    devices = list(devices) if devices is not None else jax.devices()
    try:
        sizes = spec.resolve(len(devices))
    except MeshError as e:
        if not visible or jax.default_backend() != "cpu":
            raise
        raise MeshError(f"{e}{_simulate_hint(spec, len(devices))}") from None
    types = (AXIS_TYPES[spec.axis_types],) * len(sizes)
    spec.split(len(devices))  # a -1 axis the nodes do not divide is refused, on one process too
    try:
        hybrid = _hybrid(spec, devices, sizes)
    except ValueError as e:
        if isinstance(e, MeshError):
            raise
        raise MeshError(f"nodes: {fmt_mesh(spec.nodes)}: {' '.join(str(e).split())}", arg="nodes") from None
    if hybrid is not None:
        return Mesh(hybrid, tuple(sizes), axis_types=types)
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=types, devices=devices)


def abstract_mesh(mesh: Any, axis_types: str | Sequence[AxisType] | None = None) -> AbstractMesh:
    """The :class:`~jax.sharding.AbstractMesh` to trace under (``plan``, ``tune``: shapes only, no devices).

    ``mesh`` is a Mesh or AbstractMesh (its axis types are kept) or an
    ordered ``{axis: size}`` mapping (``Auto`` axes); ``axis_types``
    (``"auto"``, ``"explicit"`` or one AxisType per axis) overrides either.
    A model that uses ``Explicit``-only ops (``einsum(..., out_sharding=)``)
    traces only under the axis types it runs with.

    Example::

        >>> from partitioning.mesh import abstract_mesh
        >>> abstract_mesh({"fsdp": 4, "tensor": 2}, "explicit").axis_types
        (Explicit, Explicit)
    """
    if isinstance(mesh, (Mesh, AbstractMesh)) and axis_types is None:
        return mesh.abstract_mesh if isinstance(mesh, Mesh) else mesh
    sizes = {str(k): int(v) for k, v in (mesh.items() if isinstance(mesh, Mapping) else mesh.shape.items())}
    if axis_types is None:
        axis_types = "auto"
    if isinstance(axis_types, str):
        if axis_types not in AXIS_TYPES:
            raise MeshError(f"axis_types must be one of {sorted(AXIS_TYPES)}, got {axis_types!r}")
        types = (AXIS_TYPES[axis_types],) * len(sizes)
    else:
        types = tuple(axis_types)
    return AbstractMesh(tuple(sizes.values()), tuple(sizes), axis_types=types)


def _simulate_hint(spec: MeshSpec, visible: int) -> str:
    """How to get the devices a mesh needs on a CPU: simulate them, before JAX starts."""
    fixed = math.prod(s for _, s in spec.axes if s != -1)
    n = fixed * max(1, math.ceil(8 / fixed)) if any(s == -1 for _, s in spec.axes) else fixed
    if n <= visible:
        return ""
    return (
        f" (on a CPU, simulate devices: call partitioning.simulate_devices({n}) before any JAX computation, "
        f"or set XLA_FLAGS=--xla_force_host_platform_device_count={n} before starting Python)"
    )


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: Any):
    """Sets the mesh (``jax.set_mesh``) and the rule table together.

    The rules are validated against the mesh on entry; both are restored on
    exit. Inside, :func:`with_logical_constraint` and boxed params constrain.

    Example::

        >>> from partitioning import make_mesh, sharding_context
        >>> with sharding_context(make_mesh({"data": 1, "fsdp": -1}), "fsdp") as (mesh, rules):
        ...     print(dict(mesh.shape), rules.resolve(("embed", "mlp")))
        {'data': 1, 'fsdp': 8} P('fsdp', None)
    """
    rules = as_rules(rules).validate(mesh)
    with jax.set_mesh(mesh), axis_rules(rules):
        yield mesh, rules


__all__ = [
    "MeshSpec",
    "make_mesh",
    "abstract_mesh",
    "sharding_context",
    "AXIS_TYPES",
    "nodes_problem",
    "node_ids",
    "mesh_node_ids",
]
