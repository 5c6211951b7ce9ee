"""A quantized frozen base in the reference decoder (QLoRA): kernels stored as codes + scales, dequantized per layer.

With ``lora.base_dtype`` (``int8`` / ``nf4``) every projection kernel of the
attention and MLP blocks (``q``, ``k``, ``v``, ``o``, ``q_gate``, ``wi``,
``wi_0``, ``wi_1``, ``wo``: the weights LoRA targets and the other large
matmuls of a block) is stored as two frozen parameters with the kernel's own
logical names (:mod:`partitioning.finetune.quantize`):

- ``<name>``: the codes (int8, or two NF4 codes a uint8 along the last axis);
- ``<name>_qscale``: float32 absmax per block of ``base_block`` values along the last axis.

The token embedding, the output head (``unembed``), norms, biases and the
mixture-of-experts weights keep the param dtype: bitsandbytes' QLoRA leaves
the head and embeddings unquantized too, and they are a few percent of a large
model. Each layer dequantizes its kernels where it uses them (inside the
``nn.scan`` body with ``scan_layers``), after the FSDP all-gather of the codes,
so one layer's float weights are live at a time and the gather moves the
quantized bytes. The adapters train on top; the codes get no gradient.

Example::

    >>> from partitioning.models import GPT
    >>> lora = {"rank": 4, "targets": ["attn/q$"], "base_dtype": "nf4", "base_block": 16}
    >>> model = GPT(embed=64, heads=4, mlp=128, layers=2, lora=lora)
    >>> params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((2, 8), jnp.int32))["params"]
    >>> q, s = params["blocks"]["attn"]["q"], params["blocks"]["attn"]["q_qscale"]
    >>> q.names, q.value.shape, q.value.dtype, s.value.shape, s.value.dtype
    (('layers', 'embed', 'heads', 'kv'), (2, 64, 4, 8), dtype('uint8'), (2, 64, 4, 1), dtype('float32'))
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import param_for_compute, with_logical_partitioning
from partitioning.finetune.lora import LoRA
from partitioning.finetune.quantize import SCALE_SUFFIX, check_blocks, dequantize, quantize, stored_shapes


def base_quantization(mod: nn.Module) -> LoRA | None:
    """The module's ``lora`` when it asks for a quantized base (``base_dtype`` set), else None."""
    lora = LoRA.parse(getattr(mod, "lora", None))
    return lora if lora is not None and lora.base_dtype is not None else None


def quantized_kernel(
    mod: nn.Module, name: str, names: tuple, shape: tuple, dtype: Any, fan_in: int, lora: LoRA
) -> jax.Array:
    """The kernel ``name`` (float, ``dtype``) read from its codes and scales; created N(0, 1/fan_in) at init.

    Codes and scale are initialised from the same draw, so a fresh model's kernel is
    ``dequantize(quantize(W))`` of the unquantized model's ``W`` distribution.
    """
    kind, block = lora.base_dtype, lora.base_block
    assert kind is not None
    if mod.is_initializing():
        assert mod.scope is not None
        check_blocks("/".join((*mod.scope.path, name)), shape, names, block)
        key = mod.make_rng("params")
    else:  # Flax traces the init again at apply to check shapes: any key will do
        key = jax.random.key(0)

    def part(i: int):
        def init(_key, *_):
            w = jax.random.normal(key, shape, jnp.float32) * fan_in**-0.5
            return quantize(w, kind, block)[i]

        return with_logical_partitioning(init, names)

    codes_shape, codes_dtype, scale_shape = stored_shapes(shape, kind, block)
    codes = param_for_compute(mod.param(name, part(0), codes_shape, codes_dtype), names)
    scale = param_for_compute(mod.param(name + SCALE_SUFFIX, part(1), scale_shape, jnp.float32), names)
    # The dequantized kernel is a function of frozen leaves only: no gradient flows to the base.
    return jax.lax.stop_gradient(dequantize(codes, scale, kind, block, dtype))


__all__ = ["base_quantization", "quantized_kernel"]
