"""A Flax NNX twin of the reference GPT (written for these tests): the same parameters, names and math.

Parameter paths (``embedding``, ``blocks/attn/q``, ``blocks/mlp/wi_0``, ...) and
logical names equal the Linen ``partitioning.models.GPT`` with
``scan_layers=True``: the blocks are created with ``nnx.vmap`` (adding the
``layers`` axis to every annotation) and applied with a scan, so the same
params give the same logits.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from partitioning.models.gpt import rope  # the same rotary embedding as the Linen GPT


def _init(fan_in):
    return nnx.initializers.normal(stddev=fan_in**-0.5)


def param(rngs, shape, names, fan_in):
    return nnx.Param(nnx.with_partitioning(_init(fan_in), names)(rngs.params(), shape))


def constrain(x, names):
    # Flax's own logical constraint: resolved by whatever rule context is in force.
    return nn.with_logical_constraint(x, names)


class RMSNorm(nnx.Module):
    def __init__(self, dim, rngs):
        self.scale = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, ("embed",))(rngs.params(), (dim,)))

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, d, heads, rngs):
        k = d // heads
        self.heads = heads
        self.q = param(rngs, (d, heads, k), ("embed", "heads", "kv"), d)
        self.k = param(rngs, (d, heads, k), ("embed", "kv_heads", "kv"), d)
        self.v = param(rngs, (d, heads, k), ("embed", "kv_heads", "kv"), d)
        self.o = param(rngs, (heads, k, d), ("heads", "kv", "embed"), d)

    def __call__(self, x):
        b, t, d = x.shape
        h = self.heads
        k = d // h
        q = rope(constrain(jnp.einsum("btd,dhk->bthk", x, self.q[...]), ("batch", "length", "heads", "kv")), 10000.0)
        kk = rope(
            constrain(jnp.einsum("btd,dgk->btgk", x, self.k[...]), ("batch", "length", "kv_heads", "kv")), 10000.0
        )
        v = constrain(jnp.einsum("btd,dgk->btgk", x, self.v[...]), ("batch", "length", "kv_heads", "kv"))
        q = q.reshape(b, t, h, 1, k)
        scores = jnp.einsum("btgrk,bsgk->bgrts", q, kk).astype(jnp.float32) * (k**-0.5)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bgrts,bsgk->btgrk", probs, v).reshape(b, t, h, k)
        out = constrain(out, ("batch", "length", "heads", "kv"))
        return constrain(jnp.einsum("bthk,hkd->btd", out, self.o[...]), ("batch", "length", "embed"))


class Mlp(nnx.Module):
    def __init__(self, d, m, rngs):
        self.wi_0 = param(rngs, (d, m), ("embed", "mlp"), d)
        self.wi_1 = param(rngs, (d, m), ("embed", "mlp"), d)
        self.wo = param(rngs, (m, d), ("mlp", "embed"), m)

    def __call__(self, x):
        h = nnx.silu(jnp.einsum("btd,dm->btm", x, self.wi_0[...])) * jnp.einsum("btd,dm->btm", x, self.wi_1[...])
        h = constrain(h, ("batch", "length", "mlp"))
        return constrain(jnp.einsum("btm,md->btd", h, self.wo[...]), ("batch", "length", "embed"))


class Block(nnx.Module):
    def __init__(self, d, heads, m, rngs):
        self.attn_norm = RMSNorm(d, rngs)
        self.attn = Attention(d, heads, rngs)
        self.mlp_norm = RMSNorm(d, rngs)
        self.mlp = Mlp(d, m, rngs)

    def __call__(self, x):
        x = x + self.attn(self.attn_norm(x))
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "length", "embed"))


class GPT(nnx.Module):
    def __init__(self, vocab_size=256, embed=32, heads=4, mlp=64, layers=2, *, rngs: nnx.Rngs):
        self.embedding = nnx.Param(
            nnx.with_partitioning(nnx.initializers.normal(1.0), ("vocab", "embed"))(rngs.params(), (vocab_size, embed))
        )

        @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def blocks(r):
            return Block(embed, heads, mlp, r)

        self.blocks = blocks(rngs.split(layers))
        self.final_norm = RMSNorm(embed, rngs)
        self.unembed = param(rngs, (embed, vocab_size), ("embed", "vocab"), embed)

    def __call__(self, tokens):
        x = constrain(jnp.take(self.embedding[...], tokens, axis=0), ("batch", "length", "embed"))
        x, _ = jax.lax.scan(lambda x, block: (block(x), None), x, self.blocks)
        logits = jnp.einsum("btd,dv->btv", self.final_norm(x), self.unembed[...]).astype(jnp.float32)
        return constrain(logits, ("batch", "length", "vocab"))
