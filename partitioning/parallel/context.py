"""Context parallelism: attention over a sequence split across the mesh axes that hold ``length``.

When the rule table splits the activations' ``length`` over a mesh axis (``context`` in the ``fsdp_cp``
preset), each device holds ``T / C`` positions of every sequence. Attention needs every key a query
may see, so it is computed here, exactly, in one of two ways (``model.context_parallel``):

- ``all_gather``: every device gathers the whole key/value sequence (``T`` positions) and attends its
  own queries to it; simple, one collective per layer, but it holds all of K/V and a ``T / C x T``
  score block.
- ``ring``: the key/value blocks travel around the ring of ``C`` devices (``ppermute``), the next block's
  transfer issued before the current block is computed so the two overlap; each device accumulates its
  queries' output with an online softmax and never holds more than two blocks of K/V, and the scores
  of one ``T / C x T / C`` block at a time. The backward pass is a second ring that carries each block's
  key/value gradients home (a custom VJP), so training holds no more than the forward.

Masks are computed from token positions, not row indices: causal (``k_pos <= q_pos``), a sliding window
(``q_pos - k_pos < window``) and packed rows (the same ``segment_ids``) all hold whatever order the
positions are stored in — which is what makes the load-balanced causal layout possible
(:func:`balance`: device ``i`` holds chunks ``i`` and ``2C - 1 - i`` of the sequence, so every device
attends to as many keys as any other).

Example::

    >>> from partitioning.parallel.context import context_attention
    >>> mesh = pt.make_mesh({"data": 2, "context": 4})
    >>> b, t, h, d = 2, 16, 2, 8
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, b, t, h, d))
    >>> pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    >>> with pt.sharding_context(mesh, [("batch", "data"), ("length", "context")]):
    ...     ring = jax.jit(lambda q, k, v, p: context_attention(q, k, v, p, p, strategy="ring"))(q, k, v, pos)
    ...     gathered = jax.jit(lambda q, k, v, p: context_attention(q, k, v, p, p, strategy="all_gather"))(
    ...         q, k, v, pos)
    >>> bool(jnp.allclose(ring, gathered, atol=1e-5)), ring.shape
    (True, (2, 16, 2, 8))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from partitioning.boxes import constrain
from partitioning.context import logical_to_mesh_axes
from partitioning.errors import ConfigError
from partitioning.parallel.ring import attend, group, ring_attention, sink_correction, visible
from partitioning.resolve import axes_tuple, mesh_axis_sizes

STRATEGIES = ("all_gather", "ring")


def context_axes(mesh: Any = None) -> tuple[str, ...]:
    """The mesh axes (of size > 1) the rules in context split the activations' ``length`` over.

    Example::

        >>> from partitioning.parallel.context import context_axes
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}), "fsdp_cp"):
        ...     context_axes()
        ('context',)
        >>> context_axes()          # no mesh, no rules: nothing is split
        ()
    """
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh is None or mesh.empty:
        return ()
    spec = logical_to_mesh_axes(("batch", "length"))
    if spec is None or len(spec) < 2:
        return ()
    sizes = mesh_axis_sizes(mesh)
    return tuple(a for a in axes_tuple(spec[1]) if sizes.get(a, 1) > 1)


def context_size(axes: Sequence[str], mesh: Any = None) -> int:
    """``C``: the number of devices one sequence is split over."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    sizes = mesh_axis_sizes(mesh)
    return math.prod(sizes[a] for a in axes)


def balances(length: int, axes: Sequence[str], mesh: Any = None) -> bool:
    """Whether a sequence of ``length`` splits into the ``2C`` equal chunks of the balanced layout."""
    return bool(axes) and length % (2 * context_size(axes, mesh)) == 0


def whole_rows(shape: Sequence[int]) -> tuple[jax.Array, jax.Array]:
    """``(segment_ids, positions)`` of unpacked rows: one example a row, positions ``0 .. length - 1``."""
    return jnp.ones(shape, jnp.int32), jnp.broadcast_to(jnp.arange(shape[1], dtype=jnp.int32), tuple(shape))


def resolve_strategy(value: str, length: int, axes: Sequence[str], mesh: Any = None) -> str:
    """``auto`` -> ``all_gather`` when each device's gathered keys stay short (at most 8,192 positions, or a
    split in two), else ``ring``; other values as they are.

    The gather is one collective per layer and no loop; the ring bounds what a device holds (two key/value
    blocks, one ``T / C`` square of scores) and overlaps its transfers with compute. ``tune`` prices both
    for a layout; a config's ``model.context_parallel: auto`` takes the one it prices faster.

    Example::

        >>> from partitioning.parallel.context import resolve_strategy
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}), "fsdp_cp"):
        ...     resolve_strategy("auto", 4096, ("context",)), resolve_strategy("auto", 32768, ("context",))
        ('all_gather', 'ring')
    """
    check_strategy(value)
    if value != "auto":
        return value
    if not axes:
        return "ring"
    c = context_size(axes, mesh)
    return "all_gather" if c <= 2 or length <= 8192 else "ring"


def check_strategy(value: str) -> None:
    """ConfigError (``arg="context_parallel"``) for an unknown strategy."""
    if value not in (*STRATEGIES, "auto"):
        raise ConfigError(
            f"context_parallel must be one of {', '.join(STRATEGIES)} or auto, got {value!r}", arg="context_parallel"
        )


# -- the two strategies, per device ------------------------------------------------------------------


def _local(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, sinks, *, strategy, axes, c, opts, has_sinks):
    g = k.shape[2]
    scale, window, softcap = opts
    if strategy == "all_gather":
        k, v, k_pos, k_seg = (jax.lax.all_gather(x, axes, axis=1, tiled=True) for x in (k, v, k_pos, k_seg))
        out, lse = attend(
            q,
            k,
            v,
            q_pos,
            k_pos,
            q_seg,
            k_seg,
            scale=scale,
            window=window,
            windowed=windowed,
            softcap=softcap,
            with_lse=True,
        )
    else:
        o, m = ring_attention(group(q, g), k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts)  # (b, g, r, t, .)
        b, _, r, t, d = o.shape
        out = o.transpose(0, 3, 1, 2, 4).reshape(b, t, g * r, d).astype(q.dtype)
        lse = m.transpose(0, 3, 1, 2).reshape(b, t, g * r)
    return sink_correction(out, lse, sinks) if has_sinks else out


def context_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    q_seg: jax.Array | None = None,
    k_seg: jax.Array | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
    windowed: Any = None,
    softcap: float | None = None,
    strategy: str = "ring",
    axes: Sequence[str] | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Attention of ``q (batch, length, heads, dim)`` over ``k, v (batch, length, kv_heads, dim)`` whose
    ``length`` is split over the context axes (default: :func:`context_axes`), exactly.

    ``q_pos`` / ``k_pos (batch, length)``: each token's position (any order: the masks read positions);
    ``q_seg`` / ``k_seg``: packed rows' segment ids (None: one example a row); ``window``: a sliding window
    (``windowed``: a traced bool turning it on per layer); ``softcap``: ``cap * tanh(scores / cap)``;
    ``scale``: default ``dim ** -0.5``; ``sinks (heads,)``: a learned logit per head that joins every softmax
    (GPT-OSS). Without a split ``length`` this is plain attention.

    Example::

        >>> q = k = v = jnp.ones((2, 16, 2, 8))
        >>> pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
        >>> with pt.sharding_context(pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}), "fsdp_cp"):
        ...     out = jax.jit(lambda q, k, v: pt.parallel.context_attention(q, k, v, pos, pos, window=4))(q, k, v)
        >>> out.shape, out.sharding.spec[1]
        ((2, 16, 2, 8), 'context')
    """
    axes = context_axes() if axes is None else tuple(axes)
    strategy = resolve_strategy(strategy, q.shape[1], axes)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q_seg is None or k_seg is None:
        q_seg, k_seg = jnp.zeros(q_pos.shape, jnp.int32), jnp.zeros(k_pos.shape, jnp.int32)
    if not axes:
        out, lse = attend(
            q,
            k,
            v,
            q_pos,
            k_pos,
            q_seg,
            k_seg,
            scale=scale,
            window=window,
            windowed=windowed,
            softcap=softcap,
            with_lse=True,
        )
        return out if sinks is None else sink_correction(out, lse, sinks)
    windowed = jnp.asarray(True if windowed is None else windowed)
    c = context_size(axes)
    batch = _split(("batch",), q.shape[:1])[0]
    heads, kv_heads = _head_axes(q.shape[2], k.shape[2])
    seq, qs, kvs = P(batch, axes), P(batch, axes, heads), P(batch, axes, kv_heads)
    fn = functools.partial(
        _local, strategy=strategy, axes=axes, c=c, opts=(scale, window, softcap), has_sinks=sinks is not None
    )
    specs = (qs, kvs, kvs, seq, seq, seq, seq, P(heads))
    sinks = jnp.zeros((q.shape[2],), jnp.float32) if sinks is None else sinks
    operands = (q, k, v, q_pos, k_pos, q_seg, k_seg, sinks)
    args = [constrain(x, spec) for x, spec in zip(operands, specs, strict=True)]
    return jax.shard_map(  # type: ignore[call-arg]
        fn,
        mesh=jax.sharding.get_abstract_mesh(),
        in_specs=(*specs[:7], P(), specs[7]),
        out_specs=qs,
        axis_names=_manual(seq, qs, kvs),
    )(*args[:7], windowed, args[7])


def _split(names: Sequence[str], shape: Sequence[int]) -> tuple[Any, ...]:
    """The mesh axes the rules in context give each of ``names``, left out where they do not divide ``shape``."""
    spec = logical_to_mesh_axes(tuple(names)) or P()
    sizes = mesh_axis_sizes(jax.sharding.get_abstract_mesh())
    out = []
    for i, n in enumerate(shape):
        axes = axes_tuple(spec[i]) if i < len(spec) else ()
        out.append(axes if axes and n % math.prod(sizes[a] for a in axes) == 0 else None)
    return tuple(out)


def _head_axes(heads: int, kv_heads: int) -> tuple[Any, Any]:
    """How the heads stay split inside the attention: query heads and key/value heads by the same axes (so
    each device's query heads are the groups of its key/value heads), or neither."""
    h, g = _split(("heads",), (heads,))[0], _split(("kv_heads",), (kv_heads,))[0]
    return (h, g) if h == g else (None, None)


def _manual(*specs: P) -> set[str]:
    """Every mesh axis the specs name: inside the attention each device sees only its own block of each."""
    return {a for spec in specs for entry in spec for a in axes_tuple(entry)}


# -- the load-balanced causal layout -------------------------------------------------------------------


def _home(ch: int, c: int) -> int:
    """The device that holds chunk ``ch`` (of ``2C``) in the balanced layout."""
    return ch if ch < c else 2 * c - 1 - ch


def _balance_local(x, *, axes, c, inverse):
    half = x.shape[1] // 2
    lo, hi = x[:, :half], x[:, half:]
    even = [(i, _home(2 * i, c)) for i in range(c)]
    odd = [(i, _home(2 * i + 1, c)) for i in range(c)]
    first = jax.lax.axis_index(axes) % 2 == 0
    if not inverse:
        # Device i holds chunks 2i, 2i+1; each goes where the balanced layout keeps it.
        e, o = jax.lax.ppermute(lo, axes, even), jax.lax.ppermute(hi, axes, odd)
        return jnp.where(first, jnp.concatenate([e, o], 1), jnp.concatenate([o, e], 1))
    e_back = jnp.where(first, lo, hi)
    o_back = jnp.where(first, hi, lo)
    e = jax.lax.ppermute(e_back, axes, [(b, a) for a, b in even])
    o = jax.lax.ppermute(o_back, axes, [(b, a) for a, b in odd])
    return jnp.concatenate([e, o], 1)


def balance(x: jax.Array, axes: Sequence[str] | None = None, *, inverse: bool = False) -> jax.Array:
    """``x (batch, length, ...)`` rearranged along ``length`` so that, split over the context axes, device
    ``i`` holds chunks ``i`` and ``2C - 1 - i`` of ``2C`` (``inverse``: back to the order of the positions).

    Under a causal mask the first chunks see few keys and the last ones many; paired this way every device
    does the same work. Two ``ppermute`` s of the local block, no gather. The identity without a split.

    Example::

        >>> from partitioning.parallel.context import balance
        >>> mesh = pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}, axis_types="explicit")
        >>> with pt.sharding_context(mesh, "fsdp_cp"):
        ...     x = jax.sharding.reshard(jnp.arange(16)[None], jax.P(None, "context"))
        ...     y = balance(x)
        ...     back = balance(y, inverse=True)
        >>> y[0].tolist(), bool((back == x).all())
        ([0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9], True)
    """
    axes = context_axes() if axes is None else tuple(axes)
    if not axes:
        return x
    c = context_size(axes)
    if x.shape[1] % (2 * c):
        raise ConfigError(
            f"length {x.shape[1]} must divide into 2 x {c} chunks for the balanced causal layout over "
            f"{', '.join(axes)}",
            arg="context_parallel",
        )
    seq = P(_split(("batch",), x.shape[:1])[0], axes)
    fn = functools.partial(_balance_local, axes=axes, c=c, inverse=inverse)
    return jax.shard_map(
        fn, mesh=jax.sharding.get_abstract_mesh(), in_specs=seq, out_specs=seq, axis_names=_manual(seq)
    )(constrain(x, seq))


__all__ = [
    "context_attention",
    "context_axes",
    "context_size",
    "balance",
    "balances",
    "whole_rows",
    "resolve_strategy",
    "check_strategy",
    "attend",
    "visible",
    "STRATEGIES",
]
