"""Rule tables: ordered logical-axis -> mesh-axes mappings.

A rule table is an ordered list of ``(logical_name, mesh_axes)`` pairs where
``mesh_axes`` is ``None``, one mesh axis name or a tuple of names; how an
array's names resolve against it is the rule walk (:mod:`partitioning.resolve`,
exactly :func:`flax.linen.logical_to_mesh_axes`). Here: building tables (pairs,
YAML forms, presets), validating them against a mesh, and the rule context.

Parameter layout vs compute layout: a parameter is *stored* in its rule spec
and *used* in its compute spec, the rule spec minus the mesh axes that split
the batch (FSDP gathers a weight before using it). Those axes are
:attr:`Rules.batch_axes`: declared with the table (``batch_axes:`` in YAML),
else the mesh axes of the rules for the logical name ``batch``.

The rule context in force (:mod:`partitioning.context`) is Flax's own
thread-local store holding a :class:`Rules`.

Example::

    >>> from partitioning import Rules
    >>> rules = Rules([("batch", ("data", "fsdp")), ("embed", "fsdp"), ("mlp", "tensor")])
    >>> rules.resolve(("embed", "mlp"))
    P('fsdp', 'tensor')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.core.spmd as flax_spmd
from jax.sharding import PartitionSpec

from partitioning.errors import ConfigError, RuleError, did_you_mean
from partitioning.fmt import fmt_rule
from partitioning.follows import NAMED as NAMED_FOLLOWS
from partitioning.follows import parse_follows
from partitioning.resolve import MeshAxes, TableWalk, axes_tuple, mesh_axis_sizes
from partitioning.yamlfile import Key, Lines, read_yaml
from partitioning.yamlfile import where as _where

# Where the preset YAML files live; `configs/rules` in the repo links here so
# an installed wheel carries the same presets.
PRESET_DIR = Path(__file__).parent / "presets"


def _norm_axes(value: Any, where: str) -> MeshAxes:
    # PartitionSpec.UNCONSTRAINED: the dimension is left to XLA (Flax resolves it so too).
    if value is None or isinstance(value, str) or value is PartitionSpec.UNCONSTRAINED:
        return value
    if isinstance(value, (list, tuple)):
        if not all(isinstance(a, str) for a in value):
            raise RuleError(f"{where}: mesh axes must be names (strings), got {list(value)!r}")
        if len(set(value)) != len(value):
            raise RuleError(f"{where}: mesh axis repeated in {list(value)!r}")
        return tuple(value)
    raise RuleError(
        f"{where}: mesh axes must be null, a mesh axis name or a list of names, got {type(value).__name__} {value!r}"
    )


class Rules(TableWalk, tuple):
    """An immutable, ordered rule table.

    It *is* a tuple of ``(logical, mesh_axes)`` pairs, so it can be handed to
    any Flax function that takes rules. ``origins`` optionally records, per
    rule, where it came from (``"configs/x.yaml:12: rules[3]"``) so errors can
    point at the line. ``batch_axes`` declares the mesh axes that split the
    batch (see :attr:`batch_axes`); by default they are read off the rules.
    ``follows`` maps names to the logical names they are laid out as
    (``{"activation_embed": "embed"}``, or ``"activations"``: MaxText's
    activation names; :mod:`partitioning.follows`); every preset has it.

    Example::

        >>> from partitioning import Rules
        >>> rules = Rules.preset("fsdp")
        >>> rules.resolve(("embed", "mlp"))
        P('fsdp', None)
        >>> rules.batch_axes
        ('data', 'fsdp')
    """

    origins: tuple[str, ...]
    declared_batch_axes: tuple[str, ...] | None
    follows: dict[str, str]

    def __new__(
        cls,
        pairs: Iterable[Any] = (),
        origins: Sequence[str] | None = None,
        *,
        batch_axes: Sequence[str] | str | None = None,
        follows: Any = None,
    ):
        pairs = list(pairs)
        if origins is None:
            origins = [f"rules[{i}]" for i in range(len(pairs))]
        normed = []
        for pair, where in zip(pairs, origins, strict=False):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RuleError(f"{where}: a rule is a pair [logical_name, mesh_axes], got {pair!r}")
            logical, axes = pair
            if not isinstance(logical, str) or not logical:
                raise RuleError(f"{where}: logical name must be a non-empty string, got {logical!r}")
            normed.append((logical, _norm_axes(axes, where)))
        self = super().__new__(cls, normed)
        self.origins = tuple(origins)
        self.declared_batch_axes = None if batch_axes is None else axes_tuple(_norm_axes(batch_axes, "batch_axes"))
        self.follows = parse_follows(follows, "follows")
        return self

    # -- construction --------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> Rules:
        """The preset table ``partitioning/presets/NAME.yaml`` (dp, fsdp, tp, fsdp_tp, seq, ...)."""
        path = PRESET_DIR / f"{name}.yaml"
        if not path.exists():
            names = preset_names()
            raise RuleError(f"unknown rule preset {name!r} (presets: {', '.join(names)}){did_you_mean(name, names)}")
        table = cls.from_yaml(path)
        # Name the shipped file the same on every machine: presets/fsdp.yaml:13: rules[2].
        origins = [o.replace(str(PRESET_DIR), "presets", 1) for o in table.origins]
        return Rules(list(table), origins, batch_axes=table.declared_batch_axes, follows=table.follows)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Rules:
        """Reads a rules file: a list of pairs, or a mapping with ``rules:`` (and ``batch_axes:``, ``follows:``).

        Example::

            >>> import pathlib, tempfile
            >>> from partitioning import Rules
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "my_rules.yaml"
            >>> _ = path.write_text("[[batch, [data, fsdp]], [embed, fsdp]]")
            >>> Rules.from_yaml(path)[0]
            ('batch', ('data', 'fsdp'))
        """
        path = Path(path)
        data, lines = read_yaml(path, "rules file")
        if isinstance(data, Mapping):
            valid = ["rules", "batch_axes", "follows", "mesh"]
            for k in data:  # first: a misspelt `rules:` is named as such, not reported missing
                if k not in valid:
                    raise ConfigError(
                        f"{_where(path, lines, (k,))}: unknown key (valid: {', '.join(valid)})"
                        f"{did_you_mean(str(k), valid)}"
                    )
            if "rules" not in data:
                raise ConfigError(f"{path}: a rules file needs a top-level 'rules:' list")
            rules = cls.parse(data["rules"], path, lines, ("rules",))
            if data.get("batch_axes") is not None:
                rules = rules.with_batch_axes(_parse_axes(data["batch_axes"], path, lines, ("batch_axes",)))
            return rules.with_follows(_parse_follows(data.get("follows"), path, lines, ("follows",)))
        return cls.parse(data, path, lines, ())

    @classmethod
    def parse(cls, value: Any, path: str | Path = "", lines: Lines | None = None, key: Key = ()) -> Rules:
        """A rule table from its YAML forms; errors name ``path:line: key``.

        ``value`` is a preset name, a rules file (``x.yaml``, relative to
        ``path``'s folder or the current directory), a list of
        ``[logical, mesh_axes]`` pairs, or ``{preset: NAME, extra: [...],
        batch_axes: [...], follows: ...}`` (extra rules take precedence over the preset's).

        Example::

            >>> from partitioning import Rules
            >>> Rules.parse({"preset": "fsdp", "extra": [["heads", "tensor"]]})[0]
            ('heads', 'tensor')
        """
        lines = lines if lines is not None else {}
        here = _where(path, lines, key)
        if isinstance(value, str):
            if value.endswith((".yaml", ".yml")):
                f = Path(value)
                if not f.is_absolute() and not f.exists() and path:
                    f = Path(path).parent / f
                if not f.exists():
                    raise ConfigError(f"{here}: no such rules file {value!r}")
                return cls.from_yaml(f)
            try:
                return cls.preset(value)
            except RuleError as e:
                raise ConfigError(f"{here}: {e}") from None
        if isinstance(value, Mapping):
            valid = ("preset", "extra", "batch_axes", "follows")
            for k in value:
                if k not in valid:
                    raise ConfigError(
                        f"{_where(path, lines, key + (k,))}: unknown key (valid: {', '.join(valid)})"
                        f"{did_you_mean(str(k), valid)}"
                    )
            base = cls.parse(value["preset"], path, lines, key + ("preset",)) if "preset" in value else cls()
            extra = cls.parse(value.get("extra") or [], path, lines, key + ("extra",))
            rules = extra + base
            if value.get("batch_axes") is not None:
                rules = rules.with_batch_axes(_parse_axes(value["batch_axes"], path, lines, key + ("batch_axes",)))
            return rules.with_follows(_parse_follows(value.get("follows"), path, lines, key + ("follows",)))
        if isinstance(value, list):
            origins = [_where(path, lines, key + (i,)) for i in range(len(value))]
            try:
                return cls(value, origins)
            except RuleError as e:
                raise ConfigError(str(e)) from None
        raise ConfigError(
            f"{here}: rules must be a preset name ({', '.join(preset_names())}), a list of "
            f"[logical, mesh_axes] pairs, or {{preset: NAME, extra: [...]}}; got {type(value).__name__}"
        )

    def with_batch_axes(self, batch_axes: Sequence[str] | str | None) -> Rules:
        """The same table with ``batch_axes`` declared (``None``: read them off the rules)."""
        return Rules(list(self), list(self.origins), batch_axes=batch_axes, follows=self.follows)

    def with_follows(self, follows: Any) -> Rules:
        """The same table with ``follows`` added (a mapping or a set name; these take precedence)."""
        if not follows:
            return self
        merged = parse_follows(follows, "follows") | {k: v for k, v in self.follows.items() if k not in follows}
        return Rules(list(self), list(self.origins), batch_axes=self.declared_batch_axes, follows=merged)

    def __add__(self, other: Iterable[Any]) -> Rules:
        other = other if isinstance(other, Rules) else Rules(other)
        declared = self.declared_batch_axes if self.declared_batch_axes is not None else other.declared_batch_axes
        follows = other.follows | self.follows  # the first table's win, as its rules do
        pairs, origins = list(self) + list(other), list(self.origins) + list(other.origins)
        return Rules(pairs, origins, batch_axes=declared, follows=follows)

    def __repr__(self) -> str:
        extra = "" if self.declared_batch_axes is None else f", batch_axes={self.declared_batch_axes!r}"
        if self.follows:
            extra += f", follows={{...{len(self.follows)} names}}"
        return f"Rules({list(self)!r}{extra})"

    def __reduce__(self):
        return (_rebuild, (list(self), list(self.origins), self.declared_batch_axes, self.follows))

    def to_config(self) -> Any:
        """The YAML form: the pairs, or ``{extra: pairs, batch_axes: ..., follows: ...}`` when it has those."""
        if self.declared_batch_axes is None and not self.follows:
            return self.to_list()
        out: dict[str, Any] = {"extra": self.to_list()}
        if self.declared_batch_axes is not None:
            out["batch_axes"] = list(self.declared_batch_axes)
        if self.follows:
            out["follows"] = "activations" if self.follows == NAMED_FOLLOWS["activations"] else dict(self.follows)
        return out

    @property
    def logical_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self))

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes that split the batch: declared, else those of every ``batch`` rule.

        A parameter is computed with in its rule spec minus these axes (see
        :func:`partitioning.boxes.compute_spec`): FSDP stores a weight split over a
        batch axis and gathers it before use.
        """
        if self.declared_batch_axes is not None:
            return self.declared_batch_axes
        return tuple(dict.fromkeys(a for n, axes in self if n == "batch" for a in axes_tuple(axes)))

    @property
    def token_axes(self) -> tuple[str, ...]:
        """The mesh axes that split the activations' tokens: :attr:`batch_axes`, then those ``length`` takes.

        A parameter is computed with in its rule spec minus these axes (:func:`partitioning.boxes.compute_spec`):
        a device holding some of the tokens needs the whole weight, so a weight stored split over them (FSDP
        over ``fsdp``, and over ``context`` in ``fsdp_cp``) is gathered before use.

        Example::

            >>> pt.Rules.preset("fsdp_cp").token_axes, pt.Rules.preset("fsdp_tp").token_axes
            (('data', 'fsdp', 'context'), ('data', 'fsdp'))
        """
        spec = self.resolve(("batch", "length"))
        length = axes_tuple(spec[1]) if spec is not None and len(spec) > 1 else ()
        return tuple(dict.fromkeys((*self.batch_axes, *length)))

    @property
    def batch_axes_origin(self) -> str:
        """Where :attr:`batch_axes` come from, for ``explain``."""
        if self.declared_batch_axes is not None:
            return "declared (batch_axes)"
        idx = [i for i, (n, _) in enumerate(self) if n == "batch"]
        if not idx:
            return "no rule for 'batch' and none declared: parameters are used as stored"
        return "from " + ", ".join(f"rule {i} {fmt_rule(self[i])}" for i in idx)

    def batch_spec(self, ndim: int = 1) -> PartitionSpec:
        """The spec of an input whose dim 0 is the batch: declared axes, else the ``batch`` rule walk."""
        if self.declared_batch_axes is not None:
            axes = self.declared_batch_axes
            head = None if not axes else axes[0] if len(axes) == 1 else axes
            return PartitionSpec(head, *([None] * (ndim - 1)))
        return self.resolve(("batch",) + (None,) * (ndim - 1))

    def to_list(self) -> list[list[Any]]:
        """JSON/YAML-friendly form: ``[[logical, axes], ...]``."""
        return [[n, list(a) if isinstance(a, tuple) else a] for n, a in self]

    # -- validation ----------------------------------------------------------
    def validate(self, mesh: Any) -> Rules:
        """Checks every mesh axis named by a rule exists in ``mesh``."""
        sizes = mesh_axis_sizes(mesh)
        for (_, axes), where in zip(self, self.origins, strict=False):
            for a in axes_tuple(axes):
                if a not in sizes:
                    raise RuleError(
                        f"{where}: mesh axis {a!r} is not a mesh axis ({', '.join(sizes)}){did_you_mean(a, sizes)}"
                    )
        for a in self.declared_batch_axes or ():
            if a not in sizes:
                raise RuleError(f"batch_axes: {a!r} is not a mesh axis ({', '.join(sizes)}){did_you_mean(a, sizes)}")
        return self


def preset_names() -> list[str]:
    """The names of the shipped presets.

    Example::

        >>> from partitioning.rules import preset_names
        >>> "fsdp" in preset_names(), "fsdp_tp" in preset_names()
        (True, True)
    """
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def table_mesh(source: str | Path) -> dict[str, int] | None:
    """The mesh a rule table is meant for: the ``mesh:`` of a preset or rules file (None: it names none).

    ``source`` is a preset name or a rules file. The sizes are a mesh shape
    (one may be ``-1``, the rest of the devices).

    Example::

        >>> pt.rules.table_mesh("fsdp_tp")
        {'data': 1, 'fsdp': -1, 'tensor': 2}
    """
    if str(source) not in preset_names() and not str(source).endswith((".yaml", ".yml")) and not Path(source).exists():
        Rules.preset(str(source))  # not a file: an unknown preset, named with the nearest one
    path = PRESET_DIR / f"{source}.yaml" if str(source) in preset_names() else Path(source)
    data, lines = read_yaml(path, "rules file")
    mesh = data.get("mesh") if isinstance(data, Mapping) else None
    if mesh is None:
        return None
    ok = (
        isinstance(mesh, Mapping)
        and mesh
        and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and (v >= 1 or v == -1)
            for k, v in mesh.items()
        )
    )
    if not ok:
        raise ConfigError(f"{_where(path, lines, ('mesh',))}: expected a mesh shape such as {{data: 1, fsdp: -1}}")
    return dict(mesh)


def as_rules(rules: Any) -> Rules:
    """Coerces a preset name, a sequence of pairs or a :class:`Rules` to Rules."""
    if isinstance(rules, Rules):
        return rules
    if rules is None:
        # The rule context in force: Flax's thread-local store (see partitioning.context).
        current = flax_spmd.get_logical_axis_rules()
        return current if isinstance(current, Rules) else Rules(current)
    if isinstance(rules, str):
        return Rules.preset(rules)
    return Rules(rules)


def _rebuild(pairs: list[Any], origins: list[str], batch_axes: Any, follows: Any = None) -> Rules:
    return Rules(pairs, origins, batch_axes=batch_axes, follows=follows)


def _parse_follows(value: Any, path: Any, lines: Lines, key: Key) -> dict[str, str]:
    try:
        return parse_follows(value, _where(path, lines, key))
    except RuleError as e:
        raise ConfigError(str(e)) from None


def _parse_axes(value: Any, path: Any, lines: Lines, key: Key) -> tuple[str, ...]:
    try:
        return axes_tuple(_norm_axes(value, _where(path, lines, key)))
    except RuleError as e:
        raise ConfigError(str(e)) from None
