"""The Hugging Face name maps, as data: one table per family, HF tensor name -> parameter path + file axes.

A row is ``Tensor(hf, param, axes, part=None, when=None)``:

- ``hf``: the tensor's name in the safetensors files; ``{i}`` is the layer number.
- ``param``: the parameter path in the model's ``params`` tree; ``{layer}`` is the layer stack
  (``blocks``, every parameter with a leading ``layers`` axis, when ``scan_layers``; else ``block_{i}``).
- ``axes``: the file tensor's dimensions in the parameter's *logical* axis names, einops style:
  ``"(heads kv) embed"`` is a ``(heads * kv, embed)`` tensor whose first dimension is the
  row-major pair. The engine takes the parameter's own names and order from the model, so
  the same row serves a model storing ``q`` as ``(embed, heads, kv)`` (a transpose on load) or
  as ``(heads, kv, embed)`` (a reshape). An integer in a group is a dimension only the file
  has, of which the row is part ``part`` (GPT-2's fused ``c_attn`` holds q, k and v as parts
  0, 1, 2 of ``(3 heads kv)``). Sizes come from the parameter's shape.
- ``when``: the GPT option that must be true for the tensor to exist (``"!opt"``: false).

Example::

    >>> from partitioning.models.hf.tables import LLAMA
    >>> LLAMA[2][:3]
    ('model.layers.{i}.self_attn.q_proj.weight', '{layer}/attn/q', '(heads kv) embed')
"""

from __future__ import annotations

from typing import NamedTuple


class Tensor(NamedTuple):
    """One row of a name map (see the module docstring)."""

    hf: str
    param: str
    axes: str
    part: int | None = None
    when: str | None = None


_L = "model.layers.{i}."

# Llama, Mistral, Qwen2 and Gemma share one layout (torch's Linear stores weights (out, in)).
LLAMA = (
    Tensor("model.embed_tokens.weight", "embedding", "vocab embed"),
    Tensor(_L + "input_layernorm.weight", "{layer}/attn_norm/scale", "embed"),
    Tensor(_L + "self_attn.q_proj.weight", "{layer}/attn/q", "(heads kv) embed"),
    Tensor(_L + "self_attn.q_proj.bias", "{layer}/attn/q_bias", "(heads kv)", when="qkv_bias"),
    Tensor(_L + "self_attn.k_proj.weight", "{layer}/attn/k", "(kv_heads kv) embed"),
    Tensor(_L + "self_attn.k_proj.bias", "{layer}/attn/k_bias", "(kv_heads kv)", when="qkv_bias"),
    Tensor(_L + "self_attn.v_proj.weight", "{layer}/attn/v", "(kv_heads kv) embed"),
    Tensor(_L + "self_attn.v_proj.bias", "{layer}/attn/v_bias", "(kv_heads kv)", when="qkv_bias"),
    Tensor(_L + "self_attn.o_proj.weight", "{layer}/attn/o", "embed (heads kv)"),
    Tensor(_L + "self_attn.o_proj.bias", "{layer}/attn/o_bias", "embed", when="out_bias"),
    Tensor(_L + "post_attention_layernorm.weight", "{layer}/mlp_norm/scale", "embed"),
    Tensor(_L + "mlp.gate_proj.weight", "{layer}/mlp/wi_0", "mlp embed"),
    Tensor(_L + "mlp.gate_proj.bias", "{layer}/mlp/wi_0_bias", "mlp", when="mlp_bias"),
    Tensor(_L + "mlp.up_proj.weight", "{layer}/mlp/wi_1", "mlp embed"),
    Tensor(_L + "mlp.up_proj.bias", "{layer}/mlp/wi_1_bias", "mlp", when="mlp_bias"),
    Tensor(_L + "mlp.down_proj.weight", "{layer}/mlp/wo", "embed mlp"),
    Tensor(_L + "mlp.down_proj.bias", "{layer}/mlp/wo_bias", "embed", when="mlp_bias"),
    Tensor("model.norm.weight", "final_norm/scale", "embed"),
    Tensor("lm_head.weight", "unembed", "vocab embed", when="!tie_embeddings"),
)

_H = "transformer.h.{i}."

# GPT-2's Conv1D stores weights (in, out), and q, k and v fused in c_attn.
GPT2 = (
    Tensor("transformer.wte.weight", "embedding", "vocab embed"),
    Tensor("transformer.wpe.weight", "pos_embedding", "positions embed"),
    Tensor(_H + "ln_1.weight", "{layer}/attn_norm/scale", "embed"),
    Tensor(_H + "ln_1.bias", "{layer}/attn_norm/bias", "embed"),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/q", "embed (3 heads kv)", part=0),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/k", "embed (3 kv_heads kv)", part=1),
    Tensor(_H + "attn.c_attn.weight", "{layer}/attn/v", "embed (3 kv_heads kv)", part=2),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/q_bias", "(3 heads kv)", part=0),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/k_bias", "(3 kv_heads kv)", part=1),
    Tensor(_H + "attn.c_attn.bias", "{layer}/attn/v_bias", "(3 kv_heads kv)", part=2),
    Tensor(_H + "attn.c_proj.weight", "{layer}/attn/o", "(heads kv) embed"),
    Tensor(_H + "attn.c_proj.bias", "{layer}/attn/o_bias", "embed"),
    Tensor(_H + "ln_2.weight", "{layer}/mlp_norm/scale", "embed"),
    Tensor(_H + "ln_2.bias", "{layer}/mlp_norm/bias", "embed"),
    Tensor(_H + "mlp.c_fc.weight", "{layer}/mlp/wi", "embed mlp"),
    Tensor(_H + "mlp.c_fc.bias", "{layer}/mlp/wi_bias", "mlp"),
    Tensor(_H + "mlp.c_proj.weight", "{layer}/mlp/wo", "mlp embed"),
    Tensor(_H + "mlp.c_proj.bias", "{layer}/mlp/wo_bias", "embed"),
    Tensor("transformer.ln_f.weight", "final_norm/scale", "embed"),
    Tensor("transformer.ln_f.bias", "final_norm/bias", "embed"),
    Tensor("lm_head.weight", "unembed", "vocab embed", when="!tie_embeddings"),
)

# Tensors a checkpoint may hold that are not weights of the model: skipped on load, never written.
LLAMA_EXTRA = (r"(^|\.)rotary_emb\.inv_freq$",)
GPT2_EXTRA = (r"(^|\.)attn\.(bias|masked_bias)$",)

__all__ = ["Tensor", "LLAMA", "GPT2", "LLAMA_EXTRA", "GPT2_EXTRA"]
