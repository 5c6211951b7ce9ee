"""A byte-level MLP language model: the smallest model with real layouts.

Each position predicts the next byte from its own embedding through a stack of
MLP blocks. Parameters: embedding ``(vocab, embed)``, per block ``wi (embed, mlp)``
and ``wo (mlp, embed)``, unembedding ``(embed, vocab)``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from partitioning.boxes import logical_spec, param_for_compute, with_logical_constraint, with_logical_partitioning
from partitioning.model.registry import register_model
from partitioning.models.checks import float_dtype, positive

_init = nn.initializers.normal(stddev=0.02)


def _param(mod: nn.Module, name: str, names: tuple, shape: tuple, dtype):
    # param_for_compute: on Explicit mesh axes the FSDP all-gather is explicit; identity on Auto.
    return param_for_compute(mod.param(name, with_logical_partitioning(_init, names), shape, dtype), names)


@register_model("mlp")
class MLP(nn.Module):
    vocab_size: int = 256
    embed: int = 64
    mlp: int = 256
    layers: int = 2
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        positive(self, "vocab_size", "embed", "mlp", "layers")
        float_dtype(self, "dtype", "param_dtype")
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens, deterministic: bool = True):
        dtype, pdtype = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
        emb = _param(self, "embedding", ("vocab", "embed"), (self.vocab_size, self.embed), pdtype)
        out_spec = logical_spec(("batch", "length", "embed"))  # None (XLA decides) unless Explicit axes
        if out_spec is None:
            x = jnp.take(emb, tokens, axis=0).astype(dtype)
        else:  # JAX cannot infer a gather's output layout on Explicit axes
            x = emb.at[tokens].get(out_sharding=out_spec, mode="fill").astype(dtype)
        x = with_logical_constraint(x, ("batch", "length", "embed"))
        for i in range(self.layers):
            wi = _param(self, f"wi_{i}", ("embed", "mlp"), (self.embed, self.mlp), pdtype)
            wo = _param(self, f"wo_{i}", ("mlp", "embed"), (self.mlp, self.embed), pdtype)
            h = nn.gelu(x @ wi.astype(dtype))
            h = with_logical_constraint(h, ("batch", "length", "mlp"))
            # Row-parallel: contracts the (tensor-sharded) mlp dimension.
            x = x + jnp.matmul(h, wo.astype(dtype), out_sharding=out_spec)
            x = with_logical_constraint(x, ("batch", "length", "embed"))
        w_out = _param(self, "unembed", ("embed", "vocab"), (self.embed, self.vocab_size), pdtype)
        logits = (x @ w_out.astype(dtype)).astype(jnp.float32)
        return with_logical_constraint(logits, ("batch", "length", "vocab"))
