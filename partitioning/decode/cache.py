"""The KV cache of decode mode: each attention layer's keys and values in a ``cache`` collection.

Flax's decode pattern: a model built with ``decode=True`` and initialised on
``(batch, max_len)`` tokens makes, in every attention layer, ``cached_key`` /
``cached_value`` of shape ``(batch, max_len, kv_heads, head_dim)`` (logical
names ``(batch, length, kv_heads, kv)``, so the rules lay them out like the
activations) and a ``cache_index``. Applied with ``mutable=["cache"]``, each
call writes its ``t`` new positions at ``cache_index`` and attends to every
cached position up to its own (and inside the sliding window). Scanned layers
stack the cache along ``layers`` like their params.

Example::

    >>> from partitioning.decode.cache import cache_positions, cached_kv
    >>> class Keys(nn.Module):            # what an attention layer's __call__ does with its keys
    ...     @nn.compact
    ...     def __call__(self, k):
    ...         positions = cache_positions(self, k.shape[1])            # None while initialising
    ...         keys, values, mask = cached_kv(self, k, k, positions, window=None)
    ...         return keys, mask
    >>> layer = Keys()
    >>> cache = pt.unbox(layer.init(jax.random.key(0), jnp.zeros((1, 4, 1, 2)))["cache"])   # max_len 4
    >>> jax.tree.map(jnp.shape, cache)
    {'cache_index': (), 'cached_key': (1, 4, 1, 2), 'cached_value': (1, 4, 1, 2)}
    >>> (keys, mask), upd = layer.apply({"cache": cache}, jnp.ones((1, 3, 1, 2)), mutable=["cache"])  # prefill 3
    >>> mask.astype(int).tolist(), int(upd["cache"]["cache_index"])
    ([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], 3)
    >>> (keys, mask), upd = layer.apply(upd, jnp.full((1, 1, 1, 2), 2.0), mutable=["cache"])  # one more token
    >>> keys[0, :, 0, 0].tolist(), mask.astype(int).tolist()
    ([1.0, 1.0, 1.0, 2.0], [[1, 1, 1, 1]])
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import with_logical_constraint, with_logical_partitioning

CACHE = "cache"
NAMES = ("batch", "length", "kv_heads", "kv")


def cache_positions(mod: nn.Module, t: int) -> jax.Array | None:
    """Absolute positions of a call's ``t`` tokens (``cache_index + arange(t)``); None before the cache exists."""
    if not mod.has_variable(CACHE, "cache_index"):
        return None
    return mod.get_variable(CACHE, "cache_index") + jnp.arange(t)


def cache_length(mod: nn.Module) -> int | None:
    """The positions a layer's cache holds (``max_len``); None before the cache exists."""
    if not mod.has_variable(CACHE, "cached_key"):
        return None
    return int(mod.get_variable(CACHE, "cached_key").shape[1])


def cached_kv(
    mod: nn.Module, k: jax.Array, v: jax.Array, positions: jax.Array | None, window: int | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(all cached keys, all cached values, the ``(t, max_len)`` mask) after writing ``k`` / ``v`` at ``positions``.

    While initialising (``positions`` None) the cache is created with ``k``'s
    shape and the call attends causally to its own keys only.
    """
    b, t, g, d = k.shape
    init = with_logical_partitioning(jnp.zeros, NAMES)
    # Boxed when created (for the layout), plain arrays once applied: Any for the type checker.
    keys: Any = mod.variable(CACHE, "cached_key", init, (b, t, g, d), k.dtype)
    values: Any = mod.variable(CACHE, "cached_value", init, (b, t, g, d), v.dtype)
    index: Any = mod.variable(CACHE, "cache_index", lambda: jnp.zeros((), jnp.int32))
    if positions is None:
        i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    else:
        start = index.value
        keys.value = with_logical_constraint(
            jax.lax.dynamic_update_slice(keys.value, k.astype(keys.value.dtype), (0, start, 0, 0)), NAMES
        )
        values.value = with_logical_constraint(
            jax.lax.dynamic_update_slice(values.value, v.astype(values.value.dtype), (0, start, 0, 0)), NAMES
        )
        index.value = start + t
        k, v = keys.value, values.value
        i, j = positions[:, None], jnp.arange(k.shape[1])[None, :]
    mask = j <= i
    return k, v, mask if window is None else mask & (j > i - window)


def position_offset(mod: nn.Module, t: int) -> jax.Array:
    """Where a decoding call's ``t`` tokens start (for learned position tables); advances by ``t``."""
    exists = mod.has_variable(CACHE, "position")
    index = mod.variable(CACHE, "position", lambda: jnp.zeros((), jnp.int32))
    start = index.value
    if exists:  # not while initialising: the first call after it starts at 0
        index.value = start + t
    return start


__all__ = ["cache_positions", "cache_length", "cached_kv", "position_offset", "CACHE", "NAMES"]
