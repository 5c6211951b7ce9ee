"""A language model as two plain functions over a dict of arrays (no Flax): ``init(rng)`` and ``apply``.

``lm(...)`` returns the pair as a :class:`partitioning.FunctionModel`, so a
config names it with ``_target_: pytree_lm.lm``.
"""

import jax
import jax.numpy as jnp

import partitioning as pt


def init(rng, vocab=256, width=64, hidden=128, layers=2):
    keys = iter(jax.random.split(rng, 3 + 2 * layers))

    def normal(shape):
        return jax.random.normal(next(keys), shape) * shape[0] ** -0.5

    return {
        "wte": normal((vocab, width)),
        "layers": [
            {"w_in": normal((width, hidden)), "b_in": jnp.zeros((hidden,)), "w_out": normal((hidden, width))}
            for _ in range(layers)
        ],
        "ln_f": jnp.ones((width,)),
        "lm_head": normal((width, vocab)),
    }


def apply(params, tokens):
    x = params["wte"][tokens]
    for layer in params["layers"]:
        x = x + jax.nn.gelu(x @ layer["w_in"] + layer["b_in"]) @ layer["w_out"]
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * params["ln_f"]
    return x @ params["lm_head"]


def lm(vocab: int = 256, width: int = 64, hidden: int = 128, layers: int = 2):
    return pt.FunctionModel(lambda rng: init(rng, vocab, width, hidden, layers), apply)
