"""A Linen MLP block constrained MaxText-style with Flax's own ``nn.with_logical_constraint`` (for these tests).

Activations carry ``activation_batch`` / ``activation_length`` / ``activation_embed``
/ ``activation_mlp``; parameters ``embed`` / ``mlp`` via ``nn.with_logical_partitioning``.
"""

import flax.linen as nn
import jax.numpy as jnp

ACT = ("activation_batch", "activation_length", "activation_embed")


class MaxTextStyleLM(nn.Module):
    vocab: int = 256
    embed: int = 64
    mlp: int = 128

    @nn.compact
    def __call__(self, tokens):
        emb = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
            (self.vocab, self.embed),
        )
        x = nn.with_logical_constraint(jnp.take(emb, tokens, axis=0), ACT)
        wi = self.param(
            "wi", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")), (self.embed, self.mlp)
        )
        wo = self.param(
            "wo", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")), (self.mlp, self.embed)
        )
        h = nn.with_logical_constraint(nn.relu(x @ wi), ("activation_batch", "activation_length", "activation_mlp"))
        x = nn.with_logical_constraint(x + h @ wo, ACT)
        return x @ emb.T
