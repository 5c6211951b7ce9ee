"""A MaxText-style block (written for these tests): parameters named as MaxText names them, activations
constrained with MaxText's ``activation_*`` names through Flax's own ``nn.with_logical_constraint``.

``names="plain"`` builds the same block with the toolkit's own activation names, for comparison.
"""

import flax.linen as nn
import jax.numpy as jnp

MAXTEXT = {
    "batch": "activation_batch",
    "length": "activation_length",
    "embed": "activation_embed",
    "mlp": "activation_mlp",
    "heads": "activation_heads",
    "kv": "activation_kv",
}
PLAIN = {k: k for k in MAXTEXT}


class MlpBlock(nn.Module):
    embed: int = 64
    mlp: int = 256
    heads: int = 4
    names: str = "maxtext"

    @nn.compact
    def __call__(self, x):
        n = MAXTEXT if self.names == "maxtext" else PLAIN
        init = nn.initializers.lecun_normal()

        def param(name, shape, axes):
            return self.param(name, nn.with_logical_partitioning(init, axes), shape)

        act = lambda y, *kinds: nn.with_logical_constraint(y, tuple(n[k] for k in kinds))  # noqa: E731
        x = act(x, "batch", "length", "embed")
        q = jnp.einsum(
            "bte,ehk->bthk", x, param("q", (self.embed, self.heads, self.embed // self.heads), ("embed", "heads", "kv"))
        )
        q = act(q, "batch", "length", "heads", "kv")
        x = x + act(
            jnp.einsum(
                "bthk,hke->bte",
                q,
                param("o", (self.heads, self.embed // self.heads, self.embed), ("heads", "kv", "embed")),
            ),
            "batch",
            "length",
            "embed",
        )
        h = act(nn.gelu(x @ param("wi", (self.embed, self.mlp), ("embed", "mlp"))), "batch", "length", "mlp")
        return act(x + h @ param("wo", (self.mlp, self.embed), ("mlp", "embed")), "batch", "length", "embed")
