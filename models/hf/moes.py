"""``config.json`` readers of the mixture-of-experts families: Mixtral, Qwen3-MoE.

Example::

    >>> from partitioning.models.hf.moes import qwen3_moe
    >>> opts = qwen3_moe({"num_hidden_layers": 4, "mlp_only_layers": [1]})
    >>> opts["moe"]["experts"], opts["moe"]["mlp"], opts["moe_layers"]
    (128, 768, (0, 2, 3))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.hf.fields import _LLAMA_DEFAULTS, _decoder


def _experts(cfg: Mapping[str, Any], default: int) -> int:
    """``num_experts`` / ``num_local_experts``: transformers 5 maps each name to the other (it writes the latter)."""
    v = cfg.get("num_local_experts", cfg.get("num_experts"))
    return default if v is None else int(v)


def _moe(cfg: Mapping[str, Any], experts: int, defaults: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``moe`` options of Mixtral / Qwen3-MoE: dropless, so no token is ever dropped (logits as transformers').

    The router's load-balancing loss joins the objective only where transformers adds it
    (``output_router_logits``), weighted by ``router_aux_loss_coef``; ``router_jitter_noise``
    (training-time input noise) is not implemented.
    """

    def get(key):
        v = cfg.get(key)
        return defaults.get(key) if v is None else v

    if cfg.get("router_jitter_noise"):
        raise ConfigError(
            f"router_jitter_noise {cfg['router_jitter_noise']} is not supported (only 0: no router noise)",
            arg="router_jitter_noise",
        )
    weight = float(get("router_aux_loss_coef")) if cfg.get("output_router_logits") else 0.0
    return dict(
        experts=experts,
        top_k=int(get("num_experts_per_tok")),
        dropless=True,
        capacity_factor=None,
        aux_loss_weight=weight,
        **extra,
    )


_MIXTRAL_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.001,
}


def mixtral(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Mixtral: Mistral's attention, a sparse MoE MLP in every layer (softmax, top-k, gates renormalised)."""
    window = cfg.get("sliding_window")
    out = {**_decoder(cfg, _MIXTRAL_DEFAULTS), "sliding_window": int(window) if window else None}
    out["moe"] = _moe(cfg, _experts(cfg, 8), _MIXTRAL_DEFAULTS, norm_topk_prob=True)
    return out


_QWEN3_MOE_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "decoder_sparse_step": 1,
    "router_aux_loss_coef": 0.001,
}


def qwen3_moe(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3's attention, MoE layers by `decoder_sparse_step` / `mlp_only_layers`, `norm_topk_prob`."""
    # Experts are moe_intermediate_size wide, dense layers intermediate_size; dense layers between
    # sparse ones build the layers unscanned (a scanned stack repeats one block).
    d = _QWEN3_MOE_DEFAULTS
    out = {**_decoder(cfg, d), "qk_norm": "head"}
    if cfg.get("attention_bias"):
        out.update(qkv_bias=True, out_bias=True)
    if cfg.get("use_sliding_window"):
        window = cfg.get("sliding_window", 4096)
        out["sliding_window"] = int(window) if window else None
    experts = _experts(cfg, 128)
    step = int(cfg.get("decoder_sparse_step") or d["decoder_sparse_step"])
    dense = set(cfg.get("mlp_only_layers") or ())
    sparse = tuple(i for i in range(out["layers"]) if i not in dense and experts > 0 and (i + 1) % step == 0)
    if sparse:
        mlp = int(cfg.get("moe_intermediate_size") or d["moe_intermediate_size"])
        out["moe"] = _moe(cfg, experts, d, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), mlp=mlp)
        if len(sparse) < out["layers"]:
            out["moe_layers"] = sparse
    return out


_GPT_OSS_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "num_experts_per_tok": 4,
    "router_aux_loss_coef": 0.001,
}
# transformers' GptOssConfig RoPE when none is given.
_GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def gpt_oss(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-OSS: attention sinks, biases on q/k/v/o, sliding and full layers alternating (``layer_types``), YaRN;
    experts with a router bias, the softmax of the top-k logits as gates, biased projections and the clamped SwiGLU
    (``swiglu_limit``, ``swiglu_alpha``). The published MXFP4 expert weights (``*_blocks`` / ``*_scales``) are not
    read: dequantized (bf16 / float32) files are."""
    d = _GPT_OSS_DEFAULTS
    if not cfg.get("rope_parameters") and not cfg.get("rope_scaling"):
        cfg = {**cfg, "rope_parameters": {**_GPT_OSS_ROPE, "rope_theta": cfg.get("rope_theta", 150000.0)}}
    bias = bool(cfg.get("attention_bias", True))
    out = {**_decoder({**cfg, "layer_types": None}, d), "qkv_bias": bias, "out_bias": bias, "attn_sinks": True}
    n = out["layers"]
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    window = cfg.get("sliding_window", 128)
    if window and "sliding_attention" in types:
        out.update(sliding_window=int(window), layer_types=tuple(types))
    limit, alpha = cfg.get("swiglu_limit", 7.0), cfg.get("swiglu_alpha", 1.702)
    out["moe"] = _moe(
        cfg,
        _experts(cfg, 128),
        d,
        mlp=out["mlp"],
        router_bias=True,
        expert_bias=True,
        routing="topk_softmax",
        swiglu_limit=float(limit),
        swiglu_alpha=float(alpha),
    )
    return out


__all__ = ["mixtral", "qwen3_moe", "gpt_oss"]
