"""Rule tables: ordered logical-axis -> mesh-axes mappings.

A rule table is an ordered list of ``(logical_name, mesh_axes)`` pairs where
``mesh_axes`` is ``None``, one mesh axis name or a tuple of names. For an array
whose dimensions carry logical names the rules are walked in order; a rule
claims dimension ``i`` when its logical name is ``names[i]``, the dimension is
still unassigned and none of its mesh axes is used by another dimension of the
array. Later rules with the same logical name are fallbacks. This is exactly
:func:`flax.linen.logical_to_mesh_axes` (a differential test keeps it so); the
toolkit adds mesh validation, divisibility and ``explain``.

Example::

    >>> from partitioning import Rules
    >>> rules = Rules([("batch", ("data", "fsdp")), ("embed", "fsdp"), ("mlp", "tensor")])
    >>> rules.resolve(("embed", "mlp"))
    P('fsdp', 'tensor')
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import jax
from jax.sharding import PartitionSpec

from partitioning.errors import RuleError, ShardingError, did_you_mean

MeshAxes = Union[None, str, tuple[str, ...]]
Pair = tuple[str, MeshAxes]

# Where the preset YAML files live; `configs/rules` in the repo links here so
# an installed wheel carries the same presets.
PRESET_DIR = Path(__file__).parent / "presets"

ON_INDIVISIBLE = ("error", "replicate")


class IndivisibleWarning(UserWarning):
    """A dimension fell back to a later rule (or unsharded) for divisibility."""


def _norm_axes(value: Any, where: str) -> MeshAxes:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        if not all(isinstance(a, str) for a in value):
            raise RuleError(f"{where}: mesh axes must be names (strings), got {list(value)!r}")
        if len(set(value)) != len(value):
            raise RuleError(f"{where}: mesh axis repeated in {list(value)!r}")
        return tuple(value)
    raise RuleError(
        f"{where}: mesh axes must be null, a mesh axis name or a list of names, "
        f"got {type(value).__name__} {value!r}"
    )


def axes_tuple(axes: MeshAxes) -> tuple[str, ...]:
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


class Rules(tuple):
    """An immutable, ordered rule table.

    It *is* a tuple of ``(logical, mesh_axes)`` pairs, so it can be handed to
    any Flax function that takes rules. ``origins`` optionally records, per
    rule, where it came from (``"configs/x.yaml:12: rules[3]"``) so errors can
    point at the line.

    Example::

        >>> rules = Rules.preset("fsdp")
        >>> rules.resolve(("embed", "mlp"))
        P('fsdp',)
    """

    origins: tuple[str, ...]

    def __new__(cls, pairs: Iterable[Any] = (), origins: Sequence[str] | None = None):
        pairs = list(pairs)
        if origins is None:
            origins = [f"rules[{i}]" for i in range(len(pairs))]
        normed = []
        for i, (pair, where) in enumerate(zip(pairs, origins)):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RuleError(
                    f"{where}: a rule is a pair [logical_name, mesh_axes], got {pair!r}"
                )
            logical, axes = pair
            if not isinstance(logical, str) or not logical:
                raise RuleError(f"{where}: logical name must be a non-empty string, got {logical!r}")
            normed.append((logical, _norm_axes(axes, where)))
        self = super().__new__(cls, normed)
        self.origins = tuple(origins)
        return self

    # -- construction --------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "Rules":
        """The preset table ``configs/rules/NAME.yaml`` (dp, fsdp, tp, fsdp_tp, seq)."""
        path = PRESET_DIR / f"{name}.yaml"
        if not path.exists():
            names = preset_names()
            raise RuleError(
                f"unknown rule preset {name!r} (presets: {', '.join(names)}){did_you_mean(name, names)}"
            )
        return cls.from_yaml(path)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Rules":
        """Reads a YAML file holding a list of pairs or ``{rules: [...]}``."""
        from partitioning import config as _config  # config owns YAML + line numbers

        return _config.load_rules_file(path)

    def __add__(self, other: Iterable[Any]) -> "Rules":  # type: ignore[override]
        other = other if isinstance(other, Rules) else Rules(other)
        return Rules(list(self) + list(other), list(self.origins) + list(other.origins))

    def __repr__(self) -> str:
        return f"Rules({list(self)!r})"

    def __reduce__(self):
        return (Rules, (list(self), list(self.origins)))

    @property
    def logical_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self))

    def to_list(self) -> list[list[Any]]:
        """JSON/YAML-friendly form: ``[[logical, axes], ...]``."""
        return [[n, list(a) if isinstance(a, tuple) else a] for n, a in self]

    # -- validation ----------------------------------------------------------
    def validate(self, mesh: Any) -> "Rules":
        """Checks every mesh axis named by a rule exists in ``mesh``."""
        sizes = mesh_axis_sizes(mesh)
        for (logical, axes), where in zip(self, self.origins):
            for a in axes_tuple(axes):
                if a not in sizes:
                    raise RuleError(
                        f"{where}: mesh axis {a!r} is not a mesh axis ({', '.join(sizes)})"
                        f"{did_you_mean(a, sizes)}"
                    )
        return self

    # -- resolution ----------------------------------------------------------
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
        return PartitionSpec(*self._resolve(names, shape, mesh, on_indivisible, path, None))

    def explain(
        self, names: Sequence[Any], shape: Sequence[int] | None = None, mesh: Any = None,
        *, on_indivisible: str = "replicate", path: str = "",
    ) -> list["DimExplanation"]:
        """Per dimension: the rule that claimed it and why earlier ones were skipped.

        Example::

            >>> for d in Rules([("embed", "fsdp"), ("mlp", "fsdp")]).explain(("embed", "mlp")):
            ...     print(d)
            dim 0 'embed' -> 'fsdp' by rule 0 ('embed', 'fsdp')
            dim 1 'mlp' -> unsharded; skipped rule 1 ('mlp', 'fsdp'): mesh axis 'fsdp' already used by dim 0 ('embed')
        """
        log: list[DimExplanation] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IndivisibleWarning)
            self._resolve(names, shape, mesh, on_indivisible, path, log)
        return log

    def resolve_explained(
        self, names: Sequence[Any], shape: Sequence[int] | None = None, mesh: Any = None,
        *, on_indivisible: str = "error", path: str = "",
    ) -> tuple[PartitionSpec, list["DimExplanation"]]:
        """:meth:`resolve` and :meth:`explain` in one walk of the rules (warns like resolve)."""
        log: list[DimExplanation] = []
        spec = PartitionSpec(*self._resolve(names, shape, mesh, on_indivisible, path, log))
        return spec, log

    def _resolve(self, names, shape, mesh, on_indivisible, path, log):
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
        if shape is not None and len(shape) != len(names):
            raise ShardingError(
                f"{where}{len(names)} logical names {names!r} for an array of rank {len(shape)} "
                f"(shape {tuple(shape)})"
            )
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
        for r, (logical, axes) in enumerate(self):
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
                skipped[i].append(
                    f"skipped {rule_s}: mesh axis {a!r} already used by dim {j} ({names[j]!r})"
                )
                continue
            if shape is not None and sizes:
                missing = [a for a in axes_tuple(axes) if a not in sizes]
                if missing:
                    raise RuleError(
                        f"{self.origins[r]}: mesh axis {missing[0]!r} is not a mesh axis "
                        f"({', '.join(sizes)}){did_you_mean(missing[0], sizes)}"
                    )
                n_shards = math.prod(sizes[a] for a in axes_tuple(axes))
                if shape[i] % n_shards:
                    msg = (
                        f"{where}dim {i} ({logical!r}, size {shape[i]}) is not divisible by mesh axes "
                        f"{axes_tuple(axes)!r} of size {n_shards}"
                    )
                    if on_indivisible == "error":
                        raise ShardingError(
                            msg + "; change the rule or the size, or set on_indivisible: replicate"
                        )
                    warnings.warn(msg + "; falling back to the next rule or unsharded",
                                  IndivisibleWarning, stacklevel=4)
                    skipped[i].append(f"skipped {rule_s}: size {shape[i]} not divisible by {n_shards}")
                    continue
            result[i] = axes
            claimed_by[i] = r
            for a in axes_tuple(axes):
                owner[a] = i
        out = [None if x is unassigned else x for x in result]
        if log is not None:
            for i, n in enumerate(names):
                if isinstance(n, str) and not skipped[i] and i not in claimed_by:
                    skipped[i].append(f"no rule for {n!r}")
                log.append(DimExplanation(
                    dim=i, name=n, size=None if shape is None else int(shape[i]),
                    mesh_axes=out[i], rule_index=claimed_by.get(i),
                    rule=self[claimed_by[i]] if i in claimed_by else None,
                    notes=tuple(skipped[i]),
                ))
        return out


@dataclasses.dataclass(frozen=True)
class DimExplanation:
    """How one array dimension was assigned (see :meth:`Rules.explain`)."""

    dim: int
    name: Any
    size: int | None
    mesh_axes: MeshAxes
    rule_index: int | None
    rule: Pair | None
    notes: tuple[str, ...]

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


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def as_rules(rules: Any) -> Rules:
    """Coerces a preset name, a sequence of pairs or a :class:`Rules` to Rules."""
    if isinstance(rules, Rules):
        return rules
    if rules is None:
        return get_logical_axis_rules()
    if isinstance(rules, str):
        return Rules.preset(rules)
    return Rules(rules)


# -- thread-local context (Flax's names and signatures) ------------------------

_context = threading.local()


def _stack() -> list[Rules]:
    if not hasattr(_context, "stack"):
        _context.stack = [Rules()]
    return _context.stack


def get_logical_axis_rules() -> Rules:
    """The rule table of this thread's innermost :func:`axis_rules` context.

    Falls back to rules set through Flax's own ``nn.axis_rules`` so modules
    and code written for Flax see the same table.
    """
    rules = _stack()[-1]
    if not rules:
        import flax.linen as nn

        flax_rules = nn.get_logical_axis_rules()
        if flax_rules:
            return Rules(flax_rules)
    return rules


def set_logical_axis_rules(rules: Any) -> None:
    """Sets this thread's rule table (also for Flax's ``nn`` functions)."""
    import flax.linen as nn

    rules = as_rules(rules) if rules is not None else Rules()
    _stack()[-1] = rules
    nn.set_logical_axis_rules(tuple(rules))


@contextlib.contextmanager
def axis_rules(rules: Any):
    """Context manager that sets the rule table for this thread.

    Example::

        >>> with axis_rules([("embed", "fsdp")]):
        ...     logical_to_mesh_axes(("embed", None))
        P('fsdp', None)
    """
    import flax.linen as nn

    rules = as_rules(rules)
    stack = _stack()
    stack.append(rules)
    try:
        with nn.logical_axis_rules(tuple(rules)):
            yield rules
    finally:
        stack.pop()


def logical_to_mesh_axes(array_dim_names: Sequence[Any] | None, rules: Any = None) -> PartitionSpec | None:
    """Flax-compatible: the PartitionSpec for logical dimension names."""
    return as_rules(rules).resolve(array_dim_names)


def _is_logical_leaf(x: Any) -> bool:
    from partitioning.boxes import is_box

    return isinstance(x, PartitionSpec) or is_box(x)


def _leaf_names(x: Any):
    from partitioning.boxes import is_box

    return tuple(x.names) if is_box(x) else x


def logical_to_mesh(tree: Any, rules: Any = None) -> Any:
    """Flax-compatible: maps a pytree of logical PartitionSpecs (or boxes) to mesh specs."""
    rules = as_rules(rules)
    return jax.tree.map(lambda x: rules.resolve(_leaf_names(x)), tree, is_leaf=_is_logical_leaf)


def logical_to_mesh_sharding(tree: Any, mesh: jax.sharding.Mesh, rules: Any = None) -> Any:
    """Flax-compatible: a pytree of logical PartitionSpecs (or boxes) -> NamedShardings."""
    specs = logical_to_mesh(tree, rules)
    return jax.tree.map(
        lambda s: jax.sharding.NamedSharding(mesh, s), specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
