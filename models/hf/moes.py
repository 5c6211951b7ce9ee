"""``config.json`` readers of the mixture-of-experts families: Mixtral, Qwen3-MoE, GPT-OSS, DeepSeek-V3.

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


_DEEPSEEK_V3_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_experts_per_tok": 8,
    "router_aux_loss_coef": 0.001,
}
_MLA_DEFAULTS = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "rope_interleave": True,
}


def deepseek_v3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3 / R1: multi-head latent attention (`q_lora_rank`, `kv_lora_rank`, `qk_rope_head_dim`,
    `qk_nope_head_dim`, `v_head_dim`, interleaved RoPE, YaRN's `mscale_all_dim` on the scale) caching its latent;
    `first_k_dense_replace` dense layers, then experts routed by sigmoid scores with a correction bias within the
    best `topk_group` of `n_group` groups, scaled by `routed_scaling_factor`, beside a shared expert. The
    multi-token-prediction layer (`num_nextn_predict_layers`) is not built: its tensors are skipped."""
    d = _DEEPSEEK_V3_DEFAULTS
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ConfigError(
            f"scoring_func {cfg['scoring_func']!r} is not supported (DeepSeek-V3 routes by sigmoid scores)",
            arg="scoring_func",
        )

    def get(key, default):
        v = cfg.get(key)
        return default if v is None else v

    mla = {k: get(k, v) for k, v in _MLA_DEFAULTS.items()}
    if "q_lora_rank" in cfg:  # null: the queries come straight from the hidden state (no query latent)
        mla["q_lora_rank"] = cfg["q_lora_rank"]
    out = _decoder(cfg, d)
    head = int(mla["qk_nope_head_dim"]) + int(mla["qk_rope_head_dim"])
    bias = bool(cfg.get("attention_bias", False))
    out.update(head_dim=head, mla=mla, qkv_bias=bias, out_bias=bias)
    experts = int(get("n_routed_experts", 256))
    m = int(get("moe_intermediate_size", 2048))
    out["moe"] = _moe(
        cfg,
        experts,
        d,
        mlp=m,
        norm_topk_prob=bool(get("norm_topk_prob", True)),
        routing="sigmoid_group",
        groups=int(get("n_group", 8)),
        topk_groups=int(get("topk_group", 4)),
        routed_scaling=float(get("routed_scaling_factor", 2.5)),
        correction_bias=True,
        shared_mlp=m * int(get("n_shared_experts", 1)) or None,
    )
    first = int(get("first_k_dense_replace", 3))
    if first:
        out["moe_layers"] = tuple(range(first, out["layers"]))
    return out


def mtp_layers(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """Name patterns of a DeepSeek checkpoint's multi-token-prediction layers (after the last decoder layer), which
    the causal LM does not use (transformers skips them too)."""
    n = int(cfg.get("num_nextn_predict_layers") or cfg.get("num_mtp_layers") or 0)
    first = int(cfg.get("num_hidden_layers") or 61)
    return tuple(rf"^model\.layers\.{first + i}\." for i in range(n))


__all__ = ["mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "mtp_layers"]
