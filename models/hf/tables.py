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
- ``split``: for a fused tensor whose parts differ in size (Phi-3's ``qkv_proj`` with fewer kv heads than
  heads, ``[heads*d, kv*d, kv*d]``), the GPT options giving each part's size along the file's first
  dimension, in units of its first atom (``("heads", "kv_heads", "kv_heads")``); ``part`` picks one. The
  axes are then the part's own (``"(kv_heads kv) embed"``), with no integer.

Example::

    >>> from partitioning.models.hf.tables import LLAMA
    >>> LLAMA[2][:3]
    ('model.layers.{i}.self_attn.q_proj.weight', '{layer}/attn/q', '(heads kv) embed')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Tensor(NamedTuple):
    """One row of a name map (see the module docstring)."""

    hf: str
    param: str
    axes: str
    part: int | None = None
    when: str | None = None
    split: tuple[str, ...] | None = None

    def wanted(self, option: Callable[[str], Any], layer: int = 0) -> bool:
        """Whether the row's ``when`` holds for a model whose options ``option(name)`` gives; an option that is a
        function (``moe_layer``) is asked per layer."""
        if self.when is None:
            return True
        value = option(self.when.lstrip("!"))
        if callable(value):
            value = value(layer)
        return not value if self.when.startswith("!") else bool(value)


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


def _replace(rows: tuple[Tensor, ...], changes: dict[str, tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """``rows`` with each row whose ``hf`` name ends with a key of ``changes`` replaced by its rows (in place)."""
    out: list[Tensor] = []
    for r in rows:
        key = next((k for k in changes if r.hf.endswith(k)), None)
        out.extend(changes[key] if key is not None else (r,))
    return tuple(out)


# Qwen3: per-head q/k RMSNorm scales (kv,) after o_proj, as Qwen3Attention registers them.
QWEN3 = _replace(
    LLAMA,
    {
        "self_attn.o_proj.bias": (
            Tensor(_L + "self_attn.o_proj.bias", "{layer}/attn/o_bias", "embed", when="out_bias"),
            Tensor(_L + "self_attn.q_norm.weight", "{layer}/attn/q_norm/scale", "kv"),
            Tensor(_L + "self_attn.k_norm.weight", "{layer}/attn/k_norm/scale", "kv"),
        )
    },
)

_QK_NORMS = (
    Tensor(_L + "self_attn.q_norm.weight", "{layer}/attn/q_norm/scale", "kv", when="qk_norm"),
    Tensor(_L + "self_attn.k_norm.weight", "{layer}/attn/k_norm/scale", "kv", when="qk_norm"),
)

# Gemma 2 and 3: four norms a block (post_attention_layernorm is the attention's *post* norm here);
# Gemma 3 adds per-head q/k norms.
GEMMA2 = _replace(
    LLAMA,
    {
        "self_attn.o_proj.bias": (
            Tensor(_L + "self_attn.o_proj.bias", "{layer}/attn/o_bias", "embed", when="out_bias"),
            *_QK_NORMS,
        ),
        "post_attention_layernorm.weight": (
            Tensor(_L + "post_attention_layernorm.weight", "{layer}/attn_post_norm/scale", "embed"),
            Tensor(_L + "pre_feedforward_layernorm.weight", "{layer}/mlp_norm/scale", "embed"),
            Tensor(_L + "post_feedforward_layernorm.weight", "{layer}/mlp_post_norm/scale", "embed"),
        ),
    },
)

# Phi-3 / Phi-4: q, k and v fused in qkv_proj as [heads*d, kv_heads*d, kv_heads*d] rows (fewer kv heads than
# heads in Phi-4), gate and up in gate_up_proj (parts 0 and 1); each shard reads its slice of a part, export
# fuses them again.
_QKV = ("heads", "kv_heads", "kv_heads")
PHI3 = _replace(
    LLAMA,
    {
        "self_attn.q_proj.weight": (
            Tensor(_L + "self_attn.qkv_proj.weight", "{layer}/attn/q", "(heads kv) embed", part=0, split=_QKV),
            Tensor(_L + "self_attn.qkv_proj.weight", "{layer}/attn/k", "(kv_heads kv) embed", part=1, split=_QKV),
            Tensor(_L + "self_attn.qkv_proj.weight", "{layer}/attn/v", "(kv_heads kv) embed", part=2, split=_QKV),
        ),
        "self_attn.q_proj.bias": (),
        "self_attn.k_proj.weight": (),
        "self_attn.k_proj.bias": (),
        "self_attn.v_proj.weight": (),
        "self_attn.v_proj.bias": (),
        "self_attn.o_proj.bias": (),
        "mlp.gate_proj.weight": (
            Tensor(_L + "mlp.gate_up_proj.weight", "{layer}/mlp/wi_0", "(2 mlp) embed", part=0),
            Tensor(_L + "mlp.gate_up_proj.weight", "{layer}/mlp/wi_1", "(2 mlp) embed", part=1),
        ),
        "mlp.gate_proj.bias": (),
        "mlp.up_proj.weight": (),
        "mlp.up_proj.bias": (),
        "mlp.down_proj.bias": (),
    },
)

# OLMo-2: norms after the attention and the MLP only; q/k norms over the whole projection.
OLMO2 = _replace(
    LLAMA,
    {
        "input_layernorm.weight": (),
        "self_attn.o_proj.bias": (
            Tensor(_L + "self_attn.o_proj.bias", "{layer}/attn/o_bias", "embed", when="out_bias"),
            Tensor(_L + "self_attn.q_norm.weight", "{layer}/attn/q_norm/scale", "(heads kv)"),
            Tensor(_L + "self_attn.k_norm.weight", "{layer}/attn/k_norm/scale", "(kv_heads kv)"),
        ),
        "post_attention_layernorm.weight": (
            Tensor(_L + "post_attention_layernorm.weight", "{layer}/attn_post_norm/scale", "embed"),
            Tensor(_L + "post_feedforward_layernorm.weight", "{layer}/mlp_post_norm/scale", "embed"),
        ),
    },
)

# Mixtral and Qwen3-MoE: Llama's attention; in sparse layers a router and one tensor per expert ({e}),
# stacked on the parameters' `expert` axis. `moe_layer` holds per layer (Qwen3-MoE's dense layers keep
# Llama's MLP rows). transformers 5 fuses the experts in memory but save_pretrained writes these names.
_ATTN = tuple(r for r in LLAMA if ".mlp." not in r.hf)
_DENSE = tuple(r._replace(when="!moe_layer") for r in LLAMA if ".mlp." in r.hf and r.when is None)
_MOE = _L + "block_sparse_moe."
MIXTRAL = (
    _ATTN[:-2]
    + (
        Tensor(_MOE + "gate.weight", "{layer}/mlp/router", "expert embed"),
        Tensor(_MOE + "experts.{e}.w1.weight", "{layer}/mlp/wi_0", "mlp embed"),
        Tensor(_MOE + "experts.{e}.w2.weight", "{layer}/mlp/wo", "embed mlp"),
        Tensor(_MOE + "experts.{e}.w3.weight", "{layer}/mlp/wi_1", "mlp embed"),
    )
    + _ATTN[-2:]
)
QWEN3_MOE = (
    _ATTN[:10]
    + _QK_NORMS
    + _ATTN[10:-2]
    + _DENSE
    + (
        Tensor(_L + "mlp.gate.weight", "{layer}/mlp/router", "expert embed", when="moe_layer"),
        Tensor(_L + "mlp.experts.{e}.gate_proj.weight", "{layer}/mlp/wi_0", "mlp embed", when="moe_layer"),
        Tensor(_L + "mlp.experts.{e}.up_proj.weight", "{layer}/mlp/wi_1", "mlp embed", when="moe_layer"),
        Tensor(_L + "mlp.experts.{e}.down_proj.weight", "{layer}/mlp/wo", "embed mlp", when="moe_layer"),
    )
    + _ATTN[-2:]
)

# transformers 5's in-memory layout, which save_pretrained(save_original_format=False) writes: each
# layer's experts fused in one (experts, 2 mlp, embed) gate_up_proj and one down_proj, router `mlp.gate`.
_FUSED = (
    Tensor(_L + "mlp.gate.weight", "{layer}/mlp/router", "expert embed", when="moe_layer"),
    Tensor(_L + "mlp.experts.gate_up_proj", "{layer}/mlp/wi_0", "expert (2 mlp) embed", part=0, when="moe_layer"),
    Tensor(_L + "mlp.experts.gate_up_proj", "{layer}/mlp/wi_1", "expert (2 mlp) embed", part=1, when="moe_layer"),
    Tensor(_L + "mlp.experts.down_proj", "{layer}/mlp/wo", "expert embed mlp", when="moe_layer"),
)
MIXTRAL_FUSED = tuple(r for r in MIXTRAL if "block_sparse_moe" not in r.hf)[:-2] + _FUSED + _ATTN[-2:]
QWEN3_MOE_FUSED = tuple(r for r in QWEN3_MOE if ".experts." not in r.hf and ".mlp.gate." not in r.hf)[:-2]
QWEN3_MOE_FUSED += _FUSED + _ATTN[-2:]

# GPT-OSS: Llama's attention with biases and a sink logit per head; a router with a bias; each layer's experts
# fused as transformers holds them, gate and up interleaved in the last dimension of gate_up_proj ((mlp 2): gate
# at the even columns, up at the odd ones), (in, out) order, a bias per projection.
_OSS = _L + "mlp."
GPT_OSS = (
    _ATTN[:10]
    + (Tensor(_L + "self_attn.sinks", "{layer}/attn/sinks", "heads"),)
    + _ATTN[10:-2]
    + (
        Tensor(_OSS + "router.weight", "{layer}/mlp/router", "expert embed"),
        Tensor(_OSS + "router.bias", "{layer}/mlp/router_bias", "expert"),
        Tensor(_OSS + "experts.gate_up_proj", "{layer}/mlp/wi_0", "expert embed (mlp 2)", part=0),
        Tensor(_OSS + "experts.gate_up_proj", "{layer}/mlp/wi_1", "expert embed (mlp 2)", part=1),
        Tensor(_OSS + "experts.gate_up_proj_bias", "{layer}/mlp/wi_0_bias", "expert (mlp 2)", part=0),
        Tensor(_OSS + "experts.gate_up_proj_bias", "{layer}/mlp/wi_1_bias", "expert (mlp 2)", part=1),
        Tensor(_OSS + "experts.down_proj", "{layer}/mlp/wo", "expert mlp embed"),
        Tensor(_OSS + "experts.down_proj_bias", "{layer}/mlp/wo_bias", "expert embed"),
    )
    + _ATTN[-2:]
)

# DeepSeek-V3: multi-head latent attention (models/mla.py); kv_a_proj_with_mqa fuses the kv latent and the shared
# RoPE key part ([kv_lora, rope] rows: split); dense layers first (Llama's MLP), then a router with a score
# correction bias, one tensor per routed expert and a shared expert.
_SA = _L + "self_attn."
_KV_A = ("kv_lora_rank", "qk_rope_head_dim")
_MLA = (
    Tensor(_L + "input_layernorm.weight", "{layer}/attn_norm/scale", "embed"),
    Tensor(_SA + "q_proj.weight", "{layer}/attn/q", "(heads kv) embed", when="!q_lora_rank"),
    Tensor(_SA + "q_a_proj.weight", "{layer}/attn/q_a", "q_lora embed", when="q_lora_rank"),
    Tensor(_SA + "q_a_proj.bias", "{layer}/attn/q_a_bias", "q_lora", when="qkv_bias"),
    Tensor(_SA + "q_a_layernorm.weight", "{layer}/attn/q_a_norm/scale", "q_lora", when="q_lora_rank"),
    Tensor(_SA + "q_b_proj.weight", "{layer}/attn/q_b", "(heads kv) q_lora", when="q_lora_rank"),
    Tensor(_SA + "kv_a_proj_with_mqa.weight", "{layer}/attn/kv_a", "kv_lora embed", 0, split=_KV_A),
    Tensor(_SA + "kv_a_proj_with_mqa.weight", "{layer}/attn/k_rope", "kv embed", 1, split=_KV_A),
    Tensor(_SA + "kv_a_proj_with_mqa.bias", "{layer}/attn/kv_a_bias", "kv_lora", 0, "qkv_bias", _KV_A),
    Tensor(_SA + "kv_a_proj_with_mqa.bias", "{layer}/attn/k_rope_bias", "kv", 1, "qkv_bias", _KV_A),
    Tensor(_SA + "kv_a_layernorm.weight", "{layer}/attn/kv_a_norm/scale", "kv_lora"),
    Tensor(_SA + "kv_b_proj.weight", "{layer}/attn/kv_b", "(heads kv) kv_lora"),
    Tensor(_SA + "o_proj.weight", "{layer}/attn/o", "embed (heads kv)"),
    Tensor(_SA + "o_proj.bias", "{layer}/attn/o_bias", "embed", when="qkv_bias"),
    Tensor(_L + "post_attention_layernorm.weight", "{layer}/mlp_norm/scale", "embed"),
)
_DS = _L + "mlp."
DEEPSEEK_V3 = (
    (LLAMA[0],)
    + _MLA
    + _DENSE
    + (
        Tensor(_DS + "gate.weight", "{layer}/mlp/router", "expert embed", when="moe_layer"),
        Tensor(_DS + "gate.e_score_correction_bias", "{layer}/mlp/router_correction", "expert", when="moe_layer"),
        Tensor(_DS + "experts.{e}.gate_proj.weight", "{layer}/mlp/wi_0", "mlp embed", when="moe_layer"),
        Tensor(_DS + "experts.{e}.up_proj.weight", "{layer}/mlp/wi_1", "mlp embed", when="moe_layer"),
        Tensor(_DS + "experts.{e}.down_proj.weight", "{layer}/mlp/wo", "embed mlp", when="moe_layer"),
        Tensor(_DS + "shared_experts.gate_proj.weight", "{layer}/mlp/shared/wi_0", "mlp embed", when="moe_layer"),
        Tensor(_DS + "shared_experts.up_proj.weight", "{layer}/mlp/shared/wi_1", "mlp embed", when="moe_layer"),
        Tensor(_DS + "shared_experts.down_proj.weight", "{layer}/mlp/shared/wo", "embed mlp", when="moe_layer"),
    )
    + _ATTN[-2:]
)
# transformers 5's in-memory layout (save_original_format=False): each layer's routed experts fused.
DEEPSEEK_V3_FUSED = tuple(r for r in DEEPSEEK_V3 if ".experts.{e}." not in r.hf)[:-2] + _FUSED[1:] + _ATTN[-2:]

# Qwen3.5: full-attention layers with an output gate fused in q_proj (each head's query rows, then its gate rows)
# and per-head (1 + w) q/k norms; linear-attention layers (models/linear_attention.py) under `linear_attn.`.
_LA = _L + "linear_attn."
_FULL = "!linear_layer"
QWEN3_5 = (
    LLAMA[0],
    LLAMA[1],
    Tensor(_SA + "q_proj.weight", "{layer}/attn/q", "(heads 2 kv) embed", part=0, when=_FULL),
    Tensor(_SA + "q_proj.weight", "{layer}/attn/q_gate", "(heads 2 kv) embed", part=1, when=_FULL),
    Tensor(_SA + "k_proj.weight", "{layer}/attn/k", "(kv_heads kv) embed", when=_FULL),
    Tensor(_SA + "v_proj.weight", "{layer}/attn/v", "(kv_heads kv) embed", when=_FULL),
    Tensor(_SA + "o_proj.weight", "{layer}/attn/o", "embed (heads kv)", when=_FULL),
    Tensor(_SA + "q_norm.weight", "{layer}/attn/q_norm/scale", "kv", when=_FULL),
    Tensor(_SA + "k_norm.weight", "{layer}/attn/k_norm/scale", "kv", when=_FULL),
    Tensor(_LA + "in_proj_qkv.weight", "{layer}/attn/qkv", "linear_qkv embed", when="linear_layer"),
    Tensor(_LA + "in_proj_z.weight", "{layer}/attn/z", "(linear_heads linear_v) embed", when="linear_layer"),
    Tensor(_LA + "in_proj_b.weight", "{layer}/attn/b", "linear_heads embed", when="linear_layer"),
    Tensor(_LA + "in_proj_a.weight", "{layer}/attn/a", "linear_heads embed", when="linear_layer"),
    Tensor(_LA + "conv1d.weight", "{layer}/attn/conv", "linear_qkv 1 conv", when="linear_layer"),
    Tensor(_LA + "dt_bias", "{layer}/attn/dt_bias", "linear_heads", when="linear_layer"),
    Tensor(_LA + "A_log", "{layer}/attn/A_log", "linear_heads", when="linear_layer"),
    Tensor(_LA + "norm.weight", "{layer}/attn/norm_scale", "linear_v", when="linear_layer"),
    Tensor(_LA + "out_proj.weight", "{layer}/attn/o", "embed (linear_heads linear_v)", when="linear_layer"),
    *(r for r in LLAMA if "post_attention_layernorm" in r.hf or (".mlp." in r.hf and r.when is None)),
    *_ATTN[-2:],
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
# A Gemma3ForConditionalGeneration checkpoint: the vision tower and its projector (not loaded).
GEMMA3_EXTRA = LLAMA_EXTRA + (r"^(model\.)?(vision_tower|multi_modal_projector)\.",)
# A Qwen3_5ForConditionalGeneration checkpoint: the vision tower (not loaded); the multi-token-prediction head.
QWEN3_5_EXTRA = LLAMA_EXTRA + (r"^(model\.)?visual\.", r"^mtp\.")
GPT2_EXTRA = (r"(^|\.)attn\.(bias|masked_bias)$",)

__all__ = [
    "Tensor",
    "LLAMA",
    "QWEN3",
    "GEMMA2",
    "PHI3",
    "OLMO2",
    "GPT2",
    "MIXTRAL",
    "QWEN3_MOE",
    "MIXTRAL_FUSED",
    "GPT_OSS",
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_FUSED",
    "QWEN3_5",
    "QWEN3_5_EXTRA",
    "QWEN3_MOE_FUSED",
    "LLAMA_EXTRA",
    "GEMMA3_EXTRA",
    "GPT2_EXTRA",
]
