"""The train state: what a step reads and writes, its abstract form, and its host-side step.

:class:`TrainState` holds the step counter, the (unboxed) params and the
optimizer state. :func:`abstract_train_state` traces an init without
allocating, keeping the boxes that carry logical names on params *and*
optimizer state (optax states built from boxed params keep the boxes), so
the plan, the trainer and checkpoints lay it out through one rule table.

Example::

    >>> params, opt_state = abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=64)
    >>> state_step(state)          # a Python int, read from a local shard
    200
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from partitioning.boxes import is_box, is_logical_box


@flax.struct.dataclass
class TrainState:
    """What a train step reads and writes. ``params`` / ``opt_state`` are unboxed.

    Example::

        >>> state = trainer.init(jax.random.key(0))
        >>> state.step, jax.tree.leaves(state.params)[0].sharding
    """

    step: jax.Array
    params: Any
    opt_state: Any


def host_scalar(x: Any) -> float:
    """A replicated scalar as a Python float, reading only a local shard (multi-host safe).

    Example::

        >>> host_scalar(metrics["loss"])
        2.345
    """
    if isinstance(x, jax.Array):
        x = x.addressable_data(0)
    return float(np.asarray(x))


def state_step(state: Any) -> int:
    """The step of a train state (a :class:`TrainState` or a mapping with ``step``), as an int."""
    step = state["step"] if isinstance(state, Mapping) else state.step
    return int(host_scalar(step))


def strip_foreign_boxes(opt_state: Any, params: Any) -> Any:
    """Unboxes optimizer-state leaves whose shape is not a param's shape.

    Optax maps over the *values* inside boxes, so a state with another shape
    (adafactor's factored ``v_row``/``v_col``, ``(1,)`` placeholders) still sits in
    a box with the param's names; those leaves are small and stay replicated.
    """
    known = {
        (tuple(b.names), tuple(b.value.shape))
        for b in jax.tree.leaves(params, is_leaf=is_box) if is_logical_box(b)
    }

    def fix(x):
        if is_logical_box(x) and (tuple(x.names), tuple(x.value.shape)) not in known:
            return x.value
        return x

    return jax.tree.map(fix, opt_state, is_leaf=is_box)


def abstract_train_state(model: Any, tx: Any, *, batch_size: int, seq_len: int) -> tuple[Any, Any]:
    """(boxed params, boxed optimizer state) as ShapeDtypeStructs, nothing allocated.

    Built the way :class:`partitioning.Trainer` builds its state, so the plan's
    paths and layouts are the trainer's.

    Example::

        >>> params, opt_state = abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=8, seq_len=64)
    """
    tokens = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)

    def init(rng, tok):
        params = model.init(rng, tok)["params"]
        return params, strip_foreign_boxes(tx.init(params), params)

    return jax.eval_shape(init, jax.random.key(0), tokens)


__all__ = ["TrainState", "host_scalar", "state_step", "strip_foreign_boxes", "abstract_train_state"]
