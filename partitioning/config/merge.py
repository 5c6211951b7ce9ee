"""How config layers combine: a ``base:`` file under a derived one, and ``--set`` on top, with one rule.

A mapping merges key by key into the one it overrides — in a derived file and
in ``--set`` alike — except where its keys are one value: ``mesh.shape`` (the
axes are ordered), the rule tables, and a mapping that names another thing to
build (another ``_target_``, another model ``name``), whose keys are that
thing's arguments. Those replace whole. ``--set a.b.c=v`` sets the one key it
names (``--set mesh.shape.tensor=2`` changes one axis).

Also here: ``{data:2}`` is YAML for the key ``"data:2"`` with no value; such
keys are found so the error can say that YAML needs a space after the colon.

Example::

    >>> from partitioning.config.merge import glued_keys, replaces
    >>> replaces(("mesh", "shape"), {"data": 1, "fsdp": -1}, {"data": -1})
    True
    >>> replaces(("train",), {"steps": 5}, {"batch_size": 8})
    False
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from partitioning.yamlfile import Key, Lines

TARGET = "_target_"

# Mappings whose keys are one value, not separate settings: the mesh's axes are ordered and the rule
# tables are tables. A derived config or a --set that gives one replaces it whole.
WHOLE = {("mesh", "shape"), ("rules",), ("optimizer_rules",)}


def replaces(key: Key, old: Any, new: Any) -> bool:
    """Whether ``new`` at ``key`` replaces ``old`` whole instead of merging into it key by key.

    Mappings merge key by key (``base:`` and ``--set`` alike), except ``mesh.shape``
    and the rule tables, and a mapping that names another thing to build (its
    ``_target_``, or the model's ``name``): its keys are that thing's arguments.
    """
    if not isinstance(old, dict) or not isinstance(new, dict) or tuple(key) in WHOLE:
        return True
    heads = (TARGET, "name") if tuple(key) == ("model",) else (TARGET,)
    return any(h in new and new[h] != old.get(h) for h in heads) or (
        tuple(key) == ("model",) and any(h in new for h in heads) and any(h in old and h not in new for h in heads)
    )


def merge(base: dict, base_lines: Lines, over: dict, over_lines: Lines, key: Key = ()) -> None:
    """Merges ``over`` into ``base`` in place (see :func:`replaces`); lines follow the value that wins."""
    for k, v in over.items():
        sub = key + (k,)
        if not replaces(sub, base.get(k), v):
            base_lines[sub] = over_lines.get(sub, base_lines.get(sub))
            merge(base[k], base_lines, v, over_lines, sub)
            continue
        base[k] = v
        for old in [x for x in base_lines if x[: len(sub)] == sub]:
            del base_lines[old]
        base_lines.update({x: line for x, line in over_lines.items() if x[: len(sub)] == sub})


def paths(value: Any, key: Key = ()) -> list[Key]:
    """``key`` and the key of every value under it."""
    out = [key]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, key + (k,))
    return out


GLUED = re.compile(r"^[\w.\-]+:[^\s/]")


def glued_keys(value: Any) -> list[str]:
    """Mapping keys like ``data:2`` with no value: ``{data:2}`` is YAML for ``{"data:2": null}``."""
    if isinstance(value, Mapping):
        out = [k for k, v in value.items() if v is None and isinstance(k, str) and GLUED.match(k)]
        return out + [k for v in value.values() for k in glued_keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in glued_keys(v)]
    return []


def unglue(text: str) -> str:
    return re.sub(r",(?=\S)", ", ", re.sub(r"(?<=[\w\-]):(?=[^\s/])", ": ", text))


__all__ = ["WHOLE", "replaces", "merge", "paths", "GLUED", "glued_keys", "unglue"]
