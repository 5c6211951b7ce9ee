"""LoRA merged into the weights it adapts: ``W + scale * B A``, one function for every adapter layout.

Both paths use it: :class:`~partitioning.finetune.lora_model.LoRAModel` merges at every apply (the weight
path), and :func:`merge_lora` folds a reference model's adapters into its weights for good (PEFT's
``merge_and_unload``; ``save_hf(..., merge=True)`` writes the result as a plain checkpoint).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from partitioning.boxes import unbox
from partitioning.errors import CheckpointError, ConfigError
from partitioning.finetune.lora import A_SUFFIX, B_SUFFIX, RANK_AXIS, LoRA
from partitioning.finetune.quantized_base import dequantize_base
from partitioning.model.interface import abstract_params as _abstract
from partitioning.model.interface import param_names as _names


def lora_delta(a: jax.Array, b: jax.Array, *, stacked: int = 0, out_in: bool = False) -> jax.Array:
    """``B A`` in the adapted weight's layout, accumulated in float32.

    ``a`` is ``(*stack, *in, lora)`` and ``b`` ``(*stack, lora, *out)``: the delta is ``(*stack, *in, *out)``;
    with ``out_in`` (the weight is stored ``(out, in)``, as torch does) ``a`` is ``(*stack, lora, *in)``, ``b``
    ``(*stack, *out, lora)`` and the delta ``(*stack, *out, *in)``. ``stacked`` counts the leading dimensions
    both share (scanned layers).

    Example::

        >>> from partitioning.finetune.merge import lora_delta
        >>> a, b = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))     # 2 layers, in 3, rank 4, out 5
        >>> lora_delta(a, b, stacked=1).shape, float(lora_delta(a, b, stacked=1)[0, 0, 0])
        ((2, 3, 5), 4.0)
    """

    def one(a: jax.Array, b: jax.Array) -> jax.Array:
        f32 = jnp.float32
        if out_in:
            return jnp.tensordot(b, a, axes=([-1], [0]), preferred_element_type=f32)
        return jnp.tensordot(a, b, axes=([-1], [0]), preferred_element_type=f32)

    for _ in range(stacked):
        one = jax.vmap(one)
    return one(a, b)


def merge_lora(model: Any, variables: Any) -> tuple[Any, dict[str, Any]]:
    """``(the model without lora, {"params": ...})`` with each adapted weight ``W + scale * B A``, adapters dropped.

    The merged weights keep ``W``'s dtype and sharding; the logits equal the LoRA model's up to
    float rounding (PEFT's ``merge_and_unload``).

    Example::

        >>> model, variables = pt.hf.load_hf("tests/fixtures/hf/llama", adapter="tests/fixtures/peft/llama_rslora")
        >>> merged_model, merged = pt.finetune.merge_lora(model, variables)
        >>> p = variables["params"]["blocks"]["attn"]   # q: (layers, heads, kv, embed), out_in like torch
        >>> want = p["q"] + model.lora.scale * jnp.einsum("lhkr,lre->lhke", p["q_lora_b"], p["q_lora_a"])
        >>> merged_model.lora, bool(jnp.allclose(merged["params"]["blocks"]["attn"]["q"], want, atol=1e-6))
        (None, True)
    """
    lora = LoRA.parse(getattr(model, "lora", None))
    if lora is None:
        raise ConfigError(f"{type(model).__name__} has no LoRA adapters (lora is not set): nothing to merge")
    # A quantized base (QLoRA) merges as dequantize(codes, scales) + scale * B A, in the param dtype.
    model, variables = dequantize_base(model, variables)
    params = variables["params"]
    flat = traverse_util.flatten_dict(unbox(params))
    names = _names(_abstract(model))
    out = {k: v for k, v in flat.items() if not k[-1].endswith((A_SUFFIX, B_SUFFIX))}
    scale = float(lora.scale)
    # weight path -> (its A's path, its B's path, A's logical names)
    sites = {
        p[:-1] + (p[-1][: -len(A_SUFFIX)],): (p, p[:-1] + (p[-1][: -len(A_SUFFIX)] + B_SUFFIX,), tuple(names[p]))
        for p in flat
        if p[-1].endswith(A_SUFFIX)
    }
    keys = sorted(sites)

    def merged(ws: list, abs_: list) -> list:
        res = []
        for key, w, (a, b) in zip(keys, ws, abs_, strict=True):
            a_names = sites[key][2]
            stacked = int(a_names[0] == "layers")
            d = lora_delta(
                a.astype(jnp.float32), b.astype(jnp.float32), stacked=stacked, out_in=a_names[stacked] == RANK_AXIS
            )
            res.append((w.astype(jnp.float32) + scale * d).astype(w.dtype))
        return res

    ws = [flat[k] for k in keys]
    abs_ = [(flat[sites[k][0]], flat[sites[k][1]]) for k in keys]
    for key, w, got in zip(keys, ws, jax.eval_shape(merged, ws, abs_), strict=True):
        if got.shape != w.shape:
            raise CheckpointError(f"{'/'.join(key)}: B A has shape {list(got.shape)}; the weight has {list(w.shape)}")
    shardings = [w.sharding if isinstance(w, jax.Array) else None for w in ws]
    # One compile for every adapted weight, each merged on its own shards.
    out.update(zip(keys, jax.jit(merged, out_shardings=shardings)(ws, abs_), strict=True))
    return model.clone(lora=None), {"params": traverse_util.unflatten_dict(out)}


__all__ = ["lora_delta", "merge_lora"]
