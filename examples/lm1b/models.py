"""A decoder-only Transformer LM written the way Flax's ``examples/lm1b/models.py`` is.

Like lm1b: hyperparameters in a config dataclass, ``nn.MultiHeadDotProductAttention``
and ``nn.Dense`` kernels annotated with Flax's own ``nn.with_logical_partitioning``
(attention kernels with two names for three dimensions), dropout switched by
``config.deterministic``, and the inputs shifted right *inside* the model (so the
loss is ``same_token``). Nothing here knows about the toolkit: ``lm1b.yaml`` beside
this file names it with ``_target_`` and ``partitioning`` plans, trains and
checkpoints it as written::

    partitioning train examples/lm1b/lm1b.yaml

(The tests use this file too: tests/byom.)
"""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn
from flax import struct


@struct.dataclass
class TransformerConfig:
    vocab_size: int = 256
    emb_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    qkv_dim: int = 64
    mlp_dim: int = 128
    max_len: int = 256
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    deterministic: bool = False
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.xavier_uniform()


def shift_right(x):
    return jnp.pad(x, ((0, 0), (1, 0)))[:, :-1]


class FeedForward(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        h = nn.Dense(
            c.mlp_dim,
            kernel_init=nn.with_logical_partitioning(c.kernel_init, ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
        )(x)
        h = nn.Dropout(c.dropout_rate)(nn.relu(h), deterministic=c.deterministic)
        return nn.Dense(
            x.shape[-1],
            kernel_init=nn.with_logical_partitioning(c.kernel_init, ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )(h)


class DecoderBlock(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, x, mask):
        c = self.config

        def norm():
            return nn.LayerNorm(
                scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
            )

        y = nn.MultiHeadDotProductAttention(
            num_heads=c.num_heads,
            qkv_features=c.qkv_dim,
            use_bias=False,
            broadcast_dropout=False,
            dropout_rate=c.attention_dropout_rate,
            deterministic=c.deterministic,
            kernel_init=nn.with_logical_partitioning(c.kernel_init, ("embed", "kv")),
        )(norm()(x), mask=mask)
        x = x + nn.Dropout(c.dropout_rate)(y, deterministic=c.deterministic)
        return x + FeedForward(c)(norm()(x))


class TransformerLM(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs):
        c = self.config
        mask = nn.make_causal_mask(inputs)
        y = nn.Embed(
            c.vocab_size,
            c.emb_dim,
            embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
        )(shift_right(inputs))
        pos = self.param(
            "pos_embedding",
            nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
            (c.max_len, c.emb_dim),
        )
        y = y + pos[None, : inputs.shape[1]]
        y = nn.Dropout(c.dropout_rate)(y, deterministic=c.deterministic)
        for i in range(c.num_layers):
            y = DecoderBlock(c, name=f"block_{i}")(y, mask)
        y = nn.LayerNorm(
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )(y)
        return nn.Dense(
            c.vocab_size,
            kernel_init=nn.with_logical_partitioning(c.kernel_init, ("embed", "vocab")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
            name="logits",
        )(y)
