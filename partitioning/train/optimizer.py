"""Optax optimizers and learning-rate schedules from explicit arguments.

The learning rate is wrapped with :func:`optax.inject_hyperparams`, so the
value used at each step lives in the optimizer state and the train step can
report it (:func:`current_lr`).

Example::

    >>> tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=200, warmup_steps=20,
    ...                        weight_decay=0.1, clip_norm=1.0)
    >>> state = tx.init({"w": jnp.ones((4, 4))})
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from partitioning.errors import ConfigError, did_you_mean

OPTIMIZERS = ("adamw", "adafactor", "sgd")
SCHEDULES = ("cosine", "linear", "constant")


def lr_schedule(
    lr: float, total_steps: int, *, warmup_steps: int = 0, schedule: str = "cosine", min_lr_ratio: float = 0.1
) -> optax.Schedule:
    """Linear warmup to ``lr`` over ``warmup_steps``, then ``schedule`` down to
    ``lr * min_lr_ratio`` at ``total_steps`` (``constant`` stays at ``lr``).

    Example::

        >>> s = pt.train.lr_schedule(1e-3, 100, warmup_steps=10)
        >>> round(float(s(10)), 6), round(float(s(100)), 6)
        (0.001, 0.0001)
    """
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"optimizer.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
            f"{did_you_mean(str(schedule), SCHEDULES)}"
        )
    if lr <= 0 or total_steps < 1 or warmup_steps < 0:
        raise ConfigError(
            f"need lr > 0, total_steps >= 1 and warmup_steps >= 0; got lr={lr}, "
            f"total_steps={total_steps}, warmup_steps={warmup_steps}"
        )
    warmup_steps = min(warmup_steps, total_steps)
    end = lr * min_lr_ratio
    decay_steps = max(1, total_steps - warmup_steps)
    if schedule == "cosine":
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=min_lr_ratio)
    elif schedule == "linear":
        after = optax.linear_schedule(lr, end, decay_steps)
    else:
        after = optax.constant_schedule(lr)
    if warmup_steps == 0:
        return after
    # Warmup starts at lr / warmup_steps, not 0: a first step with lr 0 is wasted.
    warm = optax.linear_schedule(lr / warmup_steps, lr, max(1, warmup_steps - 1))
    return optax.join_schedules([warm, after], [warmup_steps])


def _decay_mask(params: Any) -> Any:
    # Norm scales and biases (rank < 2) are not decayed, as usual for transformers.
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(
    name: str = "adamw",
    *,
    lr: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "cosine",
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    momentum: float = 0.9,
    clip_norm: float | None = None,
) -> optax.GradientTransformation:
    """An optax transformation: optional global-norm clipping, then adamw / adafactor / sgd.

    Weight decay is decoupled (applied to matrices only, not to norm scales or
    biases). ``momentum`` is for sgd; ``b1``/``b2``/``eps`` for adamw.

    Example::

        >>> tx = pt.make_optimizer("sgd", lr=0.1, total_steps=10, momentum=0.9)
        >>> pt.make_optimizer("adam", lr=0.1, total_steps=10)
        Traceback (most recent call last):
        ...
        partitioning.errors.ConfigError: ...; did you mean 'adamw'?
    """
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"optimizer.name must be one of {', '.join(OPTIMIZERS)}, got {name!r}{did_you_mean(str(name), OPTIMIZERS)}"
        )
    sched = lr_schedule(lr, total_steps, warmup_steps=warmup_steps, schedule=schedule, min_lr_ratio=min_lr_ratio)
    # Only the learning rate is injected: other numeric args stay Python
    # constants (adafactor branches on some of them at trace time).
    if name == "adamw":

        def build(learning_rate):
            return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=_decay_mask)
    elif name == "adafactor":
        # Its own update clipping stays on; the global-norm clip below is separate.
        def build(learning_rate):
            return optax.adafactor(
                learning_rate,
                weight_decay_rate=weight_decay or None,
                weight_decay_mask=_decay_mask if weight_decay else None,
            )
    else:

        def build(learning_rate):
            parts = [optax.add_decayed_weights(weight_decay, _decay_mask)] if weight_decay else []
            return optax.chain(*parts, optax.sgd(learning_rate, momentum=momentum or None))

    opt = optax.inject_hyperparams(build)(learning_rate=sched)
    if clip_norm:
        return optax.chain(optax.clip_by_global_norm(clip_norm), opt)
    return opt


def current_lr(opt_state: Any) -> Any:
    """The learning rate an ``inject_hyperparams`` state holds, or None.

    Example::

        >>> from partitioning.train.optimizer import current_lr
        >>> tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=100)
        >>> round(float(current_lr(tx.init({"w": jnp.ones((4, 4))}))), 6)
        0.003
    """
    # inject_hyperparams keeps the value in `hyperparams` and the schedule's own
    # state under the same key in `hyperparams_states`: take the value.
    return optax.tree_utils.tree_get(
        opt_state, "learning_rate", default=None, filtering=lambda _path, value: hasattr(value, "dtype")
    )


__all__ = ["make_optimizer", "lr_schedule", "current_lr", "OPTIMIZERS", "SCHEDULES"]
