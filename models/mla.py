"""Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank latents, a latent KV cache.

Per token, the keys and values of every head come from one ``kv_lora``-wide latent ``c = norm(x W_kv_a)``
(expanded by ``W_kv_b`` into each head's no-RoPE key part and its value) plus one ``rope``-wide key part
shared by every head (``x W_k_rope``, rotated); the queries go through their own ``q_lora`` latent
(``norm(x W_q_a) W_q_b``) or straight from ``x`` (``q_lora_rank`` null). Each head's query and key are its
``nope`` features then its ``rope`` features; scores are scaled by ``(nope + rope) ** -0.5`` times YaRN's
``mscale`` squared (transformers' ``yarn_apply_mscale``). DeepSeek's checkpoints store the RoPE features in
interleaved pairs (``rope_interleave``): they are de-interleaved before the rotation, as transformers does.

Parameters (logical names; ``out_in`` as torch stores them): ``q_a (q_lora, embed)``, ``q_a_norm/scale
(q_lora,)``, ``q_b (heads, kv, q_lora)`` (or ``q (heads, kv, embed)``), ``kv_a (kv_lora, embed)``,
``k_rope (kv, embed)``, ``kv_a_norm/scale (kv_lora,)``, ``kv_b (heads, kv, kv_lora)`` (each head's
``nope + v`` rows), ``o (embed, heads, kv)``. The latent axes ``q_lora`` / ``kv_lora`` are what the rule
tables lay out (every preset replicates them: a few hundred wide, contracted right away).

In decode mode the cache holds the latent and the shared rotated key, ``cached_latent (batch, length,
kv_lora)`` and ``cached_rope (batch, length, kv)``, not every head's keys and values: ``kv_lora + rope``
numbers a token (576 for DeepSeek-V3) instead of ``heads x (2 x 128 + 64)``.

Example::

    >>> from partitioning.models.mla import MLA, MLAShape
    >>> shape = MLAShape(q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12)
    >>> attn = MLA(4, shape, 10000.0, jnp.float32, jnp.float32)
    >>> x = jax.random.normal(jax.random.key(1), (2, 10, 32))
    >>> v = jax.jit(attn.init)(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, pt.unbox(v))["params"]["kv_b"], pt.logical_names(v)["params"]["kv_a"]  # (in, out)
    ((16, 4, 20), ('embed', 'kv_lora'))
    >>> jax.jit(attn.apply)(v, x).shape
    (2, 10, 32)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import with_logical_constraint, with_logical_partitioning
from partitioning.decode.cache import CACHE, cache_positions
from partitioning.errors import ConfigError
from partitioning.models.attention import causal_mask, rope, segment_mask
from partitioning.models.layers import Norm, bias_param, kernel, order, row_parallel

LATENT_NAMES = ("batch", "length", "kv_lora")
ROPE_NAMES = ("batch", "length", "kv")


@dataclasses.dataclass(frozen=True)
class MLAShape:
    """The sizes of multi-head latent attention (DeepSeek's ``config.json`` names)."""

    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    rope_interleave: bool = True

    @classmethod
    def parse(cls, value: Any) -> MLAShape | None:
        """``None`` / a mapping / an ``MLAShape`` -> ``MLAShape | None``; a ConfigError naming ``mla``."""
        if value is None or isinstance(value, MLAShape):
            return value
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, Mapping) or any(k not in names for k in value):
            raise ConfigError(f"mla must be a mapping of {', '.join(names)}, got {value!r}", arg="mla")
        shape = cls(**dict(value))
        sizes = [shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim, shape.v_head_dim]
        if shape.q_lora_rank is not None:
            sizes.append(shape.q_lora_rank)
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) or shape.qk_rope_head_dim % 2:
            raise ConfigError(f"mla sizes must be integers >= 1 (qk_rope_head_dim even), got {value!r}", arg="mla")
        return shape


def mscale(scaling: tuple | None) -> float:
    """YaRN's ``mscale_all_dim`` factor on DeepSeek's attention scale (squared there); 1 without YaRN."""
    s = dict(scaling or ())
    if s.get("rope_type") != "yarn" or not s.get("mscale_all_dim") or s["factor"] <= 1:
        return 1.0
    return 0.1 * float(s["mscale_all_dim"]) * math.log(float(s["factor"])) + 1.0


def deinterleave(x: jax.Array) -> jax.Array:
    """``(x0, x1), (x2, x3), ...`` pairs -> ``x0, x2, ..., x1, x3, ...`` (the rotate-half layout)."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


class MLA(nn.Module):
    """Multi-head latent attention (see the module docstring)."""

    heads: int
    shape: MLAShape
    rope_theta: float
    dtype: Any
    param_dtype: Any
    rope_scaling: tuple | None = None
    bias: bool = False  # attention_bias: q_a, kv_a and o biases
    norm_eps: float = 1e-6
    decode: bool = False
    out_in: bool = False

    @nn.compact
    def __call__(self, x, segment_ids=None, positions=None, **unused):
        b, t, d = x.shape
        s, h, pd, dt, oi = self.shape, self.heads, self.param_dtype, self.dtype, self.out_in
        nope, rd, vd, kvl = s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank
        embed = (("embed", d),)

        def proj(name, y, ins, outs, fan_in, eq_in, eq_out):
            w = kernel(self, name, ins, outs, pd, fan_in, oi)
            return jnp.einsum(f"bt{eq_in},{order(oi, eq_in, eq_out)}->bt{eq_out}", y, w.astype(dt))

        def norm(name, y, axis):
            return Norm("rms", self.norm_eps, dt, pd, axis=axis, name=name)(y)

        qk = (("heads", h), ("kv", nope + rd))
        if s.q_lora_rank is None:
            q = proj("q", x, embed, qk, d, "d", "hk")
        else:
            lat = (("q_lora", s.q_lora_rank),)
            cq = proj("q_a", x, embed, lat, d, "d", "l")
            if self.bias:
                cq = cq + bias_param(self, "q_a_bias", ("q_lora",), (s.q_lora_rank,), pd).astype(dt)
            q = proj("q_b", norm("q_a_norm", cq, "q_lora"), lat, qk, s.q_lora_rank, "l", "hk")
        q = with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        c = proj("kv_a", x, embed, (("kv_lora", kvl),), d, "d", "l")
        kr = proj("k_rope", x, embed, (("kv", rd),), d, "d", "r")
        if self.bias:
            c = c + bias_param(self, "kv_a_bias", ("kv_lora",), (kvl,), pd).astype(dt)
            kr = kr + bias_param(self, "k_rope_bias", ("kv",), (rd,), pd).astype(dt)
        c = with_logical_constraint(norm("kv_a_norm", c, "kv_lora"), LATENT_NAMES)
        if self.decode:
            positions = cache_positions(self, t)
        q_pass, q_rot = q[..., :nope], q[..., nope:]
        if s.rope_interleave:
            q_rot, kr = deinterleave(q_rot), deinterleave(kr)
        q_rot = rope(q_rot, self.rope_theta, self.rope_scaling, positions)
        kr = rope(kr[:, :, None], self.rope_theta, self.rope_scaling, positions)[:, :, 0]
        mask = causal_mask(t) if segment_ids is None else segment_mask(segment_ids)[:, :, 0]  # (b, 1, t, s)
        if self.decode:
            c, kr, mask = self._cached(c, kr, positions)
        # Each head's no-RoPE key part and value from the latent (the cache holds only the latent).
        wkv = kernel(self, "kv_b", (("kv_lora", kvl),), (("heads", h), ("kv", nope + vd)), pd, kvl, oi)
        kv = jnp.einsum(f"bsl,{order(oi, 'l', 'hk')}->bshk", c, wkv.astype(dt))
        kv = with_logical_constraint(kv, ("batch", "length", "heads", "kv"))
        k_nope, v = kv[..., :nope], kv[..., nope:]
        scores = jnp.einsum("bthk,bshk->bhts", q_pass, k_nope) + jnp.einsum("bthr,bsr->bhts", q_rot, kr)
        scale = (nope + rd) ** -0.5 * mscale(self.rope_scaling) ** 2
        scores = jnp.where(mask, scores.astype(jnp.float32) * scale, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = with_logical_constraint(jnp.einsum("bhts,bshk->bthk", probs, v), ("batch", "length", "heads", "kv"))
        wo = kernel(self, "o", (("heads", h), ("kv", vd)), embed, pd, h * vd, oi)
        y = row_parallel(f"bthk,{order(oi, 'hk', 'd')}->btd", out, wo.astype(dt))
        if self.bias:
            y = y + bias_param(self, "o_bias", ("embed",), (d,), pd).astype(dt)
        return y

    def _cached(self, c: jax.Array, kr: jax.Array, positions: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(every cached latent, every cached rotated key part, the ``(t, max_len)`` mask) after writing this call's."""
        b, t, _ = c.shape
        latent: Any = self.variable(
            CACHE, "cached_latent", with_logical_partitioning(jnp.zeros, LATENT_NAMES), c.shape, c.dtype
        )
        rotated: Any = self.variable(
            CACHE, "cached_rope", with_logical_partitioning(jnp.zeros, ROPE_NAMES), kr.shape, kr.dtype
        )
        index: Any = self.variable(CACHE, "cache_index", lambda: jnp.zeros((), jnp.int32))
        if positions is None:  # initialising: the cache takes this call's shapes
            return c, kr, jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        start = index.value
        latent.value = with_logical_constraint(
            jax.lax.dynamic_update_slice(latent.value, c, (0, start, 0)), LATENT_NAMES
        )
        rotated.value = with_logical_constraint(
            jax.lax.dynamic_update_slice(rotated.value, kr, (0, start, 0)), ROPE_NAMES
        )
        index.value = start + t
        return latent.value, rotated.value, jnp.arange(latent.value.shape[1])[None, :] <= positions[:, None]


__all__ = ["MLA", "MLAShape", "mscale", "deinterleave", "LATENT_NAMES", "ROPE_NAMES"]
