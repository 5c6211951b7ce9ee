"""What the layer stacks and expert layers of a traced forward pass look like, for the plan's analytic costs.

Inside :func:`recording`, every :class:`~partitioning.parallel.pipeline.LayerStack`
(or ``scan_layers``) and every expert layer traced in this thread appends a
record: the stack's layers, stages, micro-batches and the activation that
flows between stages; an expert layer's experts, capacity and the tokens it
dispatches. ``plan`` turns them into bytes per step
(:mod:`partitioning.plan.parallel`).

Example::

    >>> from partitioning.models import GPT
    >>> from partitioning.parallel.trace import recording
    >>> model, tokens = GPT(embed=64, mlp=128, layers=4), jnp.zeros((8, 16), jnp.int32)
    >>> params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    >>> with recording() as seen, pt.sharding_context(pt.make_mesh({"stage": 4, "data": 2}), "pp"):
    ...     _ = jax.eval_shape(model.apply, params, tokens)
    >>> seen[0]["kind"], seen[0]["stages"], seen[0]["microbatches"]
    ('pipeline', 4, 4)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_local = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Collects the records of the stacks and expert layers traced in this thread."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    seen: list[dict[str, Any]] = []
    stack.append(seen)
    try:
        yield seen
    finally:
        stack.pop()


def record(kind: str, **info: Any) -> None:
    """Adds ``{"kind": kind, **info}`` to the innermost :func:`recording` (if any)."""
    stack = getattr(_local, "stack", None)
    if stack:
        stack[-1].append({"kind": kind, **info})


__all__ = ["recording", "record"]
