"""A frozen base stored quantized (QLoRA): int8 and NF4 codes with block-wise absmax scales.

``model.lora.base_dtype: int8 | nf4`` stores each projection kernel of the
base as codes plus one float32 scale per block of ``base_block`` (64) values
along the kernel's **last stored axis**; the layers dequantize it in their
forward pass (:mod:`partitioning.models.quantized`), so only the layer being
computed holds float weights.

- ``int8``: ``q = round(127 w / absmax)``, ``w ~ q * absmax / 127`` (1 byte a value, + 4 / block bytes).
- ``nf4``: QLoRA's NormalFloat4 (Dettmers et al. 2023; bitsandbytes' table :data:`NF4`): each value
  ``w / absmax`` rounded to the nearest of 16 levels, two 4-bit codes a byte (the even index in the low
  nibble, the odd one in the high nibble) along the last axis: 0.5 byte a value, + 4 / block bytes.

Codes and scales keep the kernel's rank and logical names: the last axis of
the codes has ``n`` (int8) or ``n / 2`` (nf4) entries and that of the scale
``n / block``, so a rule that splits the kernel's last axis ``k`` ways splits
codes and scales at the same block boundaries (when ``n / block`` divides by
``k``) and every device dequantizes its own shard alone.

Why not Qwix: its quantized arrays' scales carry no logical names (nothing a
rule table could lay out), it quantizes by intercepting ``dot_general`` at
trace time (the reference models read their weights through the rule context
and a pipelined stack applies its block outside the model's scope), it has no
NF4 code book, and it is not installed here.

Example::

    >>> from partitioning.finetune.quantize import quantize, dequantize
    >>> w = jnp.array([[0.5, -1.0, 0.25, 0.0]])
    >>> codes, scale = quantize(w, "nf4", 4)
    >>> codes.dtype, codes.shape, scale.tolist()
    (dtype('uint8'), (1, 2), [[1.0]])
    >>> np.asarray(dequantize(codes, scale, "nf4", 4), np.float64).round(4).tolist()   # the nearest levels
    [[0.4407, -1.0, 0.2461, 0.0]]
    >>> codes, scale = quantize(w, "int8", 4)
    >>> codes.tolist(), np.asarray(dequantize(codes, scale, "int8", 4), np.float64).round(4).tolist()
    ([[64, -127, 32, 0]], [[0.5039, -1.0, 0.252, 0.0]])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from partitioning.errors import ConfigError

BASE_DTYPES = ("int8", "nf4")
DEFAULT_BLOCK = 64
# The scale of a quantized kernel sits beside it: <name>_qscale.
SCALE_SUFFIX = "_qscale"
# bitsandbytes' NormalFloat4 levels (csrc/kernels.cu): the quantiles of N(0, 1) scaled to [-1, 1], 0 exact.
NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)
_NF4_MIDPOINTS = (NF4[1:] + NF4[:-1]) / 2


def stored_shapes(shape: tuple[int, ...], kind: str, block: int) -> tuple[tuple[int, ...], Any, tuple[int, ...]]:
    """``(codes shape, codes dtype, scale shape)`` of a kernel of ``shape`` stored as ``kind``.

    Example::

        >>> from partitioning.finetune.quantize import stored_shapes
        >>> stored_shapes((80, 8192, 28672), "nf4", 64)
        ((80, 8192, 14336), dtype('uint8'), (80, 8192, 448))
    """
    *lead, n = shape
    codes = (*lead, n // 2 if kind == "nf4" else n)
    return codes, np.dtype(np.uint8 if kind == "nf4" else np.int8), (*lead, n // block)


def check_blocks(path: str, shape: tuple[int, ...], names: tuple, block: int) -> None:
    """A ConfigError (``arg="lora.base_block"``) when the kernel's last axis does not divide into blocks.

    Example::

        >>> from partitioning.finetune.quantize import check_blocks
        >>> check_blocks("blocks/attn/o", (2, 32, 4, 8), ("layers", "embed", "heads", "kv"), 64)
        Traceback (most recent call last):
        partitioning.errors.ConfigError: lora.base_block: blocks/attn/o's last axis (kv) has 8 values, \
not a multiple of the block 64: set model.lora.base_block to an even divisor of it (e.g. 8)
    """
    n = shape[-1]
    if n % block:
        name = names[-1] if len(names) == len(shape) else None
        even = [b for b in range(2, n + 1, 2) if n % b == 0 and b <= block]
        hint = f" (e.g. {even[-1]})" if even else ""
        raise ConfigError(
            f"lora.base_block: {path}'s last axis ({name}) has {n} values, not a multiple of the block {block}: "
            f"set model.lora.base_block to an even divisor of it{hint}",
            arg="lora.base_block",
        )


def _blocks(w: jax.Array, block: int) -> jax.Array:
    *lead, n = w.shape
    return w.reshape(*lead, n // block, block)


def quantize(w: jax.Array, kind: str, block: int = DEFAULT_BLOCK) -> tuple[jax.Array, jax.Array]:
    """``(codes, scale)`` of ``w`` blocked along its last axis (:func:`stored_shapes`); absmax per block.

    An all-zero block gets scale 0 (``nf4``: absmax; ``int8``: absmax / 127) and codes of zero.
    """
    blocks = _blocks(jnp.asarray(w, jnp.float32), block)
    absmax = jnp.max(jnp.abs(blocks), axis=-1)
    safe = jnp.where(absmax > 0, absmax, 1.0)[..., None]
    if kind == "int8":
        q = jnp.clip(jnp.round(blocks / safe * 127.0), -127, 127).astype(jnp.int8)
        return q.reshape(w.shape), absmax / 127.0
    x = blocks / safe
    # The nearest level: how many midpoints lie below. Elementwise against scalars (no gather, no sort), so it
    # keeps any sharding, Explicit axes included.
    idx = sum(((x > float(m)).astype(jnp.uint8) for m in _NF4_MIDPOINTS), jnp.zeros(x.shape, jnp.uint8))
    idx = idx.reshape(w.shape)
    return idx[..., 0::2] | (idx[..., 1::2] << 4), absmax


def dequantize(
    codes: jax.Array, scale: jax.Array, kind: str, block: int = DEFAULT_BLOCK, dtype: Any = None
) -> jax.Array:
    """The kernel ``codes * scale`` (int8) or ``NF4[codes] * scale`` (nf4) stand for, in ``dtype`` (float32)."""
    *lead, n = codes.shape
    if kind == "int8":
        values = _blocks(codes, block).astype(jnp.float32)
    else:
        n *= 2
        packed = codes.reshape(*lead, n // block, block // 2)
        values = _levels(jnp.stack([packed & 15, packed >> 4], axis=-1)).reshape(*lead, n // block, block)
    w = (values * scale[..., None].astype(jnp.float32)).reshape(*lead, n)
    return w.astype(dtype or jnp.float32)


def _levels(idx: jax.Array) -> jax.Array:
    """``NF4[idx]`` as a tree of selects on the four bits: a gather would need its output layout named on
    Explicit axes; 15 elementwise selects keep the codes' sharding."""
    values: list[Any] = [float(v) for v in NF4]
    for bit in range(4):
        on = ((idx >> bit) & 1).astype(bool)
        values = [jnp.where(on, values[2 * i + 1], values[2 * i]) for i in range(len(values) // 2)]
    return jnp.asarray(values[0], jnp.float32)


def stored_bytes(params: int, kind: str | None, block: int = DEFAULT_BLOCK, dtype_bytes: int = 2) -> float:
    """Bytes a frozen kernel of ``params`` values takes: ``dtype_bytes`` each unquantized, else codes + scales.

    Example::

        >>> from partitioning.finetune.quantize import stored_bytes
        >>> stored_bytes(64, "nf4"), stored_bytes(64, "int8"), stored_bytes(64, None)
        (36.0, 68.0, 128.0)
    """
    if kind is None:
        return float(params * dtype_bytes)
    return params * (0.5 if kind == "nf4" else 1.0) + params / block * 4


def weight_counts(leaves: Iterable[Any]) -> dict[str, int]:
    """``{leaf.path: the weights it stores}`` for leaves with ``path``, ``size``, ``dtype`` (a plan's LeafLayouts).

    NF4 codes hold two weights an element, a scale none: the parameter counts (and FLOPs) of a quantized
    model are its float twin's.

    Example::

        >>> from types import SimpleNamespace as L
        >>> from partitioning.finetune.quantize import weight_counts
        >>> weight_counts([L(path="q", size=8, dtype=np.uint8), L(path="q_qscale", size=1, dtype=np.float32),
        ...                L(path="norm", size=4, dtype=np.float32)])
        {'q': 16, 'q_qscale': 0, 'norm': 4}
    """
    leaves = list(leaves)
    paths = {leaf.path for leaf in leaves}
    out = {}
    for leaf in leaves:
        if leaf.path.endswith(SCALE_SUFFIX) and leaf.path[: -len(SCALE_SUFFIX)] in paths:
            out[leaf.path] = 0
        elif leaf.path + SCALE_SUFFIX in paths and np.dtype(leaf.dtype) == np.uint8:
            out[leaf.path] = 2 * leaf.size
        else:
            out[leaf.path] = leaf.size
    return out


def quantized_paths(flat: dict[tuple[str, ...], Any]) -> list[tuple[str, ...]]:
    """The paths of a flat params dict that hold codes: those with a ``<name>_qscale`` beside them."""
    return [k for k in flat if k[:-1] + (k[-1] + SCALE_SUFFIX,) in flat]


__all__ = [
    "BASE_DTYPES",
    "DEFAULT_BLOCK",
    "SCALE_SUFFIX",
    "NF4",
    "stored_shapes",
    "check_blocks",
    "quantize",
    "dequantize",
    "stored_bytes",
    "weight_counts",
    "quantized_paths",
]
