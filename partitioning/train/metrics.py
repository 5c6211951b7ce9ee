"""Metrics on the host: a step's device scalars as floats, and what a masked loss means when it counts nothing.

A masked loss (instruction data: :func:`~partitioning.model.task.masked_cross_entropy`) is a mean over the
tokens its mask counts (``loss_tokens``). A batch that counts none has no loss: its ``loss`` and
``accuracy`` are left out of what is logged (:func:`without_empty_loss`), never shown as 0; an evaluation
weighs each batch by its token count (:func:`evaluate`).

Example::

    >>> from partitioning.train.metrics import without_empty_loss
    >>> without_empty_loss({"loss": 1.5, "loss_tokens": 12.0})
    {'loss': 1.5, 'loss_tokens': 12.0}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from partitioning.train.state import TrainState, host_scalar

# Metrics a masked loss averages over its counted tokens (``loss_tokens``): none without a token.
TOKEN_MEANS = ("loss", "accuracy")


def host_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Device scalars -> host floats (each read from a local shard)."""
    return {k: host_scalar(v) for k, v in metrics.items()}


def evaluate(trainer: Any, state: Any, batches: Iterable[Any]) -> dict[str, float]:
    """Mean of the eval metrics over ``batches`` (host floats, prefixed ``eval_``).

    ``state`` is a :class:`TrainState` (its params and collections, e.g.
    BatchNorm statistics, are used) or just params.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> evals = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding, split="eval")
        >>> metrics = pt.train.evaluate(trainer, trainer.init(jax.random.key(0)), [evals.batch_at(i) for i in range(2)])
        >>> sorted(metrics)
        ['eval_accuracy', 'eval_loss']
    """
    sums: dict[str, float] = {}
    n, tokens = 0, 0.0
    for batch in batches:
        m = trainer.evaluate_state(state, batch) if isinstance(state, TrainState) else trainer.eval_step(state, batch)
        m = host_metrics(m)
        count = m.get("loss_tokens")
        # A masked loss is a mean over its tokens: batches weigh by their token counts, and none counts for nothing.
        weights = {k: count if count is not None and k in TOKEN_MEANS else 1.0 for k in m}
        sums = {k: sums.get(k, 0.0) + v * weights[k] for k, v in m.items()}
        n, tokens = n + 1, tokens + (count or 0.0)
    if not n:
        return {}
    if "loss_tokens" in sums and tokens == 0:  # nothing counted: no eval loss at all, never a loss of 0
        return {f"eval_{k}": v / n for k, v in sums.items() if k not in TOKEN_MEANS}
    return {f"eval_{k}": v / (tokens if "loss_tokens" in sums and k in TOKEN_MEANS else n) for k, v in sums.items()}


def without_empty_loss(host: dict[str, Any]) -> dict[str, Any]:
    """A step whose loss counted no token (``loss_tokens`` 0) has no loss and no accuracy: they are left out.

    Example::

        >>> from partitioning.train.metrics import without_empty_loss
        >>> without_empty_loss({"loss": 0.0, "accuracy": 0.0, "loss_tokens": 0.0, "grad_norm": 0.0})
        {'loss_tokens': 0.0, 'grad_norm': 0.0}
    """
    if host.get("loss_tokens") == 0:
        return {k: v for k, v in host.items() if k not in TOKEN_MEANS}
    return host


__all__ = ["host_metrics", "evaluate", "without_empty_loss", "TOKEN_MEANS"]
