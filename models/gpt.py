"""A decoder-only transformer annotated only with logical axis names.

Parameters (logical names in brackets):
  token embedding ``(vocab, embed)``; per block: q ``(embed, heads, kv)``,
  k/v ``(embed, kv_heads, kv)`` (grouped-query when ``kv_heads < heads``),
  o ``(heads, kv, embed)``, MLP ``wi (embed, mlp)`` / ``wo (mlp, embed)``,
  norm scales ``(embed,)``; final norm; untied unembedding ``(embed, vocab)``. With ``moe`` every
  block's MLP is a mixture of experts (:mod:`partitioning.models.moe`): router ``(embed, expert)``,
  experts ``(expert, embed, mlp)``. Positions are rotary
(RoPE), so there are no position parameters and no biases: the parameter count
of a Llama-3 shape is exact.
With ``scan_layers`` one block is scanned ``layers`` times and every block
parameter gains a leading ``layers`` axis, so compile time stays flat in depth.

Every parameter is created with its true shape (Flax's ``nn.DenseGeneral``
flattens kernel shapes before calling the initializer, which breaks 3-name
annotations), so the layers below use ``self.param`` + ``einsum`` directly.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import (
    compute_spec,
    logical_spec,
    param_for_compute,
    with_logical_constraint,
    with_logical_partitioning,
)
from partitioning.context import get_logical_axis_rules
from partitioning.errors import ConfigError
from partitioning.models.checks import choice, divides, float_dtype, positive
from partitioning.models.moe import MoE, MoeMlp
from partitioning.parallel.pipeline import LayerStack
from partitioning.registry import register_model

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _param(mod: nn.Module, name: str, names: tuple, shape: tuple, dtype: Any, fan_in: int):
    init = nn.initializers.normal(stddev=fan_in**-0.5)
    return param_for_compute(mod.param(name, with_logical_partitioning(init, names), shape, dtype), names)


class Norm(nn.Module):
    """RMSNorm (``rms``: a scale, as in Llama) or LayerNorm (``layer``: scale and bias); statistics in float32."""

    kind: str = "rms"
    eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        def vector(name, init):
            box = with_logical_partitioning(init, ("embed",))
            return param_for_compute(self.param(name, box, (x.shape[-1],), self.param_dtype), ("embed",))

        x32 = x.astype(jnp.float32)
        scale = vector("scale", nn.initializers.ones).astype(jnp.float32)
        if self.kind == "rms":
            return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps) * scale).astype(
                self.dtype
            )
        bias = vector("bias", nn.initializers.zeros).astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
        return ((x32 - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias).astype(self.dtype)


def _norm(kind: str, dtype, param_dtype, name: str):
    return Norm(kind, dtype=dtype, param_dtype=param_dtype, name=name)


def _embed(emb, tokens):
    """``emb[tokens]``; on Explicit axes JAX cannot infer a gather's output layout, so it is named."""
    spec = logical_spec(("batch", "length", "embed"))
    if spec is None:
        if get_logical_axis_rules() and not jax.sharding.get_abstract_mesh().empty:
            # Gather the table over the batch axes first (FSDP's all-gather), so the lookup is local:
            # XLA cannot move a lookup split along `embed` to a batch split over several axes (ep)
            # without replicating the activations.
            emb = jax.lax.with_sharding_constraint(emb, compute_spec(("vocab", "embed")))
        return jnp.take(emb, tokens, axis=0)
    return emb.at[tokens].get(out_sharding=spec, mode="fill")


def _row_parallel(equation: str, h, w):
    """An output projection contracting a (tensor-sharded) dimension back to ``embed``.

    On Explicit axes JAX cannot infer the output layout of a contraction over
    a sharded dimension, so it is named; on Auto axes XLA inserts the all-reduce.
    """
    y = jnp.einsum(equation, h, w, out_sharding=logical_spec(("batch", "length", "embed")))
    return with_logical_constraint(y, ("batch", "length", "embed"))


def rope(x, theta: float):
    """Rotary position embedding over the last axis of ``(batch, length, heads, dim)``."""
    t, k = x.shape[1], x.shape[-1]
    half = k // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nn.Module):
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h, g, k = self.heads, self.kv_heads, self.head_dim
        pd, dt = self.param_dtype, self.dtype
        wq = _param(self, "q", ("embed", "heads", "kv"), (d, h, k), pd, d)
        wk = _param(self, "k", ("embed", "kv_heads", "kv"), (d, g, k), pd, d)
        wv = _param(self, "v", ("embed", "kv_heads", "kv"), (d, g, k), pd, d)
        wo = _param(self, "o", ("heads", "kv", "embed"), (h, k, d), pd, h * k)
        q = jnp.einsum("btd,dhk->bthk", x, wq.astype(dt))
        kk = jnp.einsum("btd,dgk->btgk", x, wk.astype(dt))
        v = jnp.einsum("btd,dgk->btgk", x, wv.astype(dt))
        q = rope(with_logical_constraint(q, ("batch", "length", "heads", "kv")), self.rope_theta)
        kk = rope(with_logical_constraint(kk, ("batch", "length", "kv_heads", "kv")), self.rope_theta)
        v = with_logical_constraint(v, ("batch", "length", "kv_heads", "kv"))
        # Grouped-query: each kv head serves heads // kv_heads query heads.
        q = q.reshape(b, t, g, h // g, k)
        # Explicit axes with `length` sharded (seq): name the layouts of the two
        # attention products, which need every key position on every query shard.
        scores = jnp.einsum(
            "btgrk,bsgk->bgrts", q, kk, out_sharding=logical_spec(("batch", "kv_heads", None, "length", None))
        )
        scores = scores.astype(jnp.float32) * (k**-0.5)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum(
            "bgrts,bsgk->btgrk", probs, v, out_sharding=logical_spec(("batch", "length", "kv_heads", None, None))
        ).reshape(b, t, h, k)
        out = with_logical_constraint(out, ("batch", "length", "heads", "kv"))
        return _row_parallel("bthk,hkd->btd", out, wo.astype(dt))


class MlpBlock(nn.Module):
    mlp: int
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        # SwiGLU (as in Llama): gate and up projections, then down.
        wi_0 = _param(self, "wi_0", ("embed", "mlp"), (d, self.mlp), self.param_dtype, d)
        wi_1 = _param(self, "wi_1", ("embed", "mlp"), (d, self.mlp), self.param_dtype, d)
        wo = _param(self, "wo", ("mlp", "embed"), (self.mlp, d), self.param_dtype, self.mlp)
        gate = jnp.einsum("btd,dm->btm", x, wi_0.astype(self.dtype))
        up = jnp.einsum("btd,dm->btm", x, wi_1.astype(self.dtype))
        hdn = nn.silu(gate) * up
        hdn = with_logical_constraint(hdn, ("batch", "length", "mlp"))
        return _row_parallel("btm,md->btd", hdn, wo.astype(self.dtype))


class Block(nn.Module):
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    norm: str
    rope_theta: float
    dtype: Any
    param_dtype: Any
    moe: MoE | None = None

    @nn.compact
    def __call__(self, x, _=None):
        y = _norm(self.norm, self.dtype, self.param_dtype, "attn_norm")(x)
        x = x + Attention(
            self.heads, self.kv_heads, self.head_dim, self.rope_theta, self.dtype, self.param_dtype, name="attn"
        )(y)
        y = _norm(self.norm, self.dtype, self.param_dtype, "mlp_norm")(x)
        if self.moe is not None:
            x = x + MoeMlp(self.moe, self.mlp, self.dtype, self.param_dtype, name="mlp")(y)
        else:
            x = x + MlpBlock(self.mlp, self.dtype, self.param_dtype, name="mlp")(y)
        x = with_logical_constraint(x, ("batch", "length", "embed"))
        return x, None


@register_model("gpt")
class GPT(nn.Module):
    """Decoder-only transformer; tokens ``(batch, length)`` -> logits ``(batch, length, vocab)``."""

    vocab_size: int = 256
    embed: int = 128
    heads: int = 4
    kv_heads: int | None = None  # None: = heads (multi-head); fewer: grouped-query
    head_dim: int | None = None  # None: embed // heads
    mlp: int = 512
    layers: int = 4
    rope_theta: float = 10000.0
    norm: str = "rms"  # rms | layer
    scan_layers: bool = True
    remat: str = "none"  # none | full | dots | dots_no_batch
    dtype: str = "float32"  # compute dtype, e.g. bfloat16
    param_dtype: str = "float32"
    moe: Any = None  # {experts, top_k, capacity_factor | dropless, aux_loss_weight}: MoE MLPs

    def __post_init__(self):
        positive(self, "vocab_size", "embed", "heads", "kv_heads", "head_dim", "mlp", "layers")
        divides(self, "kv_heads", "heads")
        if self.head_dim is None:
            divides(self, "heads", "embed")
        head_dim = self.head_dim or self.embed // self.heads
        if head_dim % 2:
            # RoPE rotates pairs of features; an odd head size fails deep inside attention.
            arg = "head_dim" if self.head_dim else "embed"
            how = (
                f"head_dim {head_dim}" if self.head_dim else f"embed / heads = {self.embed} / {self.heads} = {head_dim}"
            )
            raise ConfigError(f"{how} must be even: rotary position embeddings rotate pairs of features", arg=arg)
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.rope_theta!r}", arg="rope_theta")
        choice(self, "norm", ("rms", "layer"))
        choice(self, "remat", REMAT_POLICIES)
        float_dtype(self, "dtype", "param_dtype")
        MoE.parse(self.moe)  # a bad `moe:` option fails at construction, naming `moe`
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens, deterministic: bool = True):
        dt, pd = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
        kv_heads = self.kv_heads or self.heads
        head_dim = self.head_dim or self.embed // self.heads
        emb = param_for_compute(
            self.param(
                "embedding",
                with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
                (self.vocab_size, self.embed),
                pd,
            ),
            ("vocab", "embed"),
        )
        x = _embed(emb, tokens).astype(dt)
        x = with_logical_constraint(x, ("batch", "length", "embed"))

        block = Block
        if self.remat != "none":
            block = nn.remat(Block, policy=REMAT_POLICIES[self.remat], prevent_cse=not self.scan_layers)
        kw: dict[str, Any] = dict(
            heads=self.heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            mlp=self.mlp,
            norm=self.norm,
            rope_theta=self.rope_theta,
            dtype=dt,
            param_dtype=pd,
            moe=MoE.parse(self.moe),
        )
        if self.scan_layers:
            # nn.scan over a `layers` axis; a GPipe pipeline when the mesh has a `stage` axis.
            x, _ = LayerStack(block, self.layers, kw, name="blocks")(x)
        else:
            for i in range(self.layers):
                x, _ = block(**kw, name=f"block_{i}")(x, None)
        x = _norm(self.norm, dt, pd, "final_norm")(x)
        w = _param(self, "unembed", ("embed", "vocab"), (self.embed, self.vocab_size), pd, self.embed)
        logits = jnp.einsum("btd,dv->btv", x, w.astype(dt)).astype(jnp.float32)
        return with_logical_constraint(logits, ("batch", "length", "vocab"))
