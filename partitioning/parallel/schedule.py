"""The GPipe schedule as a pure function: a stack of layers split into stages over the ``stage`` mesh axis.

``L`` stacked layers (a pytree whose leaves have a leading ``layers`` axis,
stored split over ``stage``) become ``S`` stages of ``L / S`` consecutive
layers: stage ``s`` holds layers ``s L/S … (s+1) L/S - 1``, exactly the block
of the ``layers`` axis its devices already store, so nothing is resharded.
The batch is cut into ``M`` micro-batches. Every iteration runs all stages at
once, each on a different micro-batch (stage ``s`` on micro-batch ``t - s`` at
iteration ``t``), then shifts every stage's output to the next stage;
``M + S - 1`` iterations drain the pipeline, of which each stage idles
``S - 1``: the bubble, ``(S - 1) / (M + S - 1)`` of the step.

How it is partitioned (the GSPMD way): the stages are a ``jax.vmap`` over the
leading stage dimension with ``spmd_axis_name="stage"``, so the sharding
constraints inside the layer — the model's own ``with_logical_constraint``
calls — are batched over stages and keep meaning what they mean unpipelined;
the shift is a ``jnp.roll`` of the stage-sharded buffer, which XLA lowers to
one collective-permute per iteration. Micro-batch ``j`` is rows ``j, j + M,
j + 2M, …`` of the batch (as in gradient accumulation): every device already
holds its rows of every micro-batch. The last stage's outputs collect in a
stage-sharded buffer written locally, and reach the other stages once, at the
end (one all-reduce over ``stage``); likewise the gradient of the inputs.

Example::

    >>> from partitioning.parallel.schedule import gpipe
    >>> def layer_fn(w, x, args, layer, micro):             # one layer on one micro-batch
    ...     return jnp.tanh(x @ w), {}
    >>> stacked, x = jnp.ones((8, 64, 64)) / 64, jnp.ones((16, 64))  # 8 layers, 16 rows
    >>> mesh = pt.make_mesh({"stage": 4, "data": 2})
    >>> with pt.sharding_context(mesh, "pp"):
    ...     w = jax.device_put(stacked, jax.NamedSharding(mesh, jax.P("stage")))
    ...     y, aux = jax.jit(lambda w, x: gpipe(layer_fn, w, x, stages=4, microbatches=8))(w, x)
    >>> y.shape, pt.bubble_fraction(4, 8)
    ((16, 64), 0.2727...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from partitioning.boxes import constrain

STAGE_AXIS = "stage"


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of a step each stage idles: ``(S - 1) / (R M + S - 1)``.

    ``repeats`` ``R > 1`` is the circular (interleaved) schedule's figure, where
    each stage holds ``R`` non-adjacent chunks of layers; this toolkit runs
    ``R = 1`` (see the README), the argument shows what interleaving would buy.

    Example::

        >>> pt.bubble_fraction(4, 4), pt.bubble_fraction(4, 16), pt.bubble_fraction(4, 4, repeats=2)
        (0.42857142857142855, 0.15789473684210525, 0.2727272727272727)
    """
    s, m, r = int(stages), int(microbatches), int(repeats)
    return (s - 1) / (r * m + s - 1) if s > 1 else 0.0


def _spec(head: Sequence[Any], ndim: int) -> PartitionSpec:
    """``head`` for the leading dims, the rest left to XLA (tensor / sequence axes keep their layout)."""
    return PartitionSpec(*head, *([PartitionSpec.UNCONSTRAINED] * (ndim - len(head))))


def _split_stages(tree: Any, stages: int, axis: str) -> Any:
    def split(a):
        a = a.reshape(stages, a.shape[0] // stages, *a.shape[1:])
        return constrain(a, _spec((axis, None), a.ndim))

    return jax.tree.map(split, tree)


def _microbatched(x: jax.Array, m: int) -> jax.Array:
    """``(B, …)`` -> ``(M, B/M, …)``; micro-batch ``j`` is rows ``j, j+M, …`` (no data moves)."""
    return x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)


def _unmicrobatched(y: jax.Array) -> jax.Array:
    return y.swapaxes(0, 1).reshape(y.shape[0] * y.shape[1], *y.shape[2:])


def gpipe(
    layer_fn: Callable[..., tuple[jax.Array, Mapping[str, jax.Array]]],
    layers: Any,
    x: jax.Array,
    args: Sequence[Any] = (),
    *,
    stages: int,
    microbatches: int,
    batch_axes: Any = None,
    axis: str = STAGE_AXIS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Runs ``L`` stacked layers over ``x`` as an ``S``-stage, ``M``-micro-batch GPipe pipeline.

    Args:
      layer_fn: ``layer_fn(layer, x, args, layer_index, micro_index) -> (x, aux)``: one layer
        (``layer``: ``layers`` without the leading axis) on one micro-batch; ``aux`` a dict of
        scalars summed over layers and averaged over micro-batches (e.g. a load-balancing loss).
      layers: a pytree whose leaves share a leading ``L`` axis, ``L % stages == 0``.
      x: ``(B, …)`` activations, ``B % microbatches == 0``.
      args: arrays with the same leading ``B`` (positions, masks): micro-batched beside ``x``.
      batch_axes: the mesh axes that split the batch (``Rules.batch_axes``), kept on micro-batches.

    Returns ``(y, aux)``: the same ``y`` as applying the ``L`` layers in order to the whole batch.
    """
    s, m = int(stages), int(microbatches)
    n_layers = jax.tree.leaves(layers)[0].shape[0]
    if n_layers % s or x.shape[0] % m:
        raise ValueError(
            f"gpipe: {n_layers} layers / {s} stages and batch {x.shape[0]} / {m} micro-batches "
            "must divide (checked up front by the Trainer)"
        )
    k = n_layers // s
    staged = _split_stages(layers, s, axis)
    bspec = batch_axes if batch_axes else None
    xs = constrain(_microbatched(x, m), _spec((None, bspec), x.ndim + 1))
    # Every stage's own copy of the inputs (local: they are not split over `stage`). Stage 0 reads its
    # copy; the gradient then collects in a stage-split buffer, summed over `stage` once at the end
    # instead of once per iteration.
    xs_staged = constrain(jnp.broadcast_to(xs[None], (s, *xs.shape)), _spec((axis, None, bspec), x.ndim + 2))
    mb_args = [constrain(_microbatched(a, m), _spec((None, bspec), a.ndim + 1)) for a in args]
    buf_spec = _spec((axis, bspec), x.ndim + 1)
    stage_ids = jnp.arange(s, dtype=jnp.int32)

    def stage_fn(stage_layers, h, stage, micro, stage_args):
        def one(carry, kl):
            h, aux = carry
            layer, i = kl
            h, new = layer_fn(layer, h, stage_args, stage * k + i, micro)
            return (h, jax.tree.map(jnp.add, aux, dict(new))), None

        (h, aux), _ = jax.lax.scan(one, (h, dict(aux_zero)), (stage_layers, jnp.arange(k, dtype=jnp.int32)))
        return h, aux

    aux_zero = _aux_zeros(layer_fn, layers, xs[0], [a[0] for a in mb_args])
    run_stages = jax.vmap(stage_fn, spmd_axis_name=axis)
    # Stage s sees its micro-batch's args by index: they are not sharded over `stage`, so this is local.
    pick = jax.vmap(lambda a, j: jax.lax.dynamic_index_in_dim(a, j, 0, keepdims=False), in_axes=(None, 0))
    pick_staged = jax.vmap(lambda a, j: jax.lax.dynamic_index_in_dim(a, j, 0, keepdims=False), in_axes=(0, None))
    is_first = (stage_ids == 0).reshape(s, *([1] * x.ndim))
    is_last = (stage_ids == s - 1).reshape(s, *([1] * (x.ndim + 1)))

    def iteration(carry, t):
        state, out, aux = carry
        micro = t - stage_ids  # the micro-batch each stage works on
        valid = (micro >= 0) & (micro < m)
        micro = jnp.clip(micro, 0, m - 1)
        fresh = pick_staged(xs_staged, jnp.minimum(t, m - 1))
        h = constrain(jnp.where(is_first, fresh, state), buf_spec)
        h, new = run_stages(staged, h, stage_ids, micro, [pick(a, micro) for a in mb_args])
        aux = jax.tree.map(lambda acc, v: acc + jnp.where(valid, v, 0).sum() / m, aux, new)
        # The last stage finished micro-batch t - (S - 1): every stage writes its own buffer row
        # (no communication); only the last stage's row is read at the end.
        done = jnp.clip(t - (s - 1), 0, m - 1)
        written = jax.vmap(lambda b, o: jax.lax.dynamic_update_index_in_dim(b, o, done, 0))(out, h)
        out = constrain(jnp.where(is_last & (t >= s - 1), written, out), _spec((axis, None, bspec), x.ndim + 2))
        # Shift: stage s's output is stage s+1's input (a collective-permute over `stage`).
        state = constrain(jnp.roll(h, 1, axis=0), buf_spec)
        return (state, out, aux), None

    state = constrain(jnp.zeros((s, *xs.shape[1:]), x.dtype), buf_spec)
    out = constrain(jnp.zeros((s, *xs.shape), x.dtype), _spec((axis, None, bspec), x.ndim + 2))
    (state, out, aux), _ = jax.lax.scan(iteration, (state, out, dict(aux_zero)), jnp.arange(m + s - 1, dtype=jnp.int32))
    # The last stage's row to every stage: a sum over the stage-sharded dim (one all-reduce over `stage`).
    y = jnp.where(is_last, out, jnp.zeros_like(out)).sum(axis=0)
    y = constrain(y, _spec((None, bspec), y.ndim))
    return _unmicrobatched(y), aux


def _aux_zeros(layer_fn, layers, h, args) -> dict[str, jax.Array]:
    """Scalar zeros shaped like ``layer_fn``'s aux dict (found by tracing one layer abstractly)."""
    zero = jnp.zeros((), jnp.int32)
    layer = jax.tree.map(lambda a: a[0], layers)
    _, aux = jax.eval_shape(lambda lp, h, a: layer_fn(lp, h, a, zero, zero), layer, h, args)
    return {k: jnp.zeros((), v.dtype) for k, v in dict(aux).items()}


__all__ = ["gpipe", "bubble_fraction", "STAGE_AXIS"]
