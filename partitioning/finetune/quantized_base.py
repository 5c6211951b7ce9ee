"""A model's quantized base as a whole: the float twin of a QLoRA model, and its params dequantized (for export).

The per-array math is :mod:`partitioning.finetune.quantize`; the layers that store and dequantize kernels are
:mod:`partitioning.models.quantized`. ``save_hf(..., merge=True)`` and :func:`~partitioning.finetune.merge_lora`
dequantize first, so a merged export is plain float weights; ``load_hf`` reads a checkpoint as the float twin's
and quantizes each weight as it is read.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from flax import traverse_util

from partitioning.boxes import unbox
from partitioning.finetune.lora import LoRA
from partitioning.finetune.quantize import SCALE_SUFFIX, dequantize, quantized_paths
from partitioning.model.interface import abstract_params


def without_base_dtype(model: Any) -> Any:
    """``model`` with its ``lora.base_dtype`` unset (its base in the param dtype); ``model`` itself otherwise."""
    lora = LoRA.parse(getattr(model, "lora", None))
    if lora is None or lora.base_dtype is None:
        return model
    return model.clone(lora=dataclasses.replace(lora, base_dtype=None))


def dequantize_base(model: Any, variables: Any) -> tuple[Any, dict[str, Any]]:
    """``(the model with a float base, {"params": ...})``: each quantized kernel dequantized, its scale dropped.

    The kernels come back in the dtype of the unquantized model's params (its ``param_dtype``), each
    on its codes' sharding; a model without a quantized base is returned as it is.

    Example::

        >>> from partitioning.finetune.quantized_base import dequantize_base
        >>> from partitioning.models import GPT
        >>> lora = {"rank": 2, "targets": ["attn/q$"], "base_dtype": "int8", "base_block": 16}
        >>> model = GPT(embed=32, heads=2, mlp=64, layers=1, vocab_size=64, lora=lora)
        >>> variables = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
        >>> plain, out = dequantize_base(model, variables)
        >>> attn = out["params"]["blocks"]["attn"]
        >>> plain.lora.base_dtype, attn["q"].dtype, "q_qscale" in attn
        (None, dtype('float32'), False)
    """
    plain = without_base_dtype(model)
    lora = LoRA.parse(getattr(model, "lora", None))
    params = variables.get("params", variables) if hasattr(variables, "get") else variables
    if plain is model or lora is None or lora.base_dtype is None:
        return model, {"params": params}
    kind = lora.base_dtype
    flat = traverse_util.flatten_dict(unbox(params))
    want = traverse_util.flatten_dict(unbox(abstract_params(plain)))
    out = {k: v for k, v in flat.items() if not k[-1].endswith(SCALE_SUFFIX)}
    for k in quantized_paths(flat):
        codes, scale = flat[k], flat[k[:-1] + (k[-1] + SCALE_SUFFIX,)]
        sharding = codes.sharding if isinstance(codes, jax.Array) else None
        fn = functools.partial(dequantize, kind=kind, block=lora.base_block, dtype=want[k].dtype)
        out[k] = jax.jit(fn, out_shardings=sharding)(codes, scale)
    return plain, {"params": traverse_util.unflatten_dict(out)}


__all__ = ["without_base_dtype", "dequantize_base"]
