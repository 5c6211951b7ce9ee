"""Meshes from ordered ``{axis: size}`` mappings, and the mesh + rules context.

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

    @classmethod
    def from_mapping(cls, shape: Mapping[str, int] | Sequence[tuple[str, int]], axis_types: str = "auto") -> MeshSpec:
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
        return cls(tuple((n, int(s)) for n, s in items), axis_types)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

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


def make_mesh(
    shape: Mapping[str, int] | Sequence[tuple[str, int]] | MeshSpec,
    axis_types: str = "auto",
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A :class:`jax.sharding.Mesh` from an ordered ``{axis: size}`` mapping.

    One size may be ``-1`` (filled from the device count). Device order comes
    from :func:`jax.make_mesh`, which knows the hardware topology.

    Example::

        >>> from partitioning import make_mesh
        >>> mesh = make_mesh({"data": 2, "fsdp": -1})
        >>> dict(mesh.shape)
        {'data': 2, 'fsdp': 4}
    """
    spec = shape if isinstance(shape, MeshSpec) else MeshSpec.from_mapping(shape, axis_types)
    visible = devices is None
    devices = list(devices) if devices is not None else jax.devices()
    try:
        sizes = spec.resolve(len(devices))
    except MeshError as e:
        if not visible or jax.default_backend() != "cpu":
            raise
        raise MeshError(f"{e}{_simulate_hint(spec, len(devices))}") from None
    types = (AXIS_TYPES[spec.axis_types],) * len(sizes)
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


__all__ = ["MeshSpec", "make_mesh", "abstract_mesh", "sharding_context", "AXIS_TYPES"]
