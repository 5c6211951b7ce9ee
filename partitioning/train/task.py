"""What a model is trained to do: the loss of its outputs on a batch.

Example::

    >>> loss, aux = lm_loss(model.apply(v, batch["inputs"]), batch)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from partitioning.boxes import logical_spec


def lm_loss(logits: jax.Array, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross entropy (nats per token) and accuracy.

    Example::

        >>> loss, aux = lm_loss(model.apply(v, batch["inputs"]), batch)
    """
    logits = logits.astype(jnp.float32)
    spec = logical_spec(("batch", "length", None))
    if spec is not None:
        # Explicit axes: the label gather cannot read a vocab-sharded row, so gather the vocab first.
        logits = jax.sharding.reshard(logits, spec)
    targets = batch["targets"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    accuracy = (jnp.argmax(logits, -1) == targets).mean()
    return loss, {"accuracy": accuracy}


__all__ = ["lm_loss"]
