"""``annotations:`` in a run config: the table parsed with each row's ``file:line``, its names checked.

A name in a row must be one some rule table knows — the config's rules (and
their ``follows``), any preset's, a mesh axis, or Flax's ``kv`` — so a typo (``emebd``) is an
error at the row's line under every table, while a name this table does not
shard (``heads`` under ``fsdp``) is fine: annotations serve every layout.

Example::

    >>> from partitioning.config.annotations import known_names
    >>> {"embed", "mlp", "heads", "layers", "vocab"} <= known_names(pt.Rules.preset("fsdp"), {"data": 1})
    True
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from partitioning.annotations import Annotations
from partitioning.errors import PartitioningError
from partitioning.rules import Rules, preset_names
from partitioning.yamlfile import Lines

# Flax's names for dimensions the presets leave whole on purpose (a head's size, heads x head size).
CONVENTIONAL = ("kv", "joined_kv")


@functools.cache
def _preset_names() -> frozenset[str]:
    out: set[str] = set()
    for name in preset_names():
        table = Rules.preset(name)
        out |= set(table.logical_names) | set(table.follows)
    return frozenset(out)


def known_names(rules: Rules | None, mesh_shape: Mapping[str, Any]) -> set[str]:
    """Logical names a row may use: the rules' (with ``follows``), every preset's, and the mesh axes."""
    out = set(_preset_names()) | set(mesh_shape) | set(CONVENTIONAL)
    if rules is not None:
        out |= set(rules.logical_names) | set(rules.follows)
    return out


def parse_annotations(
    value: Any, path: str, lines: Lines, rules: Rules | None, mesh_shape: Mapping[str, Any], errors: list[str]
) -> Annotations | None:
    """The config's table, or ``None`` with its error appended to ``errors`` (``file:line: annotations[i]: ...``)."""
    try:
        table = Annotations.parse(value, path, lines, ("annotations",))
        table.check_names(known_names(rules, mesh_shape))
        return table
    except PartitioningError as e:
        errors.append(str(e))
        return None


__all__ = ["parse_annotations", "known_names"]
