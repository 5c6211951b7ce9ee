"""Names from outside the model: an ordered table of ``[path_regex, names]`` rows.

A model nobody annotated (Flax's ImageNet ResNet, plain ``nnx.Linear`` stacks,
an ``init`` function returning a dict) gets its logical names here, by
parameter path, without touching its code. Each row is a regular expression
searched (:func:`re.search`) in the ``/``-joined path ``plan`` prints
(``params/block_0/Dense_0/kernel``) and one logical name (or ``None``) per
dimension; the first row that matches a leaf names it, and a leaf no row
matches keeps its own names (or none). Rows name *logical* axes, never mesh
axes, so one table serves every rule table and mesh.

The table is applied to the abstract tree before the rule walk: each matched
leaf becomes an :class:`AnnotatedBox` (a logical box that remembers its row),
so the optimizer state built from the annotated params mirrors them (adam's
``mu``/``nu`` get the same names) and ``rules explain`` / ``plan`` say which
row named each dimension. A leaf of an optimizer state handed over on its own
(``opt_state/0/mu/<param path>``) matches as ``params/<param path>``; a factored
one (adafactor's ``v_row``/``v_col``: one dimension less) takes that row's names
less the dimension the optimizer dropped (:func:`factored_names`). A row whose regex
names ``opt_state`` is for optimizer-state paths (``opt_state/0/mu/...``): applied to the moments it matches
wherever the optimizer state is built (the Trainer, ``plan``, :func:`~partitioning.tree_layouts` of a whole
state), never to params.

Mistakes are one line naming the row (``file:line: annotations[2]``): a bad
regex, a row whose names do not match the leaf's rank, a name no rule table
knows; a row matching nothing warns (:class:`AnnotationWarning`) or, with
``strict``, is an error -- and a row every array of which an earlier row takes
is named as shadowed, with that row.

Example::

    >>> ann = pt.Annotations([[r"kernel$", ["embed", "mlp"]], [r"bias$", ["mlp"]]])
    >>> abstract = jax.eval_shape(nn.Dense(64).init, jax.random.key(0), jnp.zeros((8, 32)))
    >>> leaf = pt.tree_layouts(abstract, {"data": 1, "fsdp": 8}, "fsdp", annotations=ann)[1]
    >>> leaf.path, leaf.names, leaf.spec, leaf.named_by
    ('params/kernel', ('embed', 'mlp'), P('fsdp', None), 'annotations[0]')
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import flax.struct
import jax
from flax import nnx

from partitioning.boxes import LogicallyPartitioned, is_box, is_logical_box
from partitioning.errors import ConfigError, did_you_mean, user_stacklevel
from partitioning.paths import path_str
from partitioning.yamlfile import Key, Lines, read_yaml
from partitioning.yamlfile import where as _where


class AnnotationError(ConfigError):
    """A row of an annotation table is wrong: bad regex, wrong rank, unknown name, or (strict) unmatched."""


class AnnotationWarning(UserWarning):
    """A row of an annotation table matched no leaf of the tree it was applied to."""


class AnnotatedBox(LogicallyPartitioned):
    """A logical box whose names came from an annotation row.

    ``named_by`` is the row (``file:line: annotations[3]``, or ``annotations[3]``
    from Python); ``replaced`` the names the model gave the leaf itself, if any.

    Example::

        >>> from partitioning.annotations import AnnotatedBox
        >>> AnnotatedBox(jnp.zeros((4, 8)), ("embed", "mlp"), named_by="annotations[0]").named_by
        'annotations[0]'
    """

    named_by: str | None = flax.struct.field(pytree_node=False, default=None)
    replaced: tuple[Any, ...] | None = flax.struct.field(pytree_node=False, default=None)


def _is_leaf(x: Any) -> bool:
    return is_box(x) or isinstance(x, nnx.Variable)


class Row:
    """One row: a compiled path regex, one name per dimension, and where the row was written."""

    __slots__ = ("pattern", "regex", "names", "origin")

    def __init__(self, pattern: str, names: tuple[str | None, ...], origin: str):
        self.pattern, self.names, self.origin = pattern, names, origin
        try:
            self.regex = re.compile(pattern)
        except re.error as e:
            raise AnnotationError(f"{origin}: {pattern!r} is not a regular expression: {e}") from None

    def __repr__(self) -> str:
        return f"[{self.pattern!r}, {list(self.names)!r}]"


def _row(value: Any, origin: str) -> Row:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise AnnotationError(
            f"{origin}: a row is [path_regex, names], e.g. ['Dense_\\d+/kernel$', [embed, mlp]]; got {value!r}"
        )
    pattern, names = value
    if not isinstance(pattern, str) or not pattern:
        raise AnnotationError(f"{origin}: the path regex must be a non-empty string, got {pattern!r}")
    if not isinstance(names, (list, tuple)) or not all(n is None or (isinstance(n, str) and n) for n in names):
        raise AnnotationError(
            f"{origin}: names must be a list of logical names or null, one per dimension; got {names!r}"
        )
    dups = sorted({n for n in names if n is not None and list(names).count(n) > 1})
    if dups:
        raise AnnotationError(f"{origin}: {dups[0]!r} names more than one dimension of {list(names)!r}")
    return Row(pattern, tuple(names), origin)


class Annotations:
    """An ordered annotation table: rows ``[path_regex, names]``, the first match wins.

    ``origins`` records where each row was written (``file:line: annotations[i]``);
    ``strict`` makes a row that matches nothing an error instead of a warning.

    Example::

        >>> ann = pt.Annotations([[r"Dense_\\d+/kernel$", ["embed", "mlp"]]])
        >>> ann.names_for("params/Dense_1/kernel"), ann.names_for("params/Dense_1/bias")
        (('embed', 'mlp'), None)
    """

    def __init__(self, rows: Iterable[Any] = (), origins: Sequence[str] | None = None, *, strict: bool = False):
        rows = list(rows)
        origins = list(origins) if origins is not None else [f"annotations[{i}]" for i in range(len(rows))]
        self.rows = tuple(_row(r, o) for r, o in zip(rows, origins, strict=True))
        self.strict = bool(strict)
        self._warned: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __repr__(self) -> str:
        return f"Annotations({list(self.rows)!r}{', strict=True' if self.strict else ''})"

    # -- YAML ---------------------------------------------------------------------------------
    @classmethod
    def parse(cls, value: Any, path: str = "", lines: Lines | None = None, key: Key = ("annotations",)) -> Annotations:
        """From YAML: a list of rows, ``{rows: [...], strict: true}``, or a file holding ``annotations:``
        (what ``partitioning annotate --out`` writes; relative to ``path``'s folder or the current one).
        Errors name ``file:line: key``."""
        lines = lines if lines is not None else {}
        strict = False
        if isinstance(value, str) and value.endswith((".yaml", ".yml")):
            return cls._from_file(value, path, _where(path, lines, key))
        if isinstance(value, Mapping):
            for k in value:
                if k not in ("rows", "strict"):
                    raise AnnotationError(
                        f"{_where(path, lines, key + (k,))}: unknown key (valid: rows, strict)"
                        f"{did_you_mean(str(k), ('rows', 'strict'))}"
                    )
            strict = value.get("strict", False)
            if not isinstance(strict, bool):
                raise AnnotationError(f"{_where(path, lines, key + ('strict',))}: expected true or false")
            key, value = key + ("rows",), value.get("rows") or []
        if not isinstance(value, list):
            raise AnnotationError(
                f"{_where(path, lines, key)}: expected a list of [path_regex, names] rows, got {type(value).__name__}"
            )
        return cls(value, [_where(path, lines, key + (i,)) for i in range(len(value))], strict=strict)

    @classmethod
    def _from_file(cls, name: str, path: str, here: str) -> Annotations:
        f = Path(name)
        if not f.is_absolute() and not f.exists() and path:
            f = Path(path).parent / f
        if not f.exists() and path:  # named in a config: say where; else read_yaml says it as the CLI does
            raise AnnotationError(f"{here}: no such annotations file {name!r}")
        data, lines = read_yaml(f, "annotations file")
        if not isinstance(data, Mapping) or "annotations" not in data:
            raise AnnotationError(f"{f}: an annotations file has an `annotations:` key (partitioning annotate --out)")
        return cls.parse(data["annotations"], str(f), lines)

    def to_config(self) -> Any:
        """The YAML form (what ``config show`` prints)."""
        rows = [[r.pattern, list(r.names)] for r in self.rows]
        return {"rows": rows, "strict": True} if self.strict else rows

    # -- matching -----------------------------------------------------------------------------
    def match(self, path: str) -> tuple[int, Row] | None:
        """The first row whose regex is found in ``path`` (and its index), or ``None``."""
        for i, row in enumerate(self.rows):
            if row.regex.search(path):
                return i, row
        return None

    def names_for(self, path: str) -> tuple[str | None, ...] | None:
        """The names the table gives ``path``, or ``None`` when no row matches."""
        m = self.match(path)
        return None if m is None else m[1].names

    def check_names(self, known: Iterable[str]) -> None:
        """Raises for the first name in a row that is not in ``known`` (rule names, mesh axes)."""
        known = set(known)
        for row in self.rows:
            for n in row.names:
                if n is not None and n not in known:
                    shown = sorted(k for k in known if not k.startswith("activation_"))
                    raise AnnotationError(
                        f"{row.origin}: no rule table knows the logical name {n!r} (names: {', '.join(shown)})"
                        f"{did_you_mean(n, known)}"
                    )

    def apply(self, tree: Any) -> Any:
        """``tree`` with every leaf a row matches boxed in an :class:`AnnotatedBox` (see the module docstring)."""
        if not self.rows:
            return tree
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_leaf)
        used: set[int] = set()
        paths = [path_str(kp) for kp, _ in flat]
        shapes = {p: _shape(leaf) for p, (_, leaf) in zip(paths, flat, strict=True) if p.startswith("params/")}
        out = [self._one(p, leaf, used, shapes) for p, (_, leaf) in zip(paths, flat, strict=True)]
        self._report_unused(used, paths)
        return jax.tree_util.tree_unflatten(treedef, out)

    def _one(self, path: str, leaf: Any, used: set[int], shapes: dict[str, Any] | None = None) -> Any:
        m, mirrored = self.match(path), None
        if not path.startswith("params/") and (m is None or MOMENT_ROW not in m[1].pattern):
            # An optimizer moment (opt_state/0/mu/<param path>) takes its parameter's row (a row for moments,
            # naming opt_state, goes first); with the params in the tree, only a param's own path counts.
            parts = path.split("/")
            for i in range(1, len(parts)):
                q = "params/" + "/".join(parts[i:])
                found = self.match(q) if not shapes or q in shapes else None
                if found is not None:
                    m, mirrored = found, q
                    break
        if m is None:
            return leaf
        index, row = m
        if isinstance(leaf, nnx.Variable):
            leaf = leaf.get_value()
        value = leaf.value if is_box(leaf) else leaf
        shape = getattr(value, "shape", None)
        if shape is None:
            return leaf
        param = (shapes or {}).get(mirrored) if mirrored else None
        if param is not None and tuple(param) != tuple(shape):
            # Not the parameter's shape: a factored moment (adafactor's v_row / v_col) takes its names less the
            # dimension the optimizer drops; a placeholder ((1,)) stays unnamed.
            names = factored_names(row.names, param, shape, path)
            if names is None:
                return leaf
            used.add(index)
            return AnnotatedBox(value, names, named_by=f"{row.origin} (factored)")
        if len(row.names) != len(shape) and mirrored:
            return leaf  # a moment handed over without its params: not its parameter's shape
        if len(row.names) != len(shape):
            raise AnnotationError(
                f"{row.origin}: {len(row.names)} names {list(row.names)!r} for {path} of rank {len(shape)} "
                f"(shape {tuple(int(s) for s in shape)}); give one name (or null) per dimension"
            )
        used.add(index)
        own = tuple(leaf.names) if is_box(leaf) else None
        rules = leaf.rules if is_logical_box(leaf) else None
        return AnnotatedBox(value, row.names, rules=rules, named_by=row.origin, replaced=own)

    def apply_moments(self, opt_state: Any, prefix: str = "opt_state/") -> Any:
        """``opt_state`` (the optimizer state built from the annotated params) with the rows for optimizer-state
        paths (their regex names ``opt_state``) applied to the moments they match, as :meth:`apply` applies them
        to a whole train state: the Trainer, ``plan`` and :func:`~partitioning.tree_layouts` agree."""
        rows = [(i, r) for i, r in enumerate(self.rows) if MOMENT_ROW in r.pattern]
        if not rows:
            return opt_state

        def one(kp: Any, leaf: Any) -> Any:
            path = prefix + path_str(kp)
            m = next(((i, r) for i, r in enumerate(self.rows) if r.regex.search(path)), None)
            if m is None or MOMENT_ROW not in m[1].pattern:
                return leaf
            value = leaf.value if is_box(leaf) else leaf
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) != len(m[1].names):
                return leaf
            rules = leaf.rules if is_logical_box(leaf) else None
            own = tuple(leaf.names) if is_box(leaf) else None
            return AnnotatedBox(value, m[1].names, rules=rules, named_by=m[1].origin, replaced=own)

        return jax.tree_util.tree_map_with_path(one, opt_state, is_leaf=_is_leaf)

    def _report_unused(self, used: set[int], paths: Sequence[str]) -> None:
        moments = any(not p.startswith("params/") for p in paths)
        for i, row in enumerate(self.rows):
            if i in used or (MOMENT_ROW in row.pattern and not moments):
                continue  # a row for optimizer moments is applied where the optimizer state is built
            hits = [p for p in paths if row.regex.search(p)]
            first = self.match(hits[0]) if hits else None
            if first is not None and first[0] < i:
                other = first[1]
                msg = (
                    f"{row.origin}: {row.pattern!r} is shadowed by {other.origin} ({other.pattern!r}): the "
                    f"{len(hits)} array{'s' * (len(hits) != 1)} it matches ({hits[0]}{', ...' * (len(hits) > 1)}) are "
                    "named by that earlier row (the first match wins); move it above that row, or narrow that row"
                )
            else:
                msg = f"{row.origin}: {row.pattern!r} matches none of the {len(paths)} arrays of the model"
            if self.strict:
                raise AnnotationError(msg + " (strict)")
            if i not in self._warned:  # a table is applied to each abstract tree a command builds: say it once
                self._warned.add(i)
                warnings.warn(
                    msg if first is not None else msg + "; check the path against `partitioning plan`",
                    AnnotationWarning,
                    stacklevel=user_stacklevel(),
                )


def _shape(leaf: Any) -> Any:
    if isinstance(leaf, nnx.Variable):
        leaf = leaf.get_value()
    return getattr(leaf.value if is_box(leaf) else leaf, "shape", None)


MOMENT_ROW = "opt_state"  # a row whose regex names it is for optimizer-state paths (opt_state/0/mu/...)


def factored_names(names: Sequence[Any], param_shape: Sequence[int], shape: Sequence[int], path: str = "") -> Any:
    """The names of a factored moment: the parameter's ``names`` less the dimension the optimizer dropped.

    A factored second moment (optax's adafactor: ``v_row``, ``v_col``) has the parameter's shape less one
    dimension: the one whose removal gives ``shape``. Where two equal sizes make that ambiguous, the optimizer's
    own rule decides: ``v_row`` drops the largest dimension, ``v_col`` the second largest (ties by position, as
    ``np.argsort`` orders them). None when ``shape`` is no such shape (a ``(1,)`` placeholder).

    Example::

        >>> from partitioning.annotations import factored_names
        >>> factored_names(("embed", "mlp"), (64, 256), (64,), "opt_state/0/v_row/w")    # mlp (256) dropped
        ('embed',)
        >>> factored_names(("embed", "heads"), (64, 64), (64,), "opt_state/0/v_col/w")   # a tie: optax's rule
        ('heads',)
    """
    param_shape, shape = tuple(int(s) for s in param_shape), tuple(int(s) for s in shape)
    rank = len(param_shape)
    if len(names) != rank or len(shape) != rank - 1:
        return None
    dropped = [k for k in range(rank) if param_shape[:k] + param_shape[k + 1 :] == shape]
    if len(dropped) > 1:
        order = sorted(range(rank), key=lambda i: (param_shape[i], i))
        k = order[-1] if "/v_row/" in f"/{path}/" else order[-2]
        dropped = [k] if k in dropped else dropped[-1:]
    if not dropped:
        return None
    return tuple(names[: dropped[0]]) + tuple(names[dropped[0] + 1 :])


def as_annotations(value: Any) -> Annotations | None:
    """``None``, an :class:`Annotations`, or rows -> an :class:`Annotations` (or ``None``)."""
    if value is None or isinstance(value, Annotations):
        return value
    return Annotations(value)


def apply_annotations(tree: Any, annotations: Any) -> Any:
    """``tree`` annotated by ``annotations`` (anything :func:`as_annotations` takes); itself when ``None``."""
    table = as_annotations(annotations)
    return tree if table is None else table.apply(tree)


def named_by(leaf: Any) -> str | None:
    """The annotation row that named a (boxed) leaf (and the model's own names it replaced), or ``None``."""
    origin = getattr(leaf, "named_by", None)
    replaced = getattr(leaf, "replaced", None)
    if origin is None or replaced is None or tuple(replaced) == tuple(leaf.names):
        return origin
    return f"{origin} (over the model's {tuple(replaced)!r})"


__all__ = [
    "Annotations",
    "AnnotatedBox",
    "AnnotationError",
    "AnnotationWarning",
    "as_annotations",
    "apply_annotations",
    "factored_names",
    "named_by",
]
