"""A small NNX decoder in the style of Flax's Gemma example (``examples/gemma``; written for these tests).

As there: a ``ShardingConfig`` of mesh-axis PartitionSpecs (no logical names),
parameters annotated through ``kernel_metadata={'out_sharding': ...}``, and
every projection called with ``out_sharding=`` — which JAX accepts only on
``Explicit`` mesh axes, so the model runs under ``mesh.axis_types: explicit``
(and fails to trace on ``Auto`` axes, as the example does).
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    """Mesh-axis specs of the weights and activations (Flax's Gemma ``ShardingConfig``, trimmed)."""

    emb_vd: P | None = None
    q_weight_ndh: P | None = None
    o_weight_nhd: P | None = None
    ffw_weight_df: P | None = None
    ffw_weight_fd: P | None = None
    rms_norm_weight: P | None = None
    act_btd: P | None = None
    act_btf: P | None = None
    act_btnh: P | None = None

    @staticmethod
    def fsdp_tp(fsdp: str = "fsdp", tp: str = "tensor") -> "ShardingConfig":
        return ShardingConfig(
            emb_vd=P(tp, fsdp),
            q_weight_ndh=P(tp, fsdp, None),
            o_weight_nhd=P(tp, None, fsdp),
            ffw_weight_df=P(fsdp, tp),
            ffw_weight_fd=P(tp, fsdp),
            rms_norm_weight=P(tp),
            act_btd=P(fsdp, None, tp),
            act_btf=P(fsdp, None, tp),
            act_btnh=P(fsdp, None, tp, None),
        )


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, shd: ShardingConfig, rngs: nnx.Rngs):
        self.scale = nnx.Param(jnp.zeros((dim,)), out_sharding=shd.rms_norm_weight)

    def __call__(self, x):
        var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(var + 1e-6) * (1 + self.scale[...])


class Attention(nnx.Module):
    def __init__(self, embed: int, heads: int, head_dim: int, shd: ShardingConfig, rngs: nnx.Rngs):
        def einsum(spec, shape, sharding):
            return nnx.Einsum(spec, shape, kernel_metadata={"out_sharding": sharding}, rngs=rngs)

        self.shd = shd
        self.q = einsum("BTD,NDH->BTNH", (heads, embed, head_dim), shd.q_weight_ndh)
        self.k = einsum("BTD,NDH->BTNH", (heads, embed, head_dim), shd.q_weight_ndh)
        self.v = einsum("BTD,NDH->BTNH", (heads, embed, head_dim), shd.q_weight_ndh)
        self.o = einsum("BTNH,NHD->BTD", (heads, head_dim, embed), shd.o_weight_nhd)

    def __call__(self, x):
        q = self.q(x, out_sharding=self.shd.act_btnh)
        k = self.k(x, out_sharding=self.shd.act_btnh)
        v = self.v(x, out_sharding=self.shd.act_btnh)
        t = x.shape[1]
        logits = jnp.einsum("BTNH,BSNH->BTNS", q * q.shape[-1] ** -0.5, k)
        mask = jnp.tril(jnp.ones((t, t), bool))[None, :, None, :]
        probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
        encoded = jnp.einsum("BTNS,BSNH->BTNH", probs, v)
        return self.o(encoded, out_sharding=self.shd.act_btd)


class FeedForward(nnx.Module):
    def __init__(self, embed: int, hidden: int, shd: ShardingConfig, rngs: nnx.Rngs):
        def linear(i, o, sharding):
            return nnx.Linear(i, o, use_bias=False, kernel_metadata={"out_sharding": sharding}, rngs=rngs)

        self.shd = shd
        self.gate = linear(embed, hidden, shd.ffw_weight_df)
        self.up = linear(embed, hidden, shd.ffw_weight_df)
        self.down = linear(hidden, embed, shd.ffw_weight_fd)

    def __call__(self, x):
        h = nnx.gelu(self.gate(x, out_sharding=self.shd.act_btf)) * self.up(x, out_sharding=self.shd.act_btf)
        return self.down(h, out_sharding=self.shd.act_btd)


class Block(nnx.Module):
    def __init__(self, embed, heads, head_dim, hidden, shd, rngs):
        self.pre_attn = RMSNorm(embed, shd, rngs)
        self.attn = Attention(embed, heads, head_dim, shd, rngs)
        self.pre_ffw = RMSNorm(embed, shd, rngs)
        self.ffw = FeedForward(embed, hidden, shd, rngs)

    def __call__(self, x):
        x = x + self.attn(self.pre_attn(x))
        return x + self.ffw(self.pre_ffw(x))


class Gemma(nnx.Module):
    """Tokens ``(batch, length)`` -> logits ``(batch, length, vocab)``; weights tied as in Gemma."""

    def __init__(
        self,
        vocab: int = 256,
        embed: int = 32,
        heads: int = 4,
        head_dim: int = 8,
        hidden: int = 64,
        layers: int = 2,
        fsdp: str = "fsdp",
        tp: str = "tensor",
        *,
        rngs: nnx.Rngs,
    ):
        shd = ShardingConfig.fsdp_tp(fsdp, tp)
        self.shd = shd
        self.embedder = nnx.Embed(vocab, embed, embedding_metadata={"out_sharding": shd.emb_vd}, rngs=rngs)
        self.blocks = nnx.List([Block(embed, heads, head_dim, hidden, shd, rngs) for _ in range(layers)])
        self.final_norm = RMSNorm(embed, shd, rngs)

    def __call__(self, tokens):
        x = self.embedder(tokens, out_sharding=self.shd.act_btd) * jnp.sqrt(self.embedder.features)
        for block in self.blocks:
            x = block(x)
        return self.embedder.attend(self.final_norm(x), out_sharding=P(*self.shd.act_btd[:2], None))
