"""The rule walk: logical dimension names -> mesh axes, exactly as Flax does it.

For an array whose dimensions carry logical names ``(n_1, ..., n_k)`` the rules
are walked in order; a rule claims dimension ``i`` when its logical name is
``n_i``, the dimension is still unassigned and none of its mesh axes is used by
another dimension of the array. Later rules with the same logical name are
fallbacks; unclaimed dimensions are unsharded. This is
:func:`flax.linen.logical_to_mesh_axes` (a differential test keeps it so),
plus divisibility against a mesh and a per-dimension explanation.

Two more cases, both as Flax itself treats them:

- fewer names than dimensions (Flax's ``DenseGeneral`` and attention kernels
  are annotated this way): the trailing dimensions are unsharded, as in a
  short ``PartitionSpec``;
- a name no rule mentions that is an axis of the mesh (``nn.Partitioned``,
  NNX models annotated with mesh axes): that mesh axis, when the mesh is
  known and the axis is free. Without a mesh such a name is unsharded, which
  keeps exact parity with :func:`flax.linen.logical_to_mesh_axes`.

Example::

    >>> from partitioning.resolve import walk
    >>> walk([("embed", "fsdp"), ("mlp", "fsdp")], ["r0", "r1"], ("embed", "mlp"),
    ...      None, None, "error", "", None)
    ['fsdp', None]
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.errors import RuleError, ShardingError, did_you_mean

MeshAxes = None | str | tuple[str, ...]
Pair = tuple[str, MeshAxes]

ON_INDIVISIBLE = ("error", "replicate")


class IndivisibleWarning(UserWarning):
    """A dimension fell back to a later rule (or unsharded) for divisibility."""


def axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
    """``None`` -> ``()``, ``"a"`` -> ``("a",)``, a tuple -> itself."""
    if axes is None:
        return ()
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


def mesh_axis_sizes(mesh: Any) -> dict[str, int]:
    """``{axis: size}`` of a Mesh, AbstractMesh or plain mapping."""
    if mesh is None:
        return {}
    if isinstance(mesh, Mapping):
        return {str(k): int(v) for k, v in mesh.items()}
    return {str(k): int(v) for k, v in mesh.shape.items()}


def walk(
    rules: Sequence[Pair],
    origins: Sequence[str],
    names: Sequence[Any],
    shape: Sequence[int] | None,
    mesh: Any,
    on_indivisible: str,
    path: str,
    log: list | None,
) -> list[MeshAxes]:
    """One mesh-axes entry per dimension of an array named ``names`` (see the module docstring).

    With ``shape`` and ``mesh`` divisibility is checked (``on_indivisible``);
    with ``log`` a :class:`DimExplanation` per dimension is appended.
    """
    if on_indivisible not in ON_INDIVISIBLE:
        raise RuleError(f"on_indivisible must be one of {ON_INDIVISIBLE}, got {on_indivisible!r}")
    names = tuple(names)
    where = f"{path}: " if path else ""
    dups = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if dups:
        raise RuleError(
            f"{where}logical name(s) {', '.join(map(repr, dups))} used for more than one "
            f"dimension of array {names!r}; each dimension needs its own name"
        )
    if shape is not None and len(names) > len(shape):
        raise ShardingError(
            f"{where}{len(names)} logical names {names!r} for an array of rank {len(shape)} "
            f"(shape {tuple(shape)}); give at most one name per dimension"
        )
    given = len(names)
    if shape is not None:
        names = names + (None,) * (len(shape) - len(names))  # trailing dimensions: unsharded
    sizes = mesh_axis_sizes(mesh)
    unassigned = object()
    result: list[Any] = [unassigned if isinstance(n, str) else n for n in names]
    owner: dict[str, int] = {}  # mesh axis -> dim that uses it
    for i, n in enumerate(names):
        if not isinstance(n, str):
            for a in axes_tuple(n) if isinstance(n, tuple) else ():
                owner.setdefault(a, i)
    claimed_by: dict[int, int] = {}
    skipped: dict[int, list[str]] = {i: [] for i in range(len(names))}
    # Mesh-axis names are placed first: like a tuple of mesh axes, they name the layout directly.
    by_axis = _mesh_axis_names(rules, names, result, owner, sizes, shape, skipped, where)
    for r, (logical, axes) in enumerate(rules):
        if logical not in names:
            continue
        i = names.index(logical)
        rule_s = f"rule {r} {(logical, axes)!r}"
        if result[i] is not unassigned:
            skipped[i].append(f"skipped {rule_s}: dim {i} already claimed by rule {claimed_by.get(i)}")
            continue
        busy = [a for a in axes_tuple(axes) if a in owner]
        if busy:
            a = busy[0]
            j = owner[a]
            skipped[i].append(f"skipped {rule_s}: mesh axis {a!r} already used by dim {j} ({names[j]!r})")
            continue
        if shape is not None and sizes:
            missing = [a for a in axes_tuple(axes) if a not in sizes]
            if missing:
                raise RuleError(
                    f"{origins[r]}: mesh axis {missing[0]!r} is not a mesh axis "
                    f"({', '.join(sizes)}){did_you_mean(missing[0], sizes)}"
                )
            n_shards = math.prod(sizes[a] for a in axes_tuple(axes))
            if shape[i] % n_shards:
                msg = (
                    f"{where}dim {i} ({logical!r}, size {shape[i]}) is not divisible by mesh axes "
                    f"{axes_tuple(axes)!r} of size {n_shards}"
                )
                if on_indivisible == "error":
                    raise ShardingError(msg + "; change the rule or the size, or set on_indivisible: replicate")
                warnings.warn(msg + "; falling back to the next rule or unsharded", IndivisibleWarning, stacklevel=4)
                skipped[i].append(f"skipped {rule_s}: size {shape[i]} not divisible by {n_shards}")
                continue
        result[i] = axes
        claimed_by[i] = r
        for a in axes_tuple(axes):
            owner[a] = i
    out = [None if x is unassigned else x for x in result]
    if log is not None:
        for i, n in enumerate(names):
            rule = rules[claimed_by[i]] if i in claimed_by else None
            if i >= given:
                skipped[i].append("no name (a trailing dimension): unsharded")
            elif isinstance(n, str) and not skipped[i] and i not in claimed_by:
                skipped[i].append(f"no rule for {n!r}")
            log.append(
                DimExplanation(
                    dim=i,
                    name=n,
                    size=None if shape is None else int(shape[i]),
                    mesh_axes=out[i],
                    rule_index=claimed_by.get(i),
                    rule=(rule[0], rule[1]) if rule is not None else None,
                    notes=tuple(skipped[i]),
                    by_mesh_axis=i in by_axis,
                )
            )
    return out


def _mesh_axis_names(rules, names, result, owner, sizes, shape, skipped, where) -> set[int]:
    """Names no rule mentions that are mesh axes take that axis (unless another dim already holds it)."""
    if not sizes:
        return set()
    mentioned = {logical for logical, _ in rules}
    taken: set[int] = set()
    for i, n in enumerate(names):
        if not isinstance(n, str) or n in mentioned or n not in sizes:
            continue
        if n in owner:
            skipped[i].append(f"mesh-axis name {n!r}: axis already used by dim {owner[n]} ({names[owner[n]]!r})")
            continue
        if shape is not None and shape[i] % sizes[n]:
            raise ShardingError(
                f"{where}dim {i} (mesh axis {n!r}, size {shape[i]}) is not divisible by the mesh axis size {sizes[n]}"
            )
        result[i] = n
        owner[n] = i
        taken.add(i)
        skipped[i].append(f"mesh-axis name: no rule mentions {n!r} and it is a mesh axis")
    return taken


@dataclasses.dataclass(frozen=True)
class DimExplanation:
    """How one array dimension was assigned (see :meth:`Rules.explain`).

    Example::

        >>> d = pt.Rules.preset("fsdp").explain(("embed", "mlp"))[1]
        >>> d.name, d.mesh_axes, d.claimed
        ('mlp', None, False)
    """

    dim: int
    name: Any
    size: int | None
    mesh_axes: MeshAxes
    rule_index: int | None
    rule: Pair | None
    notes: tuple[str, ...]
    by_mesh_axis: bool = False  # the name is a mesh axis no rule mentions

    @property
    def claimed(self) -> bool:
        return self.rule_index is not None

    def __str__(self) -> str:
        target = "unsharded" if self.mesh_axes is None else repr(self.mesh_axes)
        head = f"dim {self.dim} {self.name!r} -> {target}"
        if self.claimed:
            head += f" by rule {self.rule_index} {self.rule!r}"
        notes = [n for n in self.notes]
        return head + ("; " + "; ".join(notes) if notes else "")


__all__ = [
    "walk",
    "DimExplanation",
    "IndivisibleWarning",
    "axes_tuple",
    "mesh_axis_sizes",
    "MeshAxes",
    "Pair",
    "ON_INDIVISIBLE",
]
