"""A byte-level MLP language model: the smallest model with real layouts.

Each position predicts the next byte from its own embedding through a stack of
MLP blocks. Parameters: embedding ``(vocab, embed)``, per block ``wi (embed, mlp)``
and ``wo (mlp, embed)``, unembedding ``(embed, vocab)``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from partitioning import register_model, with_logical_constraint, with_logical_partitioning

_init = nn.initializers.normal(stddev=0.02)


@register_model("mlp")
class MLP(nn.Module):
    vocab_size: int = 256
    embed: int = 64
    mlp: int = 256
    layers: int = 2
    dtype: str = "float32"
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, tokens, deterministic: bool = True):
        dtype, pdtype = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
        emb = self.param("embedding", with_logical_partitioning(_init, ("vocab", "embed")),
                         (self.vocab_size, self.embed), pdtype)
        x = jnp.take(emb, tokens, axis=0).astype(dtype)
        x = with_logical_constraint(x, ("batch", "length", "embed"))
        for i in range(self.layers):
            wi = self.param(f"wi_{i}", with_logical_partitioning(_init, ("embed", "mlp")),
                            (self.embed, self.mlp), pdtype)
            wo = self.param(f"wo_{i}", with_logical_partitioning(_init, ("mlp", "embed")),
                            (self.mlp, self.embed), pdtype)
            h = nn.gelu(x @ wi.astype(dtype))
            h = with_logical_constraint(h, ("batch", "length", "mlp"))
            x = x + h @ wo.astype(dtype)
            x = with_logical_constraint(x, ("batch", "length", "embed"))
        w_out = self.param("unembed", with_logical_partitioning(_init, ("embed", "vocab")),
                           (self.embed, self.vocab_size), pdtype)
        logits = (x @ w_out.astype(dtype)).astype(jnp.float32)
        return with_logical_constraint(logits, ("batch", "length", "vocab"))
