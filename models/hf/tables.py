"""The Hugging Face name maps, as data: one table per family, HF tensor name -> parameter path + pattern.

A row is ``Tensor(hf, param, pattern, part=None, when=None)``:

- ``hf``: the tensor's name in the safetensors files; ``{i}`` is the layer number.
- ``param``: the parameter path in the model's ``params`` tree; ``{layer}`` is the layer stack
  (``blocks``, every parameter with a leading ``layers`` axis, when ``scan_layers``; else ``block_{i}``).
- ``pattern``: ``"<file axes> -> <param axes>"`` in einops notation. Grouped axes ``(h k)`` are a
  file dimension that is several parameter dimensions (row-major); an integer in a group is a
  dimension only the file has, of which the row is part ``part`` (GPT-2's fused ``c_attn``
  stores q, k and v as parts 0, 1, 2 of ``(3 h k)``). Sizes come from the parameter's shape.
- ``when``: the GPT option that must be true for the tensor to exist (``"!opt"``: false).

Example::

    >>> LLAMA[2][:3]
    ('model.layers.{i}.self_attn.q_proj.weight', '{layer}/attn/q', '(h k) d -> d h k')
"""

from __future__ import annotations

from typing import NamedTuple


class Tensor(NamedTuple):
    """One row of a name map (see the module docstring)."""

    hf: str
    param: str
    pattern: str
    part: int | None = None
    when: str | None = None


_L = "model.layers.{i}."

# Llama, Mistral, Qwen2 and Gemma share one layout (torch Linear weights are (out, in)).
LLAMA = (
    Tensor("model.embed_tokens.weight", "embedding", "v d -> v d"),
    Tensor(_L + "input_layernorm.weight", "{layer}/attn_norm/scale", "d -> d"),
    Tensor(_L + "self_attn.q_proj.weight", "{layer}/attn/q", "(h k) d -> d h k"),
    Tensor(_L + "self_attn.q_proj.bias", "{layer}/attn/q_bias", "(h k) -> h k", when="qkv_bias"),
    Tensor(_L + "self_attn.k_proj.weight", "{layer}/attn/k", "(g k) d -> d g k"),
    Tensor(_L + "self_attn.k_proj.bias", "{layer}/attn/k_bias", "(g k) -> g k", when="qkv_bias"),
    Tensor(_L + "self_attn.v_proj.weight", "{layer}/attn/v", "(g k) d -> d g k"),
    Tensor(_L + "self_attn.v_proj.bias", "{layer}/attn/v_bias", "(g k) -> g k", when="qkv_bias"),
    Tensor(_L + "self_attn.o_proj.weight", "{layer}/attn/o", "d (h k) -> h k d"),
    Tensor(_L + "self_attn.o_proj.bias", "{layer}/attn/o_bias", "d -> d", when="out_bias"),
    Tensor(_L + "post_attention_layernorm.weight", "{layer}/mlp_norm/scale", "d -> d"),
    Tensor(_L + "mlp.gate_proj.weight", "{layer}/mlp/wi_0", "m d -> d m"),
    Tensor(_L + "mlp.gate_proj.bias", "{layer}/mlp/wi_0_bias", "m -> m", when="mlp_bias"),
    Tensor(_L + "mlp.up_proj.weight", "{layer}/mlp/wi_1", "m d -> d m"),
    Tensor(_L + "mlp.up_proj.bias", "{layer}/mlp/wi_1_bias", "m -> m", when="mlp_bias"),
    Tensor(_L + "mlp.down_proj.weight", "{layer}/mlp/wo", "d m -> m d"),
    Tensor(_L + "mlp.down_proj.bias", "{layer}/mlp/wo_bias", "d -> d", when="mlp_bias"),
    Tensor("model.norm.weight", "final_norm/scale", "d -> d"),
    Tensor("lm_head.weight", "unembed", "v d -> d v", when="!tie_embeddings"),
)

_H = "transformer.h.{i}."

# GPT-2's Conv1D stores weights (in, out): no transposes, but q, k and v are fused in c_attn.
GPT2 = (
    Tensor("transformer.wte.weight", "embedding", "v d -> v d"),
    Tensor("transformer.wpe.weight", "pos_embedding", "p d -> p d"),
    Tensor(_H + "ln_1.weight", "{layer}/attn_norm/scale", "d -> d"),
    Tensor(_H + "ln_1.bias", "{layer}/attn_norm/bias", "d -> d"),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/q", "d (3 h k) -> d h k", part=0),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/k", "d (3 h k) -> d h k", part=1),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/v", "d (3 h k) -> d h k", part=2),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/q_bias", "(3 h k) -> h k", part=0),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/k_bias", "(3 h k) -> h k", part=1),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/v_bias", "(3 h k) -> h k", part=2),
    Tensor(_H + "attn.c_proj.weight", "{layer}/attn/o", "(h k) d -> h k d"),
    Tensor(_H + "attn.c_proj.bias", "{layer}/attn/o_bias", "d -> d"),
    Tensor(_H + "ln_2.weight", "{layer}/mlp_norm/scale", "d -> d"),
    Tensor(_H + "ln_2.bias", "{layer}/mlp_norm/bias", "d -> d"),
    Tensor(_H + "mlp.c_fc.weight", "{layer}/mlp/wi", "d m -> d m"),
    Tensor(_H + "mlp.c_fc.bias", "{layer}/mlp/wi_bias", "m -> m"),
    Tensor(_H + "mlp.c_proj.weight", "{layer}/mlp/wo", "m d -> m d"),
    Tensor(_H + "mlp.c_proj.bias", "{layer}/mlp/wo_bias", "d -> d"),
    Tensor("transformer.ln_f.weight", "final_norm/scale", "d -> d"),
    Tensor("transformer.ln_f.bias", "final_norm/bias", "d -> d"),
    Tensor("lm_head.weight", "unembed", "v d -> d v", when="!tie_embeddings"),
)

# Tensors a checkpoint may hold that are not weights of the model: skipped on load, never written.
LLAMA_EXTRA = (r"(^|\.)rotary_emb\.inv_freq$",)
GPT2_EXTRA = (r"(^|\.)attn\.(bias|masked_bias)$",)

__all__ = ["Tensor", "LLAMA", "GPT2", "LLAMA_EXTRA", "GPT2_EXTRA"]
