"""``attention: xla | cudnn | auto``: the toolkit's einsum attention or ``jax.nn.dot_product_attention``'s cuDNN kernel.

``xla`` is :class:`~partitioning.models.attention.Attention`'s own einsums (every
option, every backend, named layouts for sequence parallelism). ``cudnn`` hands
the causal product to cuDNN's flash-attention kernel through
``jax.nn.dot_product_attention(implementation="cudnn")``: grouped-query heads and a
sliding window as the kernel takes them, the ``(length, length)`` scores never
stored. It needs an NVIDIA GPU and a 16-bit compute dtype. The KV-cache decode
step, packed rows (segment ids), mixed local/global layers (Gemma 2/3) and
soft-capped scores keep the einsums (:func:`fused_applies`). ``auto`` is
``cudnn`` on a GPU with a 16-bit compute dtype, else ``xla``.

Example::

    >>> from partitioning.models.fused_attention import resolve_attention
    >>> resolve_attention("auto", "bfloat16") if jax.default_backend() == "cpu" else "xla"
    'xla'
    >>> from partitioning.models import GPT
    >>> GPT(attention="cudnn", dtype="bfloat16") if jax.default_backend() == "cpu" else None
    Traceback (most recent call last):
    partitioning.errors.ConfigError: attention: cudnn needs an NVIDIA GPU (this process runs on cpu); use auto or xla
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from partitioning.errors import ConfigError

IMPLEMENTATIONS = ("xla", "cudnn", "auto")


def _half(dtype: Any) -> bool:
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def check_attention(value: str, dtype: Any) -> None:
    """ConfigError (``arg="attention"``) for an unknown implementation or ``cudnn`` where it cannot run."""
    if value not in IMPLEMENTATIONS:
        raise ConfigError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {value!r}", arg="attention")
    if value != "cudnn":
        return
    if jax.default_backend() != "gpu":
        raise ConfigError(
            f"attention: cudnn needs an NVIDIA GPU (this process runs on {jax.default_backend()}); use auto or xla",
            arg="attention",
        )
    if not _half(dtype):
        raise ConfigError(
            f"attention: cudnn needs a bfloat16 or float16 compute dtype, got {jnp.dtype(dtype)}", arg="attention"
        )


def resolve_attention(value: str, dtype: Any) -> str:
    """``auto`` -> ``cudnn`` on a GPU with a 16-bit compute dtype, else ``xla``; other values as they are."""
    if value != "auto":
        return value
    return "cudnn" if jax.default_backend() == "gpu" and _half(dtype) else "xla"


def fused_applies(decode: bool, segment_ids: Any, local: Any, softcap: float | None) -> bool:
    """cuDNN's kernel computes plain causal attention (a window included): not the KV-cache decode step,
    packed segments, mixed local/global layers or soft-capped scores, which keep the einsums."""
    return not decode and segment_ids is None and local is None and softcap is None


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, window: int | None) -> jax.Array:
    """Causal attention of ``q (batch, length, heads, dim)`` over ``k``/``v (batch, length, kv_heads, dim)``;
    query ``i`` sees keys ``i - window < j <= i`` with a window."""
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        scale=scale,
        is_causal=True,
        local_window_size=(window - 1, 0) if window else None,
        implementation="cudnn",
    )


__all__ = ["IMPLEMENTATIONS", "check_attention", "resolve_attention", "fused_applies", "cudnn_attention"]
