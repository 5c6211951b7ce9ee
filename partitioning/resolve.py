"""The rule walk: logical dimension names -> mesh axes, exactly as Flax does it.

For an array whose dimensions carry logical names ``(n_1, ..., n_k)`` the rules are walked in order; a rule
claims dimension ``i`` when its logical name is ``n_i``, the dimension is still unassigned and none of its mesh
axes is used by another dimension of the array. Later rules with the same logical name are fallbacks; unclaimed
dimensions are unsharded. This is :func:`flax.linen.logical_to_mesh_axes` (a differential test keeps it so),
plus divisibility against a mesh and a per-dimension explanation.

Two more cases, both as Flax itself treats them:

- fewer names than dimensions (Flax's ``DenseGeneral`` and attention kernels
  are annotated this way): the trailing dimensions are unsharded, as in a
  short ``PartitionSpec``;
- a name no rule mentions that is an axis of the mesh (``nn.Partitioned``,
  NNX models annotated with mesh axes): that mesh axis, when the mesh is
  known. The rules are walked first; such a name only fills a dimension they
  left unassigned, and only when its axis is still free, so wherever
  :func:`flax.linen.logical_to_mesh_axes` assigns an axis the walk assigns
  the same, with or without a mesh. Without a mesh such a name is unsharded.

A rule whose mesh axes are ``PartitionSpec.UNCONSTRAINED`` claims its
dimension as unconstrained and uses no mesh axis (as in Flax).

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
from typing import Any, cast, overload

from jax.sharding import PartitionSpec

from partitioning.errors import RuleError, ShardingError, did_you_mean, user_stacklevel
from partitioning.fmt import fmt_rule
from partitioning.follows import canonical

MeshAxes = None | str | tuple[str, ...] | Any  # Any: PartitionSpec.UNCONSTRAINED
Pair = tuple[str, MeshAxes]

ON_INDIVISIBLE = ("error", "replicate")
REMEDY = "change the rule or the size, or set on_indivisible: replicate"  # an indivisible dimension's fix


class IndivisibleWarning(UserWarning):
    """A dimension fell back to a later rule (or unsharded) for divisibility."""


def axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
    """``None`` -> ``()``, ``"a"`` -> ``("a",)``, a tuple -> itself; ``P.UNCONSTRAINED`` uses no axis."""
    if axes is None or axes is PartitionSpec.UNCONSTRAINED:
        return ()
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


def mesh_axis_sizes(mesh: Any) -> dict[str, int]:
    """``{axis: size}`` of a Mesh, AbstractMesh or plain mapping."""
    shape = {} if mesh is None else mesh if isinstance(mesh, Mapping) else mesh.shape
    return {str(k): int(v) for k, v in shape.items()}


def walk(
    rules: Sequence[Pair],
    origins: Sequence[str],
    names: Sequence[Any],
    shape: Sequence[int] | None,
    mesh: Any,
    on_indivisible: str,
    path: str,
    log: list | None,
    *,
    unassigned_as: Any = None,
) -> list[Any]:
    """One mesh-axes entry per dimension of an array named ``names`` (see the module docstring).

    With ``shape`` and ``mesh`` divisibility is checked (``on_indivisible``);
    with ``log`` a :class:`DimExplanation` per dimension is appended. A named
    dimension nothing claimed is ``unassigned_as`` (unsharded, ``None``, by
    default; Flax's fallback modes tell it apart from a rule's ``None``).
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
    for r, (logical, axes) in enumerate(rules):
        if logical not in names:
            continue
        i = names.index(logical)
        rule_s = f"rule {r} {fmt_rule((logical, axes))}"
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
                    f"{axes_tuple(axes)!r} of size {n_shards} ({origins[r]})"
                )
                if on_indivisible == "error":
                    raise ShardingError(f"{msg}; {REMEDY}", arg="on_indivisible")
                warnings.warn(
                    msg + "; falling back to the next rule or unsharded",
                    IndivisibleWarning,
                    stacklevel=user_stacklevel(),
                )
                skipped[i].append(f"skipped {rule_s}: size {shape[i]} not divisible by {n_shards}")
                continue
        result[i], claimed_by[i] = axes, r
        for a in axes_tuple(axes):
            owner[a] = i
    # Then mesh-axis names, only where the rules left a dimension unassigned and the axis is free:
    # wherever Flax assigns an axis, the same axis is assigned here.
    by_axis = fill_mesh_axis_names(
        rules, names, result, unassigned, owner, sizes, shape, on_indivisible, skipped, where
    )
    out = [unassigned_as if x is unassigned else x for x in result]
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
                    mesh_axes=None if result[i] is unassigned else result[i],
                    rule_index=claimed_by.get(i),
                    rule=(rule[0], rule[1]) if rule is not None else None,
                    notes=tuple(skipped[i]),
                    by_mesh_axis=i in by_axis,
                )
            )
    return out


def fill_mesh_axis_names(
    rules: Sequence[Pair],
    names: Sequence[Any],
    result: list[Any],
    unassigned: Any,
    owner: dict[str, int],
    sizes: Mapping[str, int],
    shape: Sequence[int] | None = None,
    on_indivisible: str = "error",
    skipped: dict[int, list[str]] | None = None,
    where: str = "",
) -> set[int]:
    """Gives each still-``unassigned`` dimension whose name no rule mentions and is a free mesh axis that axis.

    Runs after the rule walk (``result`` and ``owner`` are its output, updated
    in place), so a rule never loses an axis to a mesh-axis name. Returns the
    dimensions filled. Without ``sizes`` (no mesh) nothing changes: Flax parity.
    """
    if not sizes:
        return set()
    skipped = skipped if skipped is not None else {}
    mentioned = {logical for logical, _ in rules}
    taken: set[int] = set()
    for i, n in enumerate(names):
        if result[i] is not unassigned or not isinstance(n, str) or n in mentioned or n not in sizes:
            continue
        notes = skipped.setdefault(i, [])
        if n in owner:
            j = owner[n]
            notes.append(f"mesh-axis name {n!r}: axis already used by dim {j} ({names[j]!r})")
            continue
        if shape is not None and shape[i] % sizes[n]:
            msg = f"{where}dim {i} (mesh axis {n!r}, size {shape[i]}) is not divisible by the mesh axis size {sizes[n]}"
            if on_indivisible == "error":
                raise ShardingError(msg + "; change the size, or set on_indivisible: replicate", arg="on_indivisible")
            warnings.warn(msg + "; unsharded", IndivisibleWarning, stacklevel=user_stacklevel())
            notes.append(f"mesh-axis name {n!r}: size {shape[i]} not divisible by {sizes[n]}")
            continue
        result[i] = n
        owner[n] = i
        taken.add(i)
        notes.append(f"mesh-axis name: no rule mentions {n!r} and it is a mesh axis")
    return taken


class TableWalk:
    """The resolution methods of a rule table (:class:`~partitioning.Rules` is one): the walk, with its
    ``follows`` renaming (:mod:`partitioning.follows`) first.

    Example::

        >>> pt.Rules([("embed", "fsdp")], follows={"activation_embed": "embed"}).resolve(("activation_embed",))
        P('fsdp',)
    """

    origins: tuple[str, ...]
    follows: dict[str, str]

    @overload
    def resolve(
        self,
        names: Sequence[Any],
        shape: Sequence[int] | None = None,
        mesh: Any = None,
        *,
        on_indivisible: str = "error",
        path: str = "",
    ) -> PartitionSpec: ...

    @overload
    def resolve(
        self,
        names: None,
        shape: Sequence[int] | None = None,
        mesh: Any = None,
        *,
        on_indivisible: str = "error",
        path: str = "",
    ) -> None: ...

    def resolve(
        self,
        names: Sequence[Any] | None,
        shape: Sequence[int] | None = None,
        mesh: Any = None,
        *,
        on_indivisible: str = "error",
        path: str = "",
    ) -> PartitionSpec | None:
        """The PartitionSpec for an array whose dimensions carry ``names``.

        With ``shape`` and ``mesh`` the divisibility of every claimed dimension
        is checked: ``on_indivisible='error'`` raises a :class:`ShardingError`
        naming ``path``; ``'replicate'`` skips that rule (a later rule for the
        name may claim the dimension) and warns.
        """
        if names is None:
            return None
        return PartitionSpec(*self._walk(names, shape, mesh, on_indivisible, path, None))

    def explain(
        self,
        names: Sequence[Any],
        shape: Sequence[int] | None = None,
        mesh: Any = None,
        *,
        on_indivisible: str = "replicate",
        path: str = "",
    ) -> list[DimExplanation]:
        """Per dimension: the rule that claimed it and why earlier ones were skipped.

        Example::

            >>> for d in pt.Rules([("embed", "fsdp"), ("mlp", "fsdp")]).explain(("embed", "mlp")):
            ...     print(d)
            dim 0 'embed' -> 'fsdp' by rule 0 [embed, fsdp]
            dim 1 'mlp' -> unsharded; skipped rule 1 [mlp, fsdp]: mesh axis 'fsdp' already used by dim 0 ('embed')
        """
        log: list[DimExplanation] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IndivisibleWarning)
            self._walk(names, shape, mesh, on_indivisible, path, log)
        return log

    def _walk(self, names, shape, mesh, on_indivisible, path, log, unassigned_as=None):
        original = tuple(names)
        names = canonical(original, self.follows)
        inner: list | None = [] if log is not None and names != original else log
        out = walk(
            cast(Sequence[Pair], self),
            self.origins,
            names,
            shape,
            mesh,
            on_indivisible,
            path,
            inner,
            unassigned_as=unassigned_as,
        )
        if inner is not None and inner is not log and log is not None:
            for d in inner:
                if d.dim < len(original) and original[d.dim] != names[d.dim]:
                    note = f"{original[d.dim]!r} follows {names[d.dim]!r}"
                    d = dataclasses.replace(d, name=original[d.dim], notes=(note, *d.notes))
                log.append(d)
        return out

    def axes(self, names: Sequence[Any], mesh: Any = None, *, unassigned_as: Any = None) -> list[Any]:
        """One mesh-axes entry per dimension (no shape checks); a dimension nothing claimed is ``unassigned_as``.

        Example::

            >>> pt.Rules([("batch", "data")]).axes(("batch", "other"), unassigned_as="?")
            ['data', '?']
        """
        return self._walk(names, None, mesh, "error", "", None, unassigned_as)

    def resolve_explained(
        self,
        names: Sequence[Any],
        shape: Sequence[int] | None = None,
        mesh: Any = None,
        *,
        on_indivisible: str = "error",
        path: str = "",
    ) -> tuple[PartitionSpec, list[DimExplanation]]:
        """:meth:`resolve` and :meth:`explain` in one walk of the rules (warns like resolve)."""
        log: list[DimExplanation] = []
        spec = PartitionSpec(*self._walk(names, shape, mesh, on_indivisible, path, log))
        return spec, log


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

    def __str__(self) -> str:  # rules as the YAML tables write them: ``rule 0 [embed, fsdp]``
        target = "unsharded" if self.mesh_axes is None else repr(self.mesh_axes)
        by = f" by rule {self.rule_index} {fmt_rule(self.rule)}" if self.rule is not None else ""
        return f"dim {self.dim} {self.name!r} -> {target}{by}" + "".join(f"; {n}" for n in self.notes)


__all__ = [
    "walk",
    "TableWalk",
    "fill_mesh_axis_names",
    "DimExplanation",
    "IndivisibleWarning",
    "axes_tuple",
    "mesh_axis_sizes",
    "MeshAxes",
    "Pair",
    "ON_INDIVISIBLE",
    "REMEDY",
]
