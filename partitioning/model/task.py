"""What a model is trained to do: how a batch becomes model inputs, and the loss of the outputs.

A :class:`Task` is either

- ``loss(outputs, batch) -> loss`` or ``(loss, aux)``, with ``inputs(batch)``
  giving the model's positional arguments (default: ``batch["inputs"]``); or
- ``step(forward, batch) -> (loss, aux)``: full control — ``forward(*args,
  **kwargs)`` calls the model (with this step's params, collections, RNGs and
  train/eval mode) as often as the step needs.

Built in (``train.loss:`` in YAML):

- ``next_token`` — language modelling: logits at position ``t`` predict token
  ``t + 1``; targets are ``batch["targets"]`` (the data shifts them), or the
  inputs shifted by one when the batch has no targets; a batch with a
  ``loss_mask`` (instruction data) averages over the tokens it marks, and one
  with ``segment_ids`` / ``positions`` (packed rows) passes them to the model;
- ``same_token`` — for models that shift their inputs inside (Flax's lm1b):
  logits at ``t`` predict ``batch["inputs"][t]``;
- ``classification`` — logits ``(batch, classes)`` and integer ``batch["targets"]``.

Example::

    >>> import optax
    >>> from partitioning.model.task import as_task
    >>> task = as_task("same_token")
    >>> task = pt.Task(loss=lambda outputs, batch: optax.l2_loss(outputs, batch["targets"]).mean())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from partitioning.boxes import logical_spec
from partitioning.errors import ConfigError, did_you_mean


def cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean cross entropy (nats) of integer ``labels`` under ``logits`` (any leading shape), and accuracy.

    Example::

        >>> from partitioning.model.task import cross_entropy
        >>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0]])
        >>> loss, aux = cross_entropy(logits, jnp.array([0, 0]))
        >>> round(float(loss), 3), float(aux["accuracy"])
        (1.127, 0.5)
    """
    logits = logits.astype(jnp.float32)
    spec = logical_spec(("batch",) + (None,) * (logits.ndim - 1))
    if spec is not None:
        # Explicit axes: the label gather cannot read a class-sharded row, so gather the classes first.
        logits = jax.sharding.reshard(logits, spec)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = (jnp.argmax(logits, -1) == labels).mean()
    return loss, {"accuracy": accuracy}


def lm_loss(logits: jax.Array, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross entropy (nats per token) and accuracy.

    Targets are ``batch["targets"]``; without them, the inputs shifted by one.

    Example::

        >>> inputs = jnp.array([[1, 2, 3, 4]])
        >>> logits = jax.nn.one_hot(inputs + 1, 8) * 10   # predicts the next token
        >>> loss, aux = pt.model.lm_loss(logits, {"inputs": inputs})
        >>> float(aux["accuracy"])
        1.0
    """
    if "loss_mask" in batch:
        return masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
    if "targets" in batch:
        return cross_entropy(logits, batch["targets"])
    return cross_entropy(logits[:, :-1], batch["inputs"][:, 1:])


def masked_cross_entropy(
    logits: jax.Array, labels: jax.Array, mask: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross entropy and accuracy averaged over the tokens where ``mask`` is 1 (instruction data).

    Example::

        >>> from partitioning.model.task import masked_cross_entropy
        >>> logits = jnp.array([[[2.0, 0.0], [0.0, 2.0]]])
        >>> loss, aux = masked_cross_entropy(logits, jnp.array([[0, 0]]), jnp.array([[1.0, 0.0]]))
        >>> round(float(loss), 3), float(aux["accuracy"]), float(aux["loss_tokens"])
        (0.127, 1.0, 1.0)
    """
    logits = logits.astype(jnp.float32)
    spec = logical_spec(("batch",) + (None,) * (logits.ndim - 1))
    if spec is not None:
        logits = jax.sharding.reshard(logits, spec)
    mask = mask.astype(jnp.float32)
    count = mask.sum()
    per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    denom = jnp.maximum(count, 1.0)  # a batch with no counted token has loss 0, not NaN
    accuracy = ((jnp.argmax(logits, -1) == labels) * mask).sum() / denom
    return (per_token * mask).sum() / denom, {"accuracy": accuracy, "loss_tokens": count}


def lm_inputs(batch: Mapping[str, Any]) -> Any:
    """The model's arguments: ``batch["inputs"]``, and for packed rows its ``segment_ids`` and ``positions``.

    Packed rows call the model with keywords (``tokens=``, ``segment_ids=``, ``positions=``), as the
    reference GPT and the Hugging Face decoders take them.
    """
    if "segment_ids" in batch:
        return {"tokens": batch["inputs"], "segment_ids": batch["segment_ids"], "positions": batch["positions"]}
    return (batch["inputs"],)


def same_token_loss(logits: jax.Array, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross entropy of ``batch["inputs"]`` at the same positions (the model shifts inside)."""
    return cross_entropy(logits, batch["inputs"])


def classification_loss(logits: jax.Array, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross entropy of the integer class ``batch["targets"]`` under ``(batch, classes)`` logits."""
    return cross_entropy(logits, batch["targets"])


def default_inputs(batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """The model's positional arguments: ``batch["inputs"]``."""
    return (batch["inputs"],)


@dataclasses.dataclass(frozen=True)
class Task:
    """A loss (with how the batch becomes model inputs) or a whole custom step.

    Example::

        >>> import optax
        >>> def my_loss(outputs, batch):
        ...     return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label"]).mean()
        >>> task = pt.Task(loss=my_loss, inputs=lambda b: (b["image"],))
        >>> def contrastive(forward, batch):   # a whole custom step: the model called twice
        ...     a, b = forward(batch["a"]), forward(batch["b"])
        ...     return jnp.mean((a - b) ** 2), {}
        >>> task = pt.Task(step=contrastive)
    """

    loss: Callable[..., Any] | None = None
    inputs: Callable[[Any], Any] = default_inputs  # batch -> positional args (tuple) or kwargs (dict)
    step: Callable[..., Any] | None = None
    name: str = "custom"

    def __post_init__(self):
        if (self.loss is None) == (self.step is None):
            raise ConfigError("a task needs exactly one of loss(outputs, batch) or step(forward, batch)")

    def run(self, forward: Callable[..., Any], batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(loss, aux)`` of one batch, calling the model through ``forward``."""
        if self.step is not None:
            out = self.step(forward, batch)
        else:
            assert self.loss is not None  # __post_init__: exactly one of loss and step
            args, kwargs = model_inputs(self, batch)
            out = self.loss(forward(*args, **kwargs), batch)
        loss, aux = out if isinstance(out, tuple) else (out, {})
        return jnp.asarray(loss, jnp.float32), dict(aux)


def model_inputs(task: Task, batch: Any) -> tuple[tuple, dict]:
    """The model's ``(positional, keyword)`` arguments for ``batch`` under ``task`` (its ``inputs`` gives a
    tuple of positional arguments, or a mapping of keyword arguments)."""
    args = task.inputs(batch)
    return ((), dict(args)) if isinstance(args, Mapping) else (tuple(args), {})


def sown_losses(tree: Any) -> dict[str, jax.Array]:
    """Loss terms a model sowed (``self.sow("losses", name, value)``): ``{name: total}``.

    Values under one sow name (per layer, per scanned step, per module) are summed.

    Example::

        >>> from partitioning.model.task import sown_losses
        >>> sown_losses({"blocks": {"mlp": {"moe_aux_loss": (jnp.ones(4),)}}})
        {'moe_aux_loss': Array(4., dtype=float32)}
    """
    out: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [k.key for k in path if isinstance(getattr(k, "key", None), str)]
        name = keys[-1] if keys else "aux_loss"
        out[name] = out.get(name, 0.0) + jnp.sum(leaf).astype(jnp.float32)
    return out


BUILTIN = {
    "next_token": Task(loss=lm_loss, inputs=lm_inputs, name="next_token"),
    "same_token": Task(loss=same_token_loss, name="same_token"),
    "classification": Task(loss=classification_loss, name="classification"),
}


def as_task(task: Any) -> Task:
    """A :class:`Task` from a built-in name, a loss function ``(outputs, batch)``, or a Task.

    Example::

        >>> from partitioning.model.task import as_task
        >>> def my_loss(outputs, batch):
        ...     return jnp.mean(outputs)
        >>> as_task("next_token").name, as_task(my_loss).name
        ('next_token', 'my_loss')
    """
    if task is None:
        return BUILTIN["next_token"]
    if isinstance(task, Task):
        return task
    if isinstance(task, str):
        if task not in BUILTIN:
            raise ConfigError(
                f"unknown loss {task!r} (built in: {', '.join(BUILTIN)}; or a function "
                f"via _target_){did_you_mean(task, BUILTIN)}",
                arg="loss",
            )
        return BUILTIN[task]
    if callable(task):
        return Task(loss=task, name=getattr(task, "__name__", "custom"))
    raise ConfigError(
        f"a task is a built-in name ({', '.join(BUILTIN)}), a loss function or a Task; got {type(task).__name__}",
        arg="loss",
    )


__all__ = [
    "Task",
    "as_task",
    "sown_losses",
    "model_inputs",
    "cross_entropy",
    "lm_loss",
    "lm_inputs",
    "masked_cross_entropy",
    "same_token_loss",
    "classification_loss",
    "BUILTIN",
]
