"""Parameter paths as people read them: ``params/decoder/mlp/wi/kernel``.

The one spelling of a leaf's path that ``plan``, ``rules explain``, checkpoints'
metadata and annotation tables share.

Example::

    >>> from partitioning.paths import path_str
    >>> path_str(jax.tree_util.tree_flatten_with_path({"params": {"w": [1, 2]}})[0][1][0])
    'params/w/1'
"""

from __future__ import annotations

from typing import Any

import jax


def path_str(keypath: tuple[Any, ...]) -> str:
    """``params/decoder/mlp/wi/kernel`` for a jax key path (boxes' ``.value`` dropped)."""
    parts = []
    for k in keypath:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            if k.name != "value":
                parts.append(k.name)
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k))
    return "/".join(parts)


__all__ = ["path_str"]
