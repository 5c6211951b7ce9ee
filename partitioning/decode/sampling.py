"""Next-token sampling as ``transformers`` defines it: temperature, then top-k, then top-p, then a draw.

:class:`Sampling` is hashable so a decoder's jitted step takes it as a static
argument (one compile per setting); the random key is an argument, and each
row draws with its own key folded from it, so the same seed gives the same
tokens whatever the mesh and batch padding. Temperature 0 is greedy decoding
(``argmax``), exactly.

Example::

    >>> from partitioning.decode.sampling import Sampling, filter_logits
    >>> logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    >>> np.isfinite(filter_logits(logits, Sampling(temperature=1.0, top_p=0.8))).tolist()   # 0.5 + 0.3 >= 0.8
    [[True, True, False, False]]
    >>> np.isfinite(filter_logits(logits, Sampling(temperature=1.0, top_k=3))).tolist()
    [[True, True, True, False]]
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from partitioning.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: ``temperature`` 0 (greedy) or > 0; ``top_k`` 0 (off) or the k most
    likely tokens; ``top_p`` in (0, 1], the smallest set of most likely tokens whose probability reaches it.

    Example::

        >>> from partitioning.decode.sampling import Sampling
        >>> Sampling(temperature=0.7, top_p=0.9).greedy, Sampling().greedy
        (False, True)
        >>> Sampling(top_p=1.5)
        Traceback (most recent call last):
        partitioning.errors.ConfigError: top_p must be in (0, 1], got 1.5
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature must be >= 0 (0: greedy), got {self.temperature}", arg="temperature")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: off), got {self.top_k}", arg="top_k")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}", arg="top_p")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        return "sampled (" + ", ".join(parts) + ")"


def filter_logits(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """``logits`` (..., vocab) as transformers' Temperature, TopK and TopP warpers leave them (removed: -inf)."""
    scores = logits.astype(jnp.float32)
    if not sampling.greedy:
        scores = scores / sampling.temperature
    if sampling.top_k:
        k = min(sampling.top_k, scores.shape[-1])
        kth = jax.lax.top_k(scores, k)[0][..., -1:]
        scores = jnp.where(scores < kth, -jnp.inf, scores)  # ties with the k-th stay, as in transformers
    if sampling.top_p < 1:
        order = jnp.argsort(scores, axis=-1)  # ascending, as transformers sorts
        ascending = jnp.take_along_axis(scores, order, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        remove = (cumulative <= 1 - sampling.top_p).at[..., -1].set(False)  # the most likely token always stays
        remove = jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1)
        scores = jnp.where(remove, -jnp.inf, scores)
    return scores


def choose(logits: jax.Array, sampling: Sampling, key: jax.Array) -> jax.Array:
    """The next token of each row of ``logits`` (rows, vocab): argmax when greedy, else a draw (int32).

    Row ``r`` draws with ``fold_in(key, r)``: its token depends on the key, its row and its logits only,
    not on how many rows the batch has (the batch is padded to the mesh's batch shards)."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(logits.shape[0]))
    draw = jax.vmap(lambda k, row: jax.random.categorical(k, row))
    return draw(keys, filter_logits(logits, sampling)).astype(jnp.int32)


__all__ = ["Sampling", "filter_logits", "choose"]
