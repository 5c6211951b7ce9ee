"""The pipeline schedule as a pure function: GPipe, or circular, over the ``stage`` mesh axis.

``L`` stacked layers (a pytree whose leaves have a leading ``layers`` axis,
stored split over ``stage``) run as ``S`` stages; the batch is cut into ``M``
micro-batches. With ``R`` repeats the layers form ``S R`` chunks of
``K = L / (S R)`` consecutive layers, and stage ``s`` runs chunks ``s, S + s,
2S + s, …`` (MaxText's circular schedule: each stage holds ``R`` non-adjacent
chunks). ``R = 1`` is GPipe: stage ``s`` runs layers ``s L/S … (s+1) L/S - 1``,
exactly the block of the ``layers`` axis its devices already store, so nothing
moves; for ``R > 1`` the stored blocks are regrouped into the stages' chunks
once per step (the weights go to the stage that runs them, their gradients
come back; see :func:`stage_chunks`).

Every iteration runs all stages at once, each on its own item: stage ``s``
works at iteration ``t`` on item ``t - s`` (micro-batch ``(t - s) mod M`` in
repeat ``(t - s) div M``), then every stage's output shifts to the next stage
(``jnp.roll`` of the stage-sharded buffer: one collective-permute per
iteration); the last stage's output reaches stage 0, which starts the next
repeat of that micro-batch with it. ``R M + S - 1`` iterations drain the
pipeline, of which each stage idles ``S - 1``: the bubble,
``(S - 1) / (R M + S - 1)`` of the step. Repeats need ``M >= S`` (a
micro-batch's output must be back at stage 0 before its next repeat starts).

How it is partitioned (the GSPMD way): the stages are a ``jax.vmap`` over the
leading stage dimension with ``spmd_axis_name="stage"``, so the sharding
constraints inside the layer — the model's own ``with_logical_constraint``
calls — are batched over stages and keep meaning what they mean unpipelined.
Micro-batch ``j`` is rows ``j, j + M, j + 2M, …`` of the batch (as in gradient
accumulation): every device already holds its rows of every micro-batch. One
stage-sharded buffer of ``M`` micro-batches per stage holds stage 0's inputs:
at first the batch (every stage holds a copy; only stage 0 reads it), then
what comes back from the last stage — the next repeat's inputs, and at the end
the outputs, which reach the other stages once (one all-reduce over
``stage``); likewise the gradient of the inputs. Per iteration the schedule
touches one micro-batch of it: reads stage 0's input, writes what arrived.

Example::

    >>> from partitioning.parallel.schedule import gpipe
    >>> def layer_fn(w, x, args, layer, micro):             # one layer on one micro-batch
    ...     return jnp.tanh(x @ w), {}
    >>> stacked, x = jnp.ones((8, 64, 64)) / 64, jnp.ones((16, 64))  # 8 layers, 16 rows
    >>> mesh = pt.make_mesh({"stage": 4, "data": 2})
    >>> with pt.sharding_context(mesh, "pp"):
    ...     w = jax.device_put(stacked, jax.NamedSharding(mesh, jax.P("stage")))
    ...     y, aux = jax.jit(lambda w, x: gpipe(layer_fn, w, x, stages=4, microbatches=8))(w, x)
    ...     y2, _ = jax.jit(lambda w, x: gpipe(layer_fn, w, x, stages=4, microbatches=8, repeats=2))(w, x)
    >>> y.shape, bool(jnp.allclose(y, y2, atol=1e-6))   # circular: the same result, a smaller bubble
    ((16, 64), True)
    >>> pt.parallel.bubble_fraction(4, 8), pt.parallel.bubble_fraction(4, 8, repeats=2)
    (0.2727..., 0.1578...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from partitioning.boxes import constrain

STAGE_AXIS = "stage"
UNROLL_LAYERS = 8  # a stage's chunk of at most this many layers is unrolled (compile time grows with it)


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of a step each stage idles: ``(S - 1) / (R M + S - 1)``.

    ``repeats`` ``R > 1``: the circular (interleaved) schedule, where each stage
    holds ``R`` non-adjacent chunks of layers (``train.pipeline_repeats``).

    Example::

        >>> from partitioning.parallel import bubble_fraction
        >>> bubble_fraction(4, 4), bubble_fraction(4, 16), bubble_fraction(4, 4, repeats=2)
        (0.42857142857142855, 0.15789473684210525, 0.2727272727272727)
    """
    s, m, r = int(stages), int(microbatches), int(repeats)
    return (s - 1) / (r * m + s - 1) if s > 1 else 0.0


def _spec(head: Sequence[Any], ndim: int) -> PartitionSpec:
    """``head`` for the leading dims, the rest left to XLA (tensor / sequence axes keep their layout)."""
    return PartitionSpec(*head, *([PartitionSpec.UNCONSTRAINED] * (ndim - len(head))))


def stage_chunks(stages: int, repeats: int) -> list[list[int]]:
    """Per stage, the chunks of ``K = L / (S R)`` layers it runs, in order: ``[s, S + s, 2S + s, …]``.

    Example::

        >>> from partitioning.parallel.schedule import stage_chunks
        >>> stage_chunks(2, 2)     # stored: stage 0 holds chunks 0, 1 and stage 1 chunks 2, 3
        [[0, 2], [1, 3]]
    """
    return [[r * stages + s for r in range(repeats)] for s in range(stages)]


def _split_stages(tree: Any, stages: int, repeats: int, axis: str) -> Any:
    """``(L, …)`` -> ``(S, R K, …)``: row ``s`` holds stage ``s``'s chunks (:func:`stage_chunks`), split over
    ``axis``. ``R = 1``: a reshape of what each stage stores; ``R > 1``: the chunks regrouped (weights move)."""

    def split(a):
        if repeats == 1:
            a = a.reshape(stages, a.shape[0] // stages, *a.shape[1:])
        else:
            k = a.shape[0] // (stages * repeats)
            a = a.reshape(repeats, stages, k, *a.shape[1:]).swapaxes(0, 1)
            a = a.reshape(stages, repeats * k, *a.shape[3:])
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
    repeats: int = 1,
    batch_axes: Any = None,
    axis: str = STAGE_AXIS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Runs ``L`` stacked layers over ``x`` as an ``S``-stage, ``M``-micro-batch pipeline (``R`` repeats: circular).

    Args:
      layer_fn: ``layer_fn(layer, x, args, layer_index, micro_index) -> (x, aux)``: one layer
        (``layer``: ``layers`` without the leading axis) on one micro-batch; ``aux`` a dict of
        scalars summed over layers and averaged over micro-batches (e.g. a load-balancing loss).
      layers: a pytree whose leaves share a leading ``L`` axis, ``L % (stages * repeats) == 0``.
      x: ``(B, …)`` activations, ``B % microbatches == 0``.
      args: arrays with the same leading ``B`` (positions, masks): micro-batched beside ``x``.
      repeats: ``R``, the chunks each stage holds (1: GPipe; more: circular, ``microbatches >= stages``).
      batch_axes: the mesh axes that split the batch (``Rules.batch_axes``), kept on micro-batches.

    Returns ``(y, aux)``: the same ``y`` as applying the ``L`` layers in order to the whole batch.

    Example::

        >>> from partitioning.parallel import gpipe
        >>> layers = jnp.stack([jnp.eye(4) * (i + 1) for i in range(4)])   # L = 4 layers: x -> x * (i + 1)
        >>> y, aux = gpipe(lambda w, x, args, i, m: (x @ w, {}), layers, jnp.ones((8, 4)), stages=2, microbatches=4)
        >>> y[0].tolist(), aux                                              # 1 * 2 * 3 * 4
        ([24.0, 24.0, 24.0, 24.0], {})
    """
    s, m, r = int(stages), int(microbatches), int(repeats)
    n_layers = jax.tree.leaves(layers)[0].shape[0]
    if n_layers % (s * r) or x.shape[0] % m or (r > 1 and m < s):
        raise ValueError(
            f"gpipe: {n_layers} layers / ({s} stages x {r} repeats) and batch {x.shape[0]} / {m} micro-batches "
            f"must divide, and repeats need micro-batches >= stages (checked up front by the Trainer)"
        )
    k = n_layers // (s * r)
    staged = _split_stages(layers, s, r, axis)
    bspec = batch_axes if batch_axes else None
    xs = constrain(_microbatched(x, m), _spec((None, bspec), x.ndim + 1))
    # Stage 0's inputs, one buffer per stage (each stage has a copy of the batch: it is not split over
    # `stage`). Stage 0 reads the batch from it, then what the last stage sends back; the gradient
    # collects in it, summed over `stage` once at the end instead of once per iteration.
    buf_spec = _spec((axis, None, bspec), x.ndim + 2)
    inputs = constrain(jnp.broadcast_to(xs[None], (s, *xs.shape)), buf_spec)
    mb_args = [constrain(_microbatched(a, m), _spec((None, bspec), a.ndim + 1)) for a in args]
    h_spec = _spec((axis, bspec), x.ndim + 1)
    stage_ids = jnp.arange(s, dtype=jnp.int32)

    def stage_fn(stage_layers, h, stage, micro, rep, stage_args):
        def one(carry, kl):
            h, aux = carry
            layer, i = kl
            if r > 1:  # this repeat's chunk: layers rep K … rep K + K - 1 of the stage's R K (a local gather)
                layer = jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, rep * k + i, 0, False), stage_layers)
            h, new = layer_fn(layer, h, stage_args, (rep * s + stage) * k + i, micro)
            return (h, jax.tree.map(jnp.add, aux, dict(new))), None

        # A stage's few layers unrolled: their saved activations go straight into the iteration loop's
        # stacks (an inner loop's stacked residuals would be copied into the outer loop's once more).
        xs_k = (stage_layers if r == 1 else None, jnp.arange(k, dtype=jnp.int32))
        (h, aux), _ = jax.lax.scan(one, (h, dict(aux_zero)), xs_k, length=k, unroll=k <= UNROLL_LAYERS)
        return h, aux

    aux_zero = _aux_zeros(layer_fn, layers, xs[0], [a[0] for a in mb_args])
    run_stages = jax.vmap(stage_fn, spmd_axis_name=axis)
    # Stage s sees its micro-batch's args by index: they are not sharded over `stage`, so this is local.
    pick = jax.vmap(lambda a, j: jax.lax.dynamic_index_in_dim(a, j, 0, keepdims=False), in_axes=(None, 0))
    row = jax.vmap(lambda b, j: jax.lax.dynamic_index_in_dim(b, j, 0, keepdims=False), in_axes=(0, None))
    put = jax.vmap(lambda b, v, j: jax.lax.dynamic_update_index_in_dim(b, v, j, 0), in_axes=(0, 0, None))
    is_first = (stage_ids == 0).reshape(s, *([1] * x.ndim))

    def iteration(carry, t):
        state, inputs, aux = carry
        item = t - stage_ids  # what each stage works on: micro-batch item mod M of repeat item div M
        valid = (item >= 0) & (item < r * m)
        item = jnp.clip(item, 0, r * m - 1)
        micro, rep = item % m, item // m
        # Stage 0 takes micro-batch t mod M from its buffer; the others what the previous stage sent.
        h = constrain(jnp.where(is_first, row(inputs, t % m), state), h_spec)
        h, new = run_stages(staged, h, stage_ids, micro, rep, [pick(a, micro) for a in mb_args])
        aux = jax.tree.map(lambda acc, v: acc + jnp.where(valid, v, 0).sum() / m, aux, new)
        # Shift: stage s's output is stage s+1's input, the last stage's is stage 0's (a collective-permute).
        state = constrain(jnp.roll(h, 1, axis=0), h_spec)
        # What reached stage 0 is micro-batch t - (S-1) mod M, done with this repeat: into its buffer slot,
        # read again by its next repeat (M >= S iterations on, after the slot's current value was read).
        done = (t - (s - 1)) % m
        arrived = jnp.where(t >= s - 1, state, row(inputs, done))
        inputs = constrain(put(inputs, arrived, done), buf_spec)
        return (state, inputs, aux), None

    state = constrain(jnp.zeros((s, *xs.shape[1:]), x.dtype), h_spec)
    (state, inputs, aux), _ = jax.lax.scan(
        iteration, (state, inputs, dict(aux_zero)), jnp.arange(r * m + s - 1, dtype=jnp.int32)
    )
    # Stage 0's buffer holds the outputs: to every stage as a sum over the stage-sharded dim (one all-reduce).
    y = jnp.where(is_first[..., None], inputs, jnp.zeros_like(inputs)).sum(axis=0)
    y = constrain(y, _spec((None, bspec), y.ndim))
    return _unmicrobatched(y), aux


def _aux_zeros(layer_fn, layers, h, args) -> dict[str, jax.Array]:
    """Scalar zeros shaped like ``layer_fn``'s aux dict (found by tracing one layer abstractly)."""
    zero = jnp.zeros((), jnp.int32)
    layer = jax.tree.map(lambda a: a[0], layers)
    _, aux = jax.eval_shape(lambda lp, h, a: layer_fn(lp, h, a, zero, zero), layer, h, args)
    return {k: jnp.zeros((), v.dtype) for k, v in dict(aux).items()}


__all__ = ["gpipe", "bubble_fraction", "stage_chunks", "STAGE_AXIS"]
