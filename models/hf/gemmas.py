"""``config.json`` readers of the Gemma families: Gemma, Gemma 2, Gemma 3 (text, and a multimodal checkpoint's text).

Example::

    >>> from partitioning.models.hf.gemmas import gemma3
    >>> opts = gemma3({"num_hidden_layers": 8, "sliding_window": 512})
    >>> opts["layer_types"].count("full_attention"), opts["local_rope_theta"], opts["rope_theta"]
    (1, 10000.0, 1000000.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.hf.fields import _LLAMA_DEFAULTS, _decoder, _rope

_GEMMA_DEFAULTS = {
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


def _gemma(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """What Gemma 1, 2 and 3 share: GeGLU, ``(1 + w)`` norms, the ``sqrt(d)`` embedding scale, the attention scale."""
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
    scalar = cfg.get("query_pre_attn_scalar", defaults.get("query_pre_attn_scalar"))
    if scalar is not None:
        out["attn_scale"] = float(scalar) ** -0.5
    return out


def gemma(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma: GeGLU, ``(1 + w)`` RMSNorm, embeddings scaled by ``sqrt(hidden_size)``, tied, own ``head_dim``."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise ConfigError(f"{key} is not supported (a Gemma 2 option)", arg=key)
    return _gemma(cfg, _GEMMA_DEFAULTS)


def _softcaps(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Soft-caps: an absent key takes the class default, ``null`` is none."""
    caps = {k: cfg.get(k, defaults.get(k)) for k in ("attn_logit_softcapping", "final_logit_softcapping")}
    return {
        "attn_softcap": float(caps["attn_logit_softcapping"]) if caps["attn_logit_softcapping"] else None,
        "final_softcap": float(caps["final_logit_softcapping"]) if caps["final_logit_softcapping"] else None,
    }


def _layer_types(cfg: Mapping[str, Any], n: int, pattern: int) -> tuple[str, ...]:
    """``layer_types``, else every ``pattern``-th layer global (transformers' default for Gemma 2 and 3)."""
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ConfigError(
            f"layer_types must list full_attention or sliding_attention for each of the {n} layers", arg="layer_types"
        )
    return tuple(types)


def _local_global(cfg: Mapping[str, Any], out: dict[str, Any], pattern: int) -> dict[str, Any]:
    types = _layer_types(cfg, out["layers"], pattern)
    window = cfg.get("sliding_window", 4096)
    if window and "sliding_attention" in types:
        out.update(sliding_window=int(window), layer_types=types)
    return out


_GEMMA2_DEFAULTS = {
    **_GEMMA_DEFAULTS,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
}


def gemma2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 2: Gemma's options, soft-capped attention scores and logits, four norms a block, local/global layers."""
    out = {**_gemma(cfg, _GEMMA2_DEFAULTS), **_softcaps(cfg, _GEMMA2_DEFAULTS), "norm_placement": "pre_post"}
    return _local_global(cfg, out, 2)


_GEMMA3_DEFAULTS = {
    **_GEMMA2_DEFAULTS,
    "vocab_size": 262208,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
}


def text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: a multimodal checkpoint's ``text_config`` (its ``tie_word_embeddings`` is the
    outer one, as transformers ties the outer model), else ``cfg`` itself."""
    inner = cfg.get("text_config")
    if inner is None:
        return cfg
    tie = cfg.get("tie_word_embeddings", inner.get("tie_word_embeddings", True))
    return {**inner, "tie_word_embeddings": tie}


def gemma3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 3 (text, or the text tower of a ``Gemma3ForConditionalGeneration``): Gemma 2's block with per-head q/k
    norms, no soft-caps by default, local layers by ``layer_types`` / ``sliding_window_pattern`` (6) with their own
    RoPE (``rope_local_base_freq``, or ``rope_parameters.sliding_attention``)."""
    cfg = text_config(cfg)
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:  # transformers 5: one RoPE per layer kind
        full = {**cfg, "rope_parameters": {"rope_theta": 1e6, **(rp.get("full_attention") or {})}}
        local = {"rope_parameters": {"rope_theta": 10000.0, **(rp.get("sliding_attention") or {})}}
    else:  # transformers 4: rope_theta + rope_scaling global, rope_local_base_freq local (default RoPE)
        full = {**cfg, "rope_theta": cfg.get("rope_theta", 1e6)}
        local = {"rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
    out = {**_gemma(full, _GEMMA3_DEFAULTS), **_softcaps(cfg, _GEMMA3_DEFAULTS)}
    out.update(norm_placement="pre_post", qk_norm="head")
    out = _local_global(cfg, out, int(cfg.get("sliding_window_pattern") or 6))
    if out.get("layer_types"):
        try:
            loc = _rope({**local, "max_position_embeddings": cfg.get("max_position_embeddings")})
        except ConfigError as e:
            raise ConfigError(f"sliding_attention {e}", arg=e.arg) from e
        out.update(local_rope_theta=loc["rope_theta"], local_rope_scaling=loc["rope_scaling"])
    return out


__all__ = ["gemma", "gemma2", "gemma3", "text_config"]
