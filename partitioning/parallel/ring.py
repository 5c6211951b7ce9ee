"""Blockwise attention for a split sequence: the masks, one masked block, and the ring with its backward pass.

Used by :mod:`partitioning.parallel.context` inside ``shard_map`` over the context axes. The ring folds
``C`` key/value blocks into each device's queries with an online softmax (running max, sum and output in
float32), passing the blocks on with ``ppermute``; its custom VJP runs a second ring in which every block
carries its key/value gradients with it and is home after the ``C``-th shift, so neither pass keeps more
than the block in hand and the one arriving. Masks read positions (any order): causal by position, a
sliding window, packed segments.

Example::

    >>> from partitioning.parallel.ring import attend, visible
    >>> pos = jnp.arange(4)[None]
    >>> visible(pos, pos, window=2)[0].astype(int).tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# A masked score: finite, so that a block whose keys are all hidden adds nothing instead of a NaN.
_HIDDEN = -1e30


# -- masks and one block -----------------------------------------------------------------------------


def visible(q_pos, k_pos, q_seg=None, k_seg=None, window=None, windowed=None) -> jax.Array:
    """``(b, t, s)``: query ``i`` sees key ``j`` (causal by position, inside the window, same segment).

    ``windowed`` (a traced bool, for stacks of local and global layers) turns the window on or off.
    """
    qp, kp = q_pos[:, :, None], k_pos[:, None, :]
    ok = kp <= qp
    if window is not None:
        near = qp - kp < window
        ok = ok & (near if windowed is None else (near | ~windowed))
    if q_seg is not None:
        ok = ok & (q_seg[:, :, None] == k_seg[:, None, :])
    return ok


def _scores(q, k, scale, softcap):
    """``(b, g, r, t, s)`` float32 scores of grouped queries ``q (b, t, g, r, d)`` against ``k (b, s, g, d)``,
    and the soft-cap's ``tanh`` (for its derivative; None without one)."""
    s = jnp.einsum("btgrd,bsgd->bgrts", q, k, preferred_element_type=jnp.float32) * scale
    if softcap is None:
        return s, None
    th = jnp.tanh(s / softcap)
    return softcap * th, th


def group(q, g):
    b, t, h, d = q.shape
    return q.reshape(b, t, g, h // g, d)


def attend(
    q, k, v, q_pos, k_pos, q_seg=None, k_seg=None, *, scale, window=None, windowed=None, softcap=None, with_lse=False
):
    """Plain masked attention of ``q (b, t, h, d)`` over ``k, v (b, s, g, d)`` (what each strategy computes);
    ``with_lse``: also each query's log-sum-exp of its scores ``(b, t, h)``.

    Example::

        >>> from partitioning.parallel.context import attend
        >>> q = k = v = jnp.ones((1, 3, 2, 4))
        >>> pos = jnp.arange(3)[None]
        >>> attend(q, k, v, pos, pos, scale=0.5).shape
        (1, 3, 2, 4)
    """
    g = k.shape[2]
    s, _ = _scores(group(q, g), k, scale, softcap)
    mask = visible(q_pos, k_pos, q_seg, k_seg, window, windowed)[:, None, None]
    s = jnp.where(mask, s, _HIDDEN)
    p = jnp.where(mask, jax.nn.softmax(s, axis=-1), 0.0)
    out = jnp.einsum("bgrts,bsgd->btgrd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    out = out.reshape(q.shape).astype(q.dtype)
    if not with_lse:
        return out
    lse = jax.nn.logsumexp(s, axis=-1)  # (b, g, r, t)
    b, gg, r, t = lse.shape
    return out, lse.transpose(0, 3, 1, 2).reshape(b, t, gg * r)


def sink_correction(out: jax.Array, lse: jax.Array, sinks: jax.Array) -> jax.Array:
    """``out (b, t, h, d)`` as if each head's sink logit ``sinks (h,)`` had joined its softmax (GPT-OSS): the
    keys' share of the mass is ``sigmoid(lse - sink)``, ``lse (b, t, h)`` their log-sum-exp.

    Example::

        >>> from partitioning.parallel.ring import sink_correction
        >>> sink_correction(jnp.ones((1, 1, 2, 1)), jnp.zeros((1, 1, 2)), jnp.array([0.0, -100.0]))[0, 0, :, 0]
        Array([0.5, 1. ], dtype=float32)
    """
    share = jax.nn.sigmoid(lse.astype(jnp.float32) - sinks.astype(jnp.float32))
    return (out.astype(jnp.float32) * share[..., None]).astype(out.dtype)


# -- the ring --------------------------------------------------------------------------------------


def _shift(tree, axes, c):
    """Each device's ``tree`` to the next device of the ring (device ``i`` receives from ``i - 1``)."""
    perm = [(i, (i + 1) % c) for i in range(c)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axes, perm), tree)


def _fold(carry, block, q, q_pos, q_seg, windowed, opts):
    """One key/value block folded into the running ``(out, max, sum)`` of the online softmax."""
    o, m, total = carry
    k, v, k_pos, k_seg = block
    scale, window, softcap = opts
    s, _ = _scores(q, k, scale, softcap)
    mask = visible(q_pos, k_pos, q_seg, k_seg, window, windowed)[:, None, None]
    s = jnp.where(mask, s, _HIDDEN)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    total = total * corr + p.sum(-1)
    pv = jnp.einsum("bgrts,bsgd->bgrtd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o * corr[..., None] + pv, m_new, total


def _ring_forward(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts):
    """``(out (b, g, r, t, d) float32, logsumexp (b, g, r, t))`` of grouped queries over the whole ring."""
    # Zeros made from q: they vary over the same mesh axes as q (shard_map's scan carries must match).
    zeros = jnp.zeros_like(q, jnp.float32).transpose(0, 2, 3, 1, 4)  # (b, g, r, t, d)
    carry = (zeros, zeros[..., 0] + _HIDDEN, zeros[..., 0])

    def step(state, _):
        carry, block = state
        nxt = _shift(block, axes, c)  # issued before this block's compute: the two overlap
        return (_fold(carry, block, q, q_pos, q_seg, windowed, opts), nxt), None

    (carry, block), _ = jax.lax.scan(step, (carry, (k, v, k_pos, k_seg)), None, length=c - 1)
    o, m, total = _fold(carry, block, q, q_pos, q_seg, windowed, opts)
    safe = jnp.where(total == 0, 1.0, total)
    return o / safe[..., None], m + jnp.log(safe)


def _unfold(q, do, lse, dsum, block, q_pos, q_seg, windowed, opts):
    """One block's share of the gradients: ``(dq, dk, dv)`` in float32."""
    k, v, k_pos, k_seg = block
    scale, window, softcap = opts
    s, th = _scores(q, k, scale, softcap)
    mask = visible(q_pos, k_pos, q_seg, k_seg, window, windowed)[:, None, None]
    p = jnp.where(mask, jnp.exp(s - lse[..., None]), 0.0)
    dv = jnp.einsum("bgrts,bgrtd->bsgd", p, do)
    dp = jnp.einsum("bgrtd,bsgd->bgrts", do, v.astype(jnp.float32))
    ds = p * (dp - dsum[..., None])
    if th is not None:
        ds = ds * (1.0 - th * th)
    ds = ds * scale
    dq = jnp.einsum("bgrts,bsgd->btgrd", ds, k.astype(jnp.float32))
    dk = jnp.einsum("bgrts,btgrd->bsgd", ds, q.astype(jnp.float32))
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _ring(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts):
    return _ring_forward(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts)


def _ring_fwd(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts):
    out, lse = _ring_forward(q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, axes, c, opts)
    return (out, lse), (q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, out, lse)


def _ring_bwd(axes, c, opts, res, cotangents):
    q, k, v, q_pos, k_pos, q_seg, k_seg, windowed, out, lse = res
    do, dlse = cotangents
    do = do.astype(jnp.float32)
    # d lse / d score = p: a cotangent on the log-sum-exp (a sink's share uses it) joins the softmax's own.
    dsum = jnp.sum(do * out, axis=-1) - dlse.astype(jnp.float32)
    dq = jnp.zeros_like(q, jnp.float32)
    grads = (jnp.zeros_like(k, jnp.float32), jnp.zeros_like(v, jnp.float32))

    def step(state, _):
        dq, block, grads = state
        nxt = _shift(block, axes, c)
        dq_b, dk_b, dv_b = _unfold(q, do, lse, dsum, block, q_pos, q_seg, windowed, opts)
        # A block's key/value gradients travel with it and are home after the C-th shift.
        grads = _shift((grads[0] + dk_b, grads[1] + dv_b), axes, c)
        return (dq + dq_b, nxt, grads), None

    (dq, block, grads), _ = jax.lax.scan(step, (dq, (k, v, k_pos, k_seg), grads), None, length=c - 1)
    dq_b, dk_b, dv_b = _unfold(q, do, lse, dsum, block, q_pos, q_seg, windowed, opts)
    dk, dv = _shift((grads[0] + dk_b, grads[1] + dv_b), axes, c)
    return (dq + dq_b).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)
ring_attention = _ring


__all__ = ["attend", "visible", "group", "ring_attention", "sink_correction"]
