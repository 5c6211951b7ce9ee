"""The RoPE scalings of the newer families: YaRN (OLMo-3, GPT-OSS, DeepSeek-V3), LongRoPE (Phi-4-mini) and
Gemma 4's proportional RoPE.

Both rescale the inverse frequencies and multiply ``cos`` and ``sin`` by an *attention factor*, as
``transformers``' ``_compute_yarn_parameters`` / ``_compute_longrope_parameters`` do:

- **yarn**: frequencies interpolated (divided by ``factor``) below a correction range of dimensions and
  extrapolated (kept) above it, with a linear ramp between (``beta_fast`` / ``beta_slow`` rotations at
  ``original_max_position_embeddings``); the factor ``0.1 ln(factor) + 1`` unless ``attention_factor``
  (or DeepSeek's ``mscale`` / ``mscale_all_dim``) says otherwise.
- **longrope**: each frequency divided by its ``short_factor`` entry while the sequence fits in
  ``original_max_position_embeddings``, by its ``long_factor`` entry beyond (the whole sequence
  switches, as transformers' dynamic update does); the factor ``sqrt(1 + ln(f) / ln(original))``
  with ``f = factor`` (else ``max_position_embeddings / original``).
- **proportional** (Gemma 4's global layers): the first ``partial_rotary_factor`` of the ``dim // 2``
  frequencies as plain RoPE's, the rest 0 (those feature pairs pass unrotated), all divided by ``factor``.

Example::

    >>> from partitioning.models.rope import attention_factor, scaled_frequencies
    >>> yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    >>> round(attention_factor(yarn), 4)                        # 0.1 ln 4 + 1
    1.1386
    >>> f = scaled_frequencies(8, 10000.0, yarn, 16)
    >>> [round(float(f[i]), 5) for i in (0, -1)]               # the fastest kept, the slowest interpolated
    [1.0, 0.00025]
    >>> half = scaled_frequencies(8, 10000.0, {"rope_type": "proportional", "partial_rotary_factor": 0.5})
    >>> [round(float(v), 4) for v in half]                      # 2 of the 4 frequencies, the others 0
    [1.0, 0.1, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

# rope_type -> (required keys, optional keys), besides rope_type.
SCALINGS = {
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    ),
    "longrope": (
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("factor", "attention_factor", "max_position_embeddings"),
    ),
    # Gemma 4's global layers: the first `partial_rotary_factor` of the frequencies, the rest 0 (unrotated).
    "proportional": ((), ("partial_rotary_factor", "factor")),
}


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def attention_factor(s: Mapping[str, Any]) -> float:
    """What ``cos`` and ``sin`` are multiplied by under the scaling ``s`` (1 for the plain kinds)."""
    kind = s.get("rope_type")
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    if kind == "yarn":
        factor = float(s["factor"])
        if s.get("mscale") and s.get("mscale_all_dim"):
            return _mscale(factor, float(s["mscale"])) / _mscale(factor, float(s["mscale_all_dim"]))
        return _mscale(factor)
    if kind == "longrope":
        original = float(s["original_max_position_embeddings"])
        factor = s.get("factor") or float(s.get("max_position_embeddings") or original) / original
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return 1.0


def scaled_frequencies(dim: int, theta: float, s: Mapping[str, Any], length: Any = None) -> jax.Array:
    """The ``dim // 2`` inverse frequencies of a ``yarn`` / ``longrope`` scaling ``s``.

    ``length``: the sequence length (a longrope sequence past ``original_max_position_embeddings`` takes the
    long factors; a traced length selects with ``where``).
    """
    half = dim // 2
    base = theta ** (jnp.arange(half, dtype=jnp.float32) * 2 / dim)
    if s["rope_type"] == "proportional":
        # transformers' `_compute_proportional_rope_parameters`: unlike partial rotary (which rotates the first
        # features as pairs of their own), every pair (i, i + dim / 2) keeps its full-width frequency, and the
        # pairs past `int(fraction * dim // 2)` get frequency 0.
        angles = int(float(s.get("partial_rotary_factor", 1.0)) * dim // 2)
        kept = jnp.arange(half) < angles
        return jnp.where(kept, 1.0 / base, 0.0) / float(s.get("factor", 1.0))
    if s["rope_type"] == "longrope":
        short = 1.0 / (jnp.asarray(s["short_factor"], jnp.float32) * base)
        long = 1.0 / (jnp.asarray(s["long_factor"], jnp.float32) * base)
        if length is None:
            return short
        return jnp.where(length > s["original_max_position_embeddings"], long, short)
    factor, original = float(s["factor"]), float(s["original_max_position_embeddings"])
    fast, slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def correction(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = jnp.clip((jnp.arange(half, dtype=jnp.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (the frequency as is), 0: interpolate (divided by factor)
    return (1.0 / (factor * base)) * (1 - keep) + (1.0 / base) * keep


__all__ = ["SCALINGS", "attention_factor", "scaled_frequencies"]
