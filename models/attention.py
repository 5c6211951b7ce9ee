"""Causal self-attention with rotary positions: grouped-query, optional biases, sliding window, scaling.

RoPE is the rotate-half form of Llama / GPT-NeoX (``transformers``' ``apply_rotary_pos_emb``):
the frequencies ``theta ** (-i / half)`` optionally rescaled as Llama 3.1 (``llama3``) or by
position interpolation (``linear``). A sliding window ``w`` lets query ``i`` see keys
``i - w < j <= i`` (Mistral). Scores are ``q . k * scale`` (default ``head_dim ** -0.5``)
with the softmax in float32.

Example::

    >>> from partitioning.models.attention import Attention
    >>> attn = Attention(8, 2, 16, 500000.0, jnp.float32, jnp.float32, window=4)   # 8 heads, 2 kv heads
    >>> x = jax.random.normal(jax.random.key(1), (2, 10, 64))                    # (batch, length, embed)
    >>> variables = jax.jit(attn.init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, pt.unbox(variables))["params"]
    {'k': (64, 2, 16), 'o': (8, 16, 64), 'q': (64, 8, 16), 'v': (64, 2, 16)}
    >>> pt.logical_names(variables)["params"]["k"]
    ('embed', 'kv_heads', 'kv')
    >>> apply = jax.jit(attn.apply)
    >>> y, y2 = apply(variables, x), apply(variables, x.at[:, 0].set(5.0))    # another first token
    >>> bool(jnp.allclose(y[:, :4], y2[:, :4])), bool(jnp.allclose(y[:, 4:], y2[:, 4:]))  # seen by positions 0-3 only
    (False, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import logical_spec, with_logical_constraint
from partitioning.errors import ConfigError
from partitioning.models.fused_attention import cudnn_attention
from partitioning.models.kv_cache import cache_positions, cached_kv
from partitioning.models.layers import bias_param, kernel, order, row_parallel

# rope_type -> the keys it needs besides rope_type.
ROPE_SCALINGS = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "linear": ("factor",),
}


def parse_rope_scaling(value: Any) -> tuple | None:
    """``{"rope_type": "llama3", "factor": 8.0, ...}`` (``type`` also accepted) -> a hashable, checked tuple.

    Raises :class:`~partitioning.ConfigError` (``arg="rope_scaling"``) for an unknown type or a missing key.

    Example::

        >>> from partitioning.models.attention import parse_rope_scaling
        >>> parse_rope_scaling({"rope_type": "linear", "factor": 2.0})
        (('rope_type', 'linear'), ('factor', 2.0))
    """
    if value is None or isinstance(value, tuple):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"rope_scaling must be a mapping with a rope_type, got {value!r}", arg="rope_scaling")
    kind = value.get("rope_type", value.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_SCALINGS:
        raise ConfigError(
            f"rope_type {kind!r} is not supported; supported: default, {', '.join(ROPE_SCALINGS)}", arg="rope_scaling"
        )
    missing = [k for k in ROPE_SCALINGS[kind] if value.get(k) is None]
    if missing:
        raise ConfigError(f"rope_scaling of type {kind!r} needs {', '.join(missing)}", arg="rope_scaling")
    return (("rope_type", kind),) + tuple((k, float(value[k])) for k in ROPE_SCALINGS[kind])


def rope_frequencies(dim: int, theta: float, scaling: tuple | None = None) -> jax.Array:
    """The ``dim // 2`` inverse frequencies, rescaled as ``transformers`` does for ``llama3`` / ``linear``."""
    half = dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if not scaling:
        return freqs
    s = dict(scaling)
    if s["rope_type"] == "linear":
        return freqs / s["factor"]
    # Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth ramp between.
    factor, low, high, old = (
        s["factor"],
        s["low_freq_factor"],
        s["high_freq_factor"],
        s["original_max_position_embeddings"],
    )
    wavelen = 2 * jnp.pi / freqs
    scaled = jnp.where(wavelen > old / low, freqs / factor, freqs)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return jnp.where(medium, smoothed, scaled)


def rope(x, theta: float, scaling: tuple | None = None, positions=None):
    """Rotary position embedding over the last axis of ``(batch, length, heads, dim)``.

    ``positions`` (``(length,)`` or ``(batch, length)``) default to ``0 .. length - 1``.
    """
    t, k = x.shape[1], x.shape[-1]
    half = k // 2
    freqs = rope_frequencies(k, theta, scaling)
    pos = jnp.arange(t, dtype=jnp.float32) if positions is None else jnp.asarray(positions, jnp.float32)
    angles = pos[..., None] * freqs
    angles = angles[None, :, None, :] if angles.ndim == 2 else angles[:, :, None, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def causal_mask(t: int, window: int | None = None) -> jax.Array:
    """``(t, t)`` booleans: query ``i`` sees key ``j`` when ``j <= i`` (and ``j > i - window``)."""
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    ok = j <= i
    return ok if window is None else ok & (j > i - window)


class Attention(nn.Module):
    """Grouped-query causal attention; ``q (embed, heads, kv)``, ``k``/``v (embed, kv_heads, kv)``,
    ``o (heads, kv, embed)`` (``out_in``: outputs first, ``q (heads, kv, embed)``, ...); biases
    ``q_bias (heads, kv)``, ``k_bias``/``v_bias (kv_heads, kv)``, ``o_bias (embed,)``.
    ``rope=False`` for models with learned absolute positions (GPT-2)."""

    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    dtype: Any
    param_dtype: Any
    qkv_bias: bool = False
    out_bias: bool = False
    rope: bool = True
    rope_scaling: tuple | None = None
    window: int | None = None
    scale: float | None = None
    decode: bool = False  # keep keys and values in the `cache` collection (models/kv_cache.py)
    out_in: bool = False  # weights stored (out, in), as torch's Linear
    impl: str = "xla"  # xla | cudnn (models/fused_attention.py); the decode path always takes the einsums

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h, g, k = self.heads, self.kv_heads, self.head_dim
        pd, dt, oi = self.param_dtype, self.dtype, self.out_in
        embed, heads, groups = (("embed", d),), (("heads", h), ("kv", k)), (("kv_heads", g), ("kv", k))
        wq = kernel(self, "q", embed, heads, pd, d, oi)
        wk = kernel(self, "k", embed, groups, pd, d, oi)
        wv = kernel(self, "v", embed, groups, pd, d, oi)
        wo = kernel(self, "o", heads, embed, pd, h * k, oi)
        q = jnp.einsum(f"btd,{order(oi, 'd', 'hk')}->bthk", x, wq.astype(dt))
        kk = jnp.einsum(f"btd,{order(oi, 'd', 'gk')}->btgk", x, wk.astype(dt))
        v = jnp.einsum(f"btd,{order(oi, 'd', 'gk')}->btgk", x, wv.astype(dt))
        if self.qkv_bias:
            q = q + bias_param(self, "q_bias", ("heads", "kv"), (h, k), pd).astype(dt)
            kk = kk + bias_param(self, "k_bias", ("kv_heads", "kv"), (g, k), pd).astype(dt)
            v = v + bias_param(self, "v_bias", ("kv_heads", "kv"), (g, k), pd).astype(dt)
        q = with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        kk = with_logical_constraint(kk, ("batch", "length", "kv_heads", "kv"))
        positions = cache_positions(self, t) if self.decode else None
        if self.rope:
            q = rope(q, self.rope_theta, self.rope_scaling, positions)
            kk = rope(kk, self.rope_theta, self.rope_scaling, positions)
        v = with_logical_constraint(v, ("batch", "length", "kv_heads", "kv"))
        scale = k**-0.5 if self.scale is None else self.scale
        if self.impl == "cudnn" and not self.decode:
            out = cudnn_attention(q, kk, v, scale, self.window)
        else:
            mask = causal_mask(t, self.window)
            if self.decode:  # attend to every cached position so far, this call's included
                kk, v, mask = cached_kv(self, kk, v, positions, self.window)
            # Grouped-query: each kv head serves heads // kv_heads query heads.
            q = q.reshape(b, t, g, h // g, k)
            # Explicit axes with `length` sharded (seq): name the layouts of the two
            # attention products, which need every key position on every query shard.
            scores = jnp.einsum(
                "btgrk,bsgk->bgrts", q, kk, out_sharding=logical_spec(("batch", "kv_heads", None, "length", None))
            )
            scores = scores.astype(jnp.float32) * scale
            scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(dt)
            out = jnp.einsum(
                "bgrts,bsgk->btgrk", probs, v, out_sharding=logical_spec(("batch", "length", "kv_heads", None, None))
            ).reshape(b, t, h, k)
        out = with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        y = row_parallel(f"bthk,{order(oi, 'hk', 'd')}->btd", out, wo.astype(dt))
        if self.out_bias:
            y = y + bias_param(self, "o_bias", ("embed",), (d,), pd).astype(dt)
        return y


__all__ = ["Attention", "rope", "rope_frequencies", "parse_rope_scaling", "causal_mask", "ROPE_SCALINGS"]
