"""A decoder-only Linen transformer written the way most research code is: no logical names anywhere.

Flax's own attention (3-D ``DenseGeneral`` kernels: ``(embed, heads, head_dim)``
and ``(heads, head_dim, embed)``), a 4x MLP, LayerNorms and an untied output
head. Written for these tests; nothing in it knows about sharding.
"""

import flax.linen as nn
import jax.numpy as jnp


class Block(nn.Module):
    width: int
    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(h, h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.hidden)(h)
        return x + nn.Dense(self.width)(nn.gelu(h))


class TransformerLM(nn.Module):
    vocab: int = 256
    width: int = 64
    heads: int = 4
    hidden: int = 128
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width)(tokens)
        x = x + self.param("position", nn.initializers.normal(0.02), (tokens.shape[1], self.width))
        for _ in range(self.layers):
            x = Block(self.width, self.heads, self.hidden)(x)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))
