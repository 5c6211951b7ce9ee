"""A text classifier in the shape of Flax's SST-2 example, nobody's names on it: an embedding table narrower than
the encoder (64 wide under a 128-wide encoder) that it looks up by hand (``jnp.take`` on a param called
``table``: no name says "embedding"), the encoder, a classifier head, and a feature table no rule of thumb names."""

import flax.linen as nn
import jax.numpy as jnp


class Lookup(nn.Module):
    vocab_size: int
    features: int

    @nn.compact
    def __call__(self, ids):
        table = self.param("table", nn.initializers.normal(0.02), (self.vocab_size, self.features))
        return jnp.take(table, ids, axis=0)


class TextClassifier(nn.Module):
    vocab_size: int = 4000
    embedding_size: int = 64
    hidden_size: int = 128
    num_classes: int = 2

    @nn.compact
    def __call__(self, ids):
        x = Lookup(self.vocab_size, self.embedding_size, name="lookup")(ids)
        x = nn.relu(nn.Dense(self.hidden_size, name="encoder_in")(x))
        x = nn.relu(nn.Dense(self.hidden_size, name="encoder_out")(x))
        # a learned table of 300 x 77 features (nothing else is 300 or 77 wide): no rule of thumb names it
        extra = self.param("features", nn.initializers.zeros, (300, 77))
        pooled = x.mean(axis=1) + extra.sum() * 0.0
        return nn.Dense(self.num_classes, name="head")(pooled)
