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
from partitioning.models.hf.gemma4 import GEMMA4, GEMMA4_EXTRA, gemma4
from partitioning.models.hf.gemmas import gemma, gemma2, gemma3, text_config
from partitioning.models.hf.hybrids import qwen3_5
from partitioning.models.hf.moes import deepseek_v3, gpt_oss, mixtral, mtp_layers, qwen3_moe
from partitioning.models.hf.tables import (
    DEEPSEEK_V3,
    DEEPSEEK_V3_FUSED,
    GEMMA2,
    GEMMA3_EXTRA,
    GPT2,
    GPT2_EXTRA,
    GPT_OSS,
    LLAMA,
    LLAMA_EXTRA,
    MIXTRAL,
    MIXTRAL_FUSED,
    OLMO2,
    PHI3,
    QWEN3,
    QWEN3_5,
    QWEN3_5_EXTRA,
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
    # Tensors a checkpoint of this config holds that the model does not use, beyond ``extra`` (DeepSeek's
    # multi-token-prediction layers): name patterns from the ``config.json``.
    extra_of: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None

    def skipped(self, cfg: Mapping[str, Any]) -> tuple[str, ...]:
        """The name patterns of the tensors loading skips for ``cfg``."""
        return self.extra + (self.extra_of(cfg) if self.extra_of else ())


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
    """Phi-3 and Phi-4: fused ``qkv_proj`` (``[heads*d, kv*d, kv*d]``: fewer kv heads than heads in Phi-4) and
    ``gate_up_proj`` (split on load, fused on export), ``partial_rotary_factor`` (Phi-4-mini), LongRoPE,
    ``sliding_window`` on every layer."""
    defaults = {
        **_LLAMA_DEFAULTS,
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "rms_norm_eps": 1e-5,
    }
    key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rp = cfg.get(key)
    if isinstance(rp, Mapping) and rp.get("rope_type", rp.get("type")) in ("su", "yarn"):
        # transformers reads Phi-3's legacy names of LongRoPE as longrope.
        cfg = {**cfg, key: {**rp, "rope_type": "longrope", "type": "longrope"}}
    out = _decoder(cfg, defaults, partial=True)
    scaling = out["rope_scaling"] or {}
    if scaling.get("rope_type") == "longrope":
        rotated = int(out["head_dim"] * out["partial_rotary_factor"])
        short, long = len(scaling["short_factor"]), len(scaling["long_factor"])
        if short != rotated // 2 or long != rotated // 2:
            raise ConfigError(
                f"{key}: longrope's short_factor and long_factor need {rotated // 2} entries each (half of the "
                f"{rotated} rotated features), got {short} and {long}",
                arg=key,
            )
    window = cfg.get("sliding_window")
    return {**out, "sliding_window": int(window) if window else None}


def olmo2(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """OLMo-2: norms after the attention and the MLP (none before), q/k RMSNorm over the whole projection."""
    defaults = {**_LLAMA_DEFAULTS, "vocab_size": 50304, "rms_norm_eps": 1e-5}
    bias = bool(cfg.get("attention_bias", False))
    out = _decoder(cfg, defaults)
    return {**out, "qkv_bias": bias, "out_bias": bias, "qk_norm": "all", "norm_placement": "post"}


def _layer_types(cfg: Mapping[str, Any], n: int, default: list[str]) -> tuple[str, ...]:
    types = cfg.get("layer_types") or default
    if len(types) != n or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ConfigError(
            f"layer_types must list full_attention or sliding_attention for each of the {n} layers", arg="layer_types"
        )
    return tuple(types)


def olmo3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """OLMo-3: OLMo-2's block with sliding-window layers beside full ones (``layer_types``; by default every 4th
    layer full, ``sliding_window`` 4096), the full layers' RoPE scaling (YaRN) apart from the sliding layers' plain
    RoPE of the same base."""
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:  # transformers 5: one RoPE per layer kind
        full = {**cfg, "rope_parameters": {"rope_theta": 500000.0, **(rp.get("full_attention") or {})}}
        theta = full["rope_parameters"]["rope_theta"]
        local = {"rope_theta": (rp.get("sliding_attention") or {}).get("rope_theta", theta)}
    else:  # transformers 4: rope_theta + rope_scaling for the full layers, the same base plain for the sliding ones
        full = {**cfg, "rope_theta": cfg.get("rope_theta", 500000.0), "layer_types": None}
        local = {"rope_theta": full["rope_theta"]}
    out = olmo2({**full, "layer_types": None})
    n = out["layers"]
    types = _layer_types(cfg, n, ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)])
    window = cfg.get("sliding_window", 4096)
    if window and "sliding_attention" in types:
        out.update(sliding_window=int(window), layer_types=types)
        if out["rope_scaling"] or float(local["rope_theta"]) != out["rope_theta"]:
            out.update(local_rope_theta=float(local["rope_theta"]), local_rope_scaling=None)
    return out


def smollm3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """SmolLM3: Llama's block, RoPE off on the ``no_rope_layers`` (by default every 4th layer, NoPE), sliding windows
    on the NoPE layers with ``use_sliding_window``."""
    defaults = {
        **_LLAMA_DEFAULTS,
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "tie_word_embeddings": True,
    }
    rp = cfg.get("rope_parameters")
    if rp:  # SmolLM3's default base is 2,000,000
        cfg = {**cfg, "rope_parameters": {"rope_theta": 2000000.0, **rp}}
    else:
        cfg = {**cfg, "rope_theta": cfg.get("rope_theta", 2000000.0)}
    bias = bool(cfg.get("attention_bias", False))
    out = {**_decoder({**cfg, "layer_types": None}, defaults), "qkv_bias": bias, "out_bias": bias}
    out["mlp_bias"] = bool(cfg.get("mlp_bias"))
    n = out["layers"]
    interval = int(cfg.get("no_rope_layer_interval") or 4)
    flags = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise ConfigError(f"no_rope_layers must have one 0 or 1 for each of the {n} layers", arg="no_rope_layers")
    nope = tuple(i for i, f in enumerate(flags) if not f)
    if nope:
        out["nope_layers"] = nope
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    if window:
        default = ["sliding_attention" if not flags[i] else "full_attention" for i in range(n)]
        types = _layer_types(cfg, n, default)
        if "sliding_attention" in types:
            out.update(sliding_window=int(window), layer_types=types)
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
        Family(
            "gemma4",
            ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
            gemma4,
            GEMMA4,
            GEMMA4_EXTRA,
            aliases=(("model.", "model.language_model."),),
        ),
        Family("phi3", ("Phi3ForCausalLM",), phi3, PHI3, LLAMA_EXTRA),
        Family("olmo2", ("Olmo2ForCausalLM",), olmo2, OLMO2, LLAMA_EXTRA),
        Family("olmo3", ("Olmo3ForCausalLM",), olmo3, OLMO2, LLAMA_EXTRA),
        Family("smollm3", ("SmolLM3ForCausalLM",), smollm3, LLAMA, LLAMA_EXTRA),
        Family("mixtral", ("MixtralForCausalLM",), mixtral, MIXTRAL, LLAMA_EXTRA, fused=MIXTRAL_FUSED),
        Family("qwen3_moe", ("Qwen3MoeForCausalLM",), qwen3_moe, QWEN3_MOE, LLAMA_EXTRA, fused=QWEN3_MOE_FUSED),
        Family("gpt_oss", ("GptOssForCausalLM",), gpt_oss, GPT_OSS, LLAMA_EXTRA),
        Family(
            "qwen3_5",
            ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
            qwen3_5,
            QWEN3_5,
            QWEN3_5_EXTRA,
            aliases=(("model.", "model.language_model."),),
        ),
        Family(
            "deepseek_v3",
            ("DeepseekV3ForCausalLM",),
            deepseek_v3,
            DEEPSEEK_V3,
            LLAMA_EXTRA,
            fused=DEEPSEEK_V3_FUSED,
            extra_of=mtp_layers,
        ),
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
        partitioning.errors.ConfigError: architecture 'BertModel' is not supported; supported: DeepseekV3ForCausalLM, \
GPT2LMHeadModel, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma4ForCausalLM, \
Gemma4ForConditionalGeneration, GemmaForCausalLM, \
GptOssForCausalLM, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, \
Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5ForCausalLM, \
Qwen3_5ForConditionalGeneration, SmolLM3ForCausalLM
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
    "gemma4",
    "phi3",
    "olmo2",
    "olmo3",
    "smollm3",
    "gpt2",
    "text_config",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
    "deepseek_v3",
    "qwen3_5",
]
