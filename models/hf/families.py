"""``config.json`` -> GPT options, one function per family; which fields each honours and which it rejects.

A missing key takes the value ``transformers``' config class gives it (its
class defaults are repeated here), so a hand-written ``config.json`` means
what it means to ``transformers``. Both dialects are read: transformers 4.x
(``rope_theta`` + ``rope_scaling``, ``torch_dtype``) and 5.x
(``rope_parameters``, ``dtype``, ``layer_types``). A field that would change
the computation in a way the decoder does not implement is a
:class:`~partitioning.ConfigError` whose ``arg`` is the key (the caller adds
the file); fields that do not change the logits (dropout, cache, token ids,
``initializer_range``, ``torch_dtype``) are ignored.

Example::

    >>> from partitioning.models.hf.families import FAMILIES
    >>> FAMILIES["llama"].options({"hidden_size": 64, "num_attention_heads": 4})["head_dim"]
    16
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.hf.fields import _LLAMA_DEFAULTS, ACTS, _act, _decoder, _rope  # noqa: F401 (re-exported)
from partitioning.models.hf.gemmas import gemma, gemma2, gemma3, text_config
from partitioning.models.hf.tables import (
    GEMMA2,
    GEMMA3_EXTRA,
    GPT2,
    GPT2_EXTRA,
    LLAMA,
    LLAMA_EXTRA,
    MIXTRAL,
    MIXTRAL_FUSED,
    OLMO2,
    PHI3,
    QWEN3,
    QWEN3_MOE,
    QWEN3_MOE_FUSED,
    Tensor,
)


@dataclass(frozen=True)
class Family:
    """A published architecture: its ``config.json`` reader and its name map.

    ``aliases`` are name prefixes some checkpoints of the family use instead of the
    canonical one (the original GPT-2 files say ``h.0.`` where transformers says ``transformer.h.0.``).
    """

    name: str
    architectures: tuple[str, ...]
    options: Callable[[Mapping[str, Any]], dict[str, Any]]
    tensors: tuple[Tensor, ...]
    extra: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    # Another name map the files may follow instead (transformers 5's fused experts): read when they
    # hold its first per-layer tensor; saving always writes ``tensors``.
    fused: tuple[Tensor, ...] = ()


def llama(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Llama 2/3/3.1/3.2: GQA, ``attention_bias`` (q, k, v and o), ``mlp_bias``, ``llama3`` / ``linear`` RoPE."""
    bias = bool(cfg.get("attention_bias", False))
    return {**_decoder(cfg, _LLAMA_DEFAULTS), "qkv_bias": bias, "out_bias": bias, "mlp_bias": bool(cfg.get("mlp_bias"))}


def mistral(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Mistral: ``sliding_window`` on every layer (absent: 4096 as in transformers; null: none)."""
    defaults = {**_LLAMA_DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8}
    window = cfg.get("sliding_window", 4096)
    return {**_decoder(cfg, defaults), "sliding_window": int(window) if window else None}


def qwen2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen2: q/k/v biases; a sliding window when ``use_sliding_window`` and every layer is a sliding one."""
    defaults = {**_LLAMA_DEFAULTS, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32}
    return _qwen_window(cfg, {**_decoder(cfg, defaults), "qkv_bias": True})


def qwen3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3: per-head q/k RMSNorm, explicit ``head_dim`` (128), ``attention_bias`` (q, k, v and o), Qwen2's windows."""
    defaults = {
        **_LLAMA_DEFAULTS,
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "head_dim": 128,
    }
    bias = bool(cfg.get("attention_bias", False))
    return _qwen_window(cfg, {**_decoder(cfg, defaults), "qkv_bias": bias, "out_bias": bias, "qk_norm": "head"})


def _qwen_window(cfg: Mapping[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """Qwen's ``use_sliding_window`` / ``max_window_layers``: honoured when every layer (or none) slides."""
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
    if window:
        n, first = out["layers"], int(cfg.get("max_window_layers", 28))
        types = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        sliding = [t == "sliding_attention" for t in types]
        if any(sliding) and not all(sliding):
            raise ConfigError(
                "sliding windows on some layers only (layer_types / max_window_layers) are not supported; "
                "use_sliding_window with every layer sliding, or none",
                arg="layer_types",
            )
        out["sliding_window"] = int(window) if all(sliding) else None
    return out


def phi3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Phi-3: fused ``qkv_proj`` / ``gate_up_proj`` (split on load, fused on export), ``sliding_window`` on every
    layer; q, k and v of equal size only (``num_key_value_heads == num_attention_heads``)."""
    defaults = {
        **_LLAMA_DEFAULTS,
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "rms_norm_eps": 1e-5,
    }
    out = _decoder(cfg, defaults)
    if out["kv_heads"] != out["heads"]:
        raise ConfigError(
            f"num_key_value_heads {out['kv_heads']} != num_attention_heads {out['heads']} is not supported for Phi-3 "
            "(its fused qkv_proj is split in three equal parts)",
            arg="num_key_value_heads",
        )
    window = cfg.get("sliding_window")
    return {**out, "sliding_window": int(window) if window else None}


def olmo2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """OLMo-2: norms after the attention and the MLP (none before), q/k RMSNorm over the whole projection."""
    defaults = {**_LLAMA_DEFAULTS, "vocab_size": 50304, "rms_norm_eps": 1e-5}
    bias = bool(cfg.get("attention_bias", False))
    out = _decoder(cfg, defaults)
    return {**out, "qkv_bias": bias, "out_bias": bias, "qk_norm": "all", "norm_placement": "post"}


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


def gpt2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, biases everywhere, a plain gelu MLP of ``n_inner`` (4 d)."""

    def get(key, alias, default):
        v = cfg.get(key, cfg.get(alias))
        return default if v is None else v

    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if cfg.get(key):
            raise ConfigError(f"{key} is not supported", arg=key)
    d = int(get("n_embd", "hidden_size", 768))
    return dict(
        vocab_size=int(get("vocab_size", "vocab_size", 50257)),
        embed=d,
        heads=int(get("n_head", "num_attention_heads", 12)),
        mlp=int(cfg.get("n_inner") or 4 * d),
        layers=int(get("n_layer", "num_hidden_layers", 12)),
        norm="layer",
        norm_eps=float(get("layer_norm_epsilon", "layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(get("tie_word_embeddings", "tie_word_embeddings", True)),
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        mlp_glu=False,
        mlp_act=_act(cfg, "activation_function", "gelu_new"),
        positions="learned",
        max_positions=int(get("n_positions", "max_position_embeddings", 1024)),
        attn_scale=None if cfg.get("scale_attn_weights", True) else 1.0,
    )


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", ("LlamaForCausalLM",), llama, LLAMA, LLAMA_EXTRA),
        Family("mistral", ("MistralForCausalLM",), mistral, LLAMA, LLAMA_EXTRA),
        Family("qwen2", ("Qwen2ForCausalLM",), qwen2, LLAMA, LLAMA_EXTRA),
        Family("qwen3", ("Qwen3ForCausalLM",), qwen3, QWEN3, LLAMA_EXTRA),
        Family("gemma", ("GemmaForCausalLM",), gemma, LLAMA, LLAMA_EXTRA),
        Family("gpt2", ("GPT2LMHeadModel",), gpt2, GPT2, GPT2_EXTRA, aliases=(("transformer.", ""),)),
        Family("gemma2", ("Gemma2ForCausalLM",), gemma2, GEMMA2, LLAMA_EXTRA),
        Family(
            "gemma3",
            ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
            gemma3,
            GEMMA2,
            GEMMA3_EXTRA,
            # The text tower of a multimodal checkpoint: transformers 5's names, then the published 4.x ones.
            aliases=(("model.", "model.language_model."), ("model.", "language_model.model.")),
        ),
        Family("phi3", ("Phi3ForCausalLM",), phi3, PHI3, LLAMA_EXTRA),
        Family("olmo2", ("Olmo2ForCausalLM",), olmo2, OLMO2, LLAMA_EXTRA),
        Family("mixtral", ("MixtralForCausalLM",), mixtral, MIXTRAL, LLAMA_EXTRA, fused=MIXTRAL_FUSED),
        Family("qwen3_moe", ("Qwen3MoeForCausalLM",), qwen3_moe, QWEN3_MOE, LLAMA_EXTRA, fused=QWEN3_MOE_FUSED),
    )
}
ARCHITECTURES = {a: f for f in FAMILIES.values() for a in f.architectures}


def family_of(cfg: Mapping[str, Any]) -> Family:
    """The family of a ``config.json`` (its ``architectures[0]``); ConfigError naming the supported ones.

    Example::

        >>> from partitioning.models.hf.families import family_of
        >>> family_of({"architectures": ["Qwen2ForCausalLM"]}).name
        'qwen2'
        >>> family_of({"architectures": ["BertModel"]})
        Traceback (most recent call last):
        partitioning.errors.ConfigError: architecture 'BertModel' is not supported; supported: GPT2LMHeadModel, \
Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, GemmaForCausalLM, LlamaForCausalLM, \
MistralForCausalLM, MixtralForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
Qwen3MoeForCausalLM
    """
    archs = cfg.get("architectures") or []
    if not archs:
        raise ConfigError(
            f"config.json has no 'architectures' entry; supported: {', '.join(sorted(ARCHITECTURES))}",
            arg="architectures",
        )
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}",
            arg="architectures",
        )
    return ARCHITECTURES[arch]


__all__ = [
    "Family",
    "FAMILIES",
    "ARCHITECTURES",
    "ACTS",
    "family_of",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "gpt2",
    "text_config",
    "mixtral",
    "qwen3_moe",
]
