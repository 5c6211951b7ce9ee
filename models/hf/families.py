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
from partitioning.models.attention import parse_rope_scaling
from partitioning.models.hf.tables import GPT2, GPT2_EXTRA, LLAMA, LLAMA_EXTRA, MIXTRAL, QWEN3_MOE, Tensor

# transformers' ACT2FN names -> the decoder's activations.
ACTS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


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


def _act(cfg: Mapping[str, Any], key: str, default: str) -> str:
    name = cfg.get(key) or default
    if name not in ACTS:
        raise ConfigError(f"{key} {name!r} is not supported; supported: {', '.join(ACTS)}", arg=key)
    return ACTS[name]


def _rope(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` from either dialect."""
    key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rp = dict(cfg.get(key) or {})
    layer_types = set(cfg.get("layer_types") or ())
    if layer_types & set(rp):
        raise ConfigError(
            f"{key} per layer type ({', '.join(sorted(layer_types & set(rp)))}) is not supported", arg=key
        )
    partial = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(f"partial_rotary_factor {partial} is not supported (only 1.0: rotate every feature)", arg=key)
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind == "llama3":
        rp.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    try:
        scaling = parse_rope_scaling(None if kind == "default" else {**rp, "rope_type": kind})
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}", arg=key) from e
    return {"rope_theta": theta, "rope_scaling": dict(scaling) if scaling else None}


def _decoder(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The options every Llama-shaped family shares."""

    def get(key):
        v = cfg.get(key)
        return defaults.get(key) if v is None else v

    d, heads = int(get("hidden_size")), int(get("num_attention_heads"))
    return dict(
        vocab_size=int(get("vocab_size")),
        embed=d,
        heads=heads,
        kv_heads=int(get("num_key_value_heads") or heads),
        head_dim=int(get("head_dim") or d // heads),
        mlp=int(get("intermediate_size")),
        layers=int(get("num_hidden_layers")),
        norm_eps=float(get("rms_norm_eps")),
        tie_embeddings=bool(get("tie_word_embeddings")),
        mlp_act=_act(cfg, "hidden_act", defaults["hidden_act"]),
        # torch's Linear stores weights (out, in): the same order here makes loading a reshape.
        kernel_order="out_in",
        **_rope(cfg),
    )


_LLAMA_DEFAULTS = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    hidden_act="silu",
)


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
    out = {**_decoder(cfg, defaults), "qkv_bias": True}
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


def gemma(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma: GeGLU, ``(1 + w)`` RMSNorm, embeddings scaled by ``sqrt(hidden_size)``, tied, own ``head_dim``."""
    defaults = {
        **_LLAMA_DEFAULTS,
        "vocab_size": 256000,
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "tie_word_embeddings": True,
        "hidden_act": "gelu_pytorch_tanh",
    }
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise ConfigError(f"{key} is not supported (a Gemma 2 option)", arg=key)
    if cfg.get("use_bidirectional_attention"):
        raise ConfigError(
            "use_bidirectional_attention is not supported (the decoder is causal)", arg="use_bidirectional_attention"
        )
    # Gemma's legacy `hidden_act: gelu` means the tanh approximation (transformers converts it too);
    # transformers 4.x configs name it `hidden_activation`.
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or defaults["hidden_act"]
    cfg = {**cfg, "hidden_act": "gelu_pytorch_tanh" if act == "gelu" else act}
    bias = bool(cfg.get("attention_bias", False))
    out = {**_decoder(cfg, defaults), "norm": "rms_offset", "embed_scale": True, "qkv_bias": bias, "out_bias": bias}
    if cfg.get("query_pre_attn_scalar") is not None:
        out["attn_scale"] = float(cfg["query_pre_attn_scalar"]) ** -0.5
    return out


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


_MIXTRAL_DEFAULTS = {
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


_QWEN3_MOE_DEFAULTS = {
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
    """Qwen3-MoE: Qwen3's attention (q/k RMSNorm per head), MoE layers by ``decoder_sparse_step`` / ``mlp_only_layers``.

    Experts are ``moe_intermediate_size`` wide, dense layers ``intermediate_size``; ``norm_topk_prob``
    renormalises the top-k gates. Dense layers between sparse ones build the layers unscanned.
    """
    d = _QWEN3_MOE_DEFAULTS
    out = {**_decoder(cfg, d), "qk_norm": True}
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
        Family("gemma", ("GemmaForCausalLM",), gemma, LLAMA, LLAMA_EXTRA),
        Family("gpt2", ("GPT2LMHeadModel",), gpt2, GPT2, GPT2_EXTRA, aliases=(("transformer.", ""),)),
        Family("mixtral", ("MixtralForCausalLM",), mixtral, MIXTRAL, LLAMA_EXTRA),
        Family("qwen3_moe", ("Qwen3MoeForCausalLM",), qwen3_moe, QWEN3_MOE, LLAMA_EXTRA),
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
GemmaForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
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
    "gemma",
    "gpt2",
    "mixtral",
    "qwen3_moe",
]
