"""The replication warning: most of a tree would be whole on every device because nothing named it.

A model with no logical names (a plain Flax model), or names no rule and no
mesh axis matches, is replicated in full on every device — correct, but
usually not what a rule table that shards parameters was meant to do.
:func:`~partitioning.tree_layouts`, :func:`~partitioning.tree_shardings` and
the :class:`~partitioning.Trainer` warn with :class:`ReplicationWarning`
(a ``UserWarning``: filter it like any other) when such arrays hold at least
:data:`WARN_SHARE` of the tree's bytes, saying the share, which arrays have
no names and which names matched nothing. Replication the table asks for
(pure data parallelism: only the batch is split; a rule mapping a name to
``None``) is never warned about.

Example::

    >>> import warnings
    >>> warnings.simplefilter("ignore", pt.ReplicationWarning)   # a plain model on purpose
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.errors import user_stacklevel
from partitioning.fmt import fmt_bytes, fmt_mesh
from partitioning.resolve import axes_tuple

WARN_SHARE = 0.5  # of the tree's bytes, in arrays replicated because nothing matched their names
LISTED = 3  # arrays / names named in the message


class ReplicationWarning(UserWarning):
    """Most of a tree would be replicated on every device because no rule or mesh axis matched it.

    Example::

        >>> import warnings
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(nn.Dense(64).init, jax.random.key(0), jnp.zeros((8, 64)))  # no logical names
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", pt.ReplicationWarning)   # make it fatal in CI
        ...     pt.tree_shardings(abstract, mesh, "fsdp")
        Traceback (most recent call last):
        partitioning.replication.ReplicationWarning: 100% of the state (16.25 KiB of 16.25 KiB) is replicated on \
every device of mesh {data: 1, fsdp: 8}: 2 arrays have no logical names (params/bias, params/kernel). ...
    """


def _shards_params(rules: Any, sizes: Mapping[str, int]) -> bool:
    """Whether the table (or the mesh) is meant to split something besides the batch."""
    batch = set(rules.batch_axes)
    if any(n > 1 and a not in batch for a, n in sizes.items()):
        return True
    return any(name != "batch" and any(sizes.get(a, 1) > 1 for a in axes_tuple(axes)) for name, axes in rules)


def _unmatched(layout: Any) -> bool:
    """Replicated because nothing matched: no names, or names no rule claimed and no mesh axis filled."""
    if not layout.replicated or layout.size <= 1:
        return False
    if layout.names is None:
        return True
    return not layout.dims or all(d.rule_index is None and not d.by_mesh_axis for d in layout.dims)


def check_replication(layouts: Sequence[Any], sizes: Mapping[str, int], rules: Any, *, stacklevel: int = 3) -> None:
    """Warns (:class:`ReplicationWarning`) when arrays nothing matched hold a large share of ``layouts``' bytes."""
    if math.prod(sizes.values() or [1]) <= 1 or not _shards_params(rules, sizes):
        return
    total = sum(leaf.nbytes for leaf in layouts if leaf.size > 1)
    lost = [leaf for leaf in layouts if _unmatched(leaf)]
    share = sum(leaf.nbytes for leaf in lost) / total if total else 0.0
    if not lost or share < WARN_SHARE:
        return
    unnamed = [leaf.path for leaf in lost if leaf.names is None]
    names = sorted(
        {str(n) for leaf in lost if leaf.names is not None for n in leaf.names if n is not None}
        - set(rules.logical_names)
    )
    parts = []
    if unnamed:
        more = f" and {len(unnamed) - LISTED} more" if len(unnamed) > LISTED else ""
        parts.append(f"{len(unnamed)} arrays have no logical names ({', '.join(unnamed[:LISTED])}{more})")
    if names:
        more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
        parts.append(f"no rule or mesh axis matches the names {', '.join(map(repr, names[:LISTED]))}{more}")
    warnings.warn(
        f"{share:.0%} of the state ({fmt_bytes(sum(leaf.nbytes for leaf in lost))} of {fmt_bytes(total)}) "
        f"is replicated on every device of mesh {fmt_mesh(sizes)}: {'; '.join(parts)}. Name the dimensions "
        f"(pt.with_logical_partitioning, nnx.with_partitioning) or add rules for their names; a model you cannot "
        f"edit is named by path (`annotations:`, which `partitioning annotate` proposes)",
        ReplicationWarning,
        stacklevel=user_stacklevel(),
    )


__all__ = ["ReplicationWarning", "check_replication", "WARN_SHARE"]
