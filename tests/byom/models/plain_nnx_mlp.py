"""An NNX language model built from plain ``nnx.Embed`` / ``nnx.Linear`` / ``nnx.LayerNorm``: no names given.

A token-mixing-free residual MLP stack (each position predicts the next
token from itself): the kind of model people write first in NNX.
"""

from flax import nnx


class Layer(nnx.Module):
    def __init__(self, width: int, hidden: int, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, width, rngs=rngs)

    def __call__(self, x):
        return x + self.down(nnx.gelu(self.up(self.norm(x))))


class MLPLM(nnx.Module):
    def __init__(self, vocab: int = 256, width: int = 64, hidden: int = 128, layers: int = 2, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.layers = nnx.List([Layer(width, hidden, rngs) for _ in range(layers)])
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
