"""Gemma 4 (text, or the text tower of a ``Gemma4ForConditionalGeneration``): its ``config.json`` reader and name map.

Gemma 3's block (four norms, per-head q/k norms, GeGLU, ``sqrt(d)`` embedding scale) with plain ``x * w`` norms,
no attention scale (1.0), values RMS-normed, global (``full_attention``) layers of their own head size
(``global_head_dim`` / ``per_layer_config``) and kv heads (``num_global_key_value_heads`` with
``attention_k_eq_v``: their values are their keys), RoPE per layer type (the global one ``proportional``),
per-layer inputs (``hidden_size_per_layer_input``) and a stored scalar per layer
(:mod:`partitioning.models.per_layer`).

Example::

    >>> from partitioning.models.hf.gemma4 import gemma4
    >>> opts = gemma4({"num_hidden_layers": 6})
    >>> opts["global_head_dim"], opts["layer_types"][-1], opts["rope_scaling"]
    (512, 'full_attention', {'rope_type': 'proportional', 'partial_rotary_factor': 0.25})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.attention import parse_rope_scaling
from partitioning.models.hf.fields import _LLAMA_DEFAULTS, _decoder, _plain
from partitioning.models.hf.gemmas import text_config
from partitioning.models.hf.tables import GEMMA3_EXTRA, LLAMA, Tensor

_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 262144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "tie_word_embeddings": True,
    "hidden_act": "gelu_pytorch_tanh",
}
_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def _rope_of(rp: Mapping[str, Any], kind: str) -> tuple[float, dict[str, Any] | None]:
    """One layer type's ``(theta, scaling)``: ``default`` and ``proportional`` (transformers' two for Gemma 4)."""
    spec = dict(rp.get(kind) or _ROPE[kind])
    theta = float(spec.pop("rope_theta", _ROPE[kind]["rope_theta"]))
    rope_type = spec.get("rope_type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type != "proportional":
        raise ConfigError(f"rope_parameters.{kind}: rope_type {rope_type!r} is not supported", arg="rope_parameters")
    return theta, _plain(parse_rope_scaling(spec))


def _global_sizes(cfg: Mapping[str, Any], types: tuple[str, ...]) -> tuple[int, int | None]:
    """The global layers' head size and kv heads: ``per_layer_config`` (what transformers saves) if given, else
    ``global_head_dim`` (512) and ``num_global_key_value_heads`` (only with ``attention_k_eq_v``)."""
    per = cfg.get("per_layer_config")
    if per is None:
        kv = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v") else None
        return int(cfg.get("global_head_dim") or 512), None if kv is None else int(kv)
    rows = {int(k): dict(v) for k, v in per.items()}
    full = {i for i, t in enumerate(types) if t == "full_attention"}
    shapes = {tuple(sorted(rows.get(i, {}).items())) for i in full}
    if set(rows) - full or len(shapes) > 1 or any(set(r) - {"head_dim", "num_key_value_heads"} for r in rows.values()):
        raise ConfigError(
            "per_layer_config must give every full_attention layer the same head_dim / num_key_value_heads",
            arg="per_layer_config",
        )
    one = dict(shapes.pop()) if shapes else {}
    kv = one.get("num_key_value_heads")
    return int(one.get("head_dim") or cfg.get("head_dim") or _DEFAULTS["head_dim"]), None if kv is None else int(kv)


def gemma4(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma 4 (text, or the text tower of a ``Gemma4ForConditionalGeneration``, whose vision and audio towers are
    not loaded): Gemma 3's block with ``x * w`` norms, no attention scale, values RMS-normed, global layers of their
    own head size (``global_head_dim`` / ``per_layer_config``) and kv heads (``num_global_key_value_heads`` with
    ``attention_k_eq_v``: values from the keys), proportional RoPE on the global layers, per-layer inputs
    (``hidden_size_per_layer_input``), a scalar per layer, the last layers reusing earlier layers' keys and values
    (``num_kv_shared_layers``, with ``use_double_wide_mlp``); refused: mixture-of-experts layers
    (``enable_moe_block``), bidirectional attention over text (``use_bidirectional_attention: all``)."""
    cfg = text_config(cfg)
    for key, why in (("enable_moe_block", "mixture-of-experts layers (Gemma 4 26B-A4B) are not supported"),):
        if cfg.get(key):
            raise ConfigError(f"{key}: {why}", arg=key)
    if cfg.get("use_bidirectional_attention") == "all":  # "vision": image tokens only; text stays causal
        raise ConfigError(
            "use_bidirectional_attention: all is not supported (the decoder is causal)",
            arg="use_bidirectional_attention",
        )
    out = _decoder({**cfg, "rope_parameters": None, "rope_theta": 10000.0, "layer_types": None}, _DEFAULTS)
    n = out["layers"]
    pattern = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types = list(cfg.get("layer_types") or pattern)
    if len(types) != n or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise ConfigError(
            f"layer_types must list full_attention or sliding_attention for each of the {n} layers", arg="layer_types"
        )
    types[-1] = "full_attention"  # transformers forces the last layer global
    rp = cfg.get("rope_parameters") or {}
    theta, scaling = _rope_of(rp, "full_attention")
    local_theta, local_scaling = _rope_of(rp, "sliding_attention")
    head_dim, kv = _global_sizes(cfg, tuple(types))
    bias = bool(cfg.get("attention_bias", False))
    cap = cfg.get("final_logit_softcapping")
    width = int(cfg.get("hidden_size_per_layer_input", 256) or 0)
    out.update(
        norm="rms",
        embed_scale=True,
        attn_scale=1.0,
        qkv_bias=bias,
        out_bias=bias,
        norm_placement="pre_post",
        qk_norm="head",
        v_norm=True,
        final_softcap=float(cap) if cap else None,
        layer_types=tuple(types),
        sliding_window=int(cfg.get("sliding_window") or 512),
        rope_theta=theta,
        rope_scaling=scaling,
        local_rope_theta=local_theta,
        local_rope_scaling=local_scaling,
        global_head_dim=head_dim,
        global_kv_heads=kv,
        global_k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        layer_scalar=True,
    )
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    if shared:
        out.update(kv_shared_layers=shared, shared_wide_mlp=bool(cfg.get("use_double_wide_mlp")))
    if width:
        vocab = cfg.get("vocab_size_per_layer_input")
        out.update(per_layer_input=width, per_layer_vocab=int(vocab or 262144))
    return out


_L = "model.layers.{i}."
_SA = _L + "self_attn."
_PL, _PLE = "per_layer_input", "(per_layer_layers per_layer)"
# transformers' names; the layers reusing shared keys and values have no k_proj / v_proj / k_norm (`kv_layer`: the
# layers that do), the global layers of an `attention_k_eq_v` checkpoint no v_proj (`v_layer`), v_norm no weight.
GEMMA4 = (
    LLAMA[0],
    Tensor(
        "model.embed_tokens_per_layer.weight", "ple/per_layer_embedding", "vocab (per_layer_layers per_layer)", when=_PL
    ),
    Tensor(
        "model.per_layer_model_projection.weight", "ple/per_layer_proj", "(per_layer_layers per_layer) embed", when=_PL
    ),
    Tensor("model.per_layer_projection_norm.weight", "ple/per_layer_norm/scale", "per_layer", when=_PL),
    LLAMA[1],
    Tensor(_SA + "q_proj.weight", "{layer}/attn/q", "(heads kv) embed"),
    Tensor(_SA + "k_proj.weight", "{layer}/attn/k", "(kv_heads kv) embed", when="kv_layer"),
    Tensor(_SA + "v_proj.weight", "{layer}/attn/v", "(kv_heads kv) embed", when="v_layer"),
    Tensor(_SA + "o_proj.weight", "{layer}/attn/o", "embed (heads kv)"),
    Tensor(_SA + "q_proj.bias", "{layer}/attn/q_bias", "(heads kv)", when="qkv_bias"),
    Tensor(_SA + "k_proj.bias", "{layer}/attn/k_bias", "(kv_heads kv)", when="k_bias_layer"),
    Tensor(_SA + "v_proj.bias", "{layer}/attn/v_bias", "(kv_heads kv)", when="v_bias_layer"),
    Tensor(_SA + "o_proj.bias", "{layer}/attn/o_bias", "embed", when="out_bias"),
    Tensor(_SA + "q_norm.weight", "{layer}/attn/q_norm/scale", "kv"),
    Tensor(_SA + "k_norm.weight", "{layer}/attn/k_norm/scale", "kv", when="kv_layer"),
    Tensor(_L + "post_attention_layernorm.weight", "{layer}/attn_post_norm/scale", "embed"),
    Tensor(_L + "pre_feedforward_layernorm.weight", "{layer}/mlp_norm/scale", "embed"),
    *(r for r in LLAMA if ".mlp." in r.hf and r.when is None),
    Tensor(_L + "post_feedforward_layernorm.weight", "{layer}/mlp_post_norm/scale", "embed"),
    Tensor(_L + "per_layer_input_gate.weight", "{layer}/per_layer/gate", "per_layer embed", when=_PL),
    Tensor(_L + "per_layer_projection.weight", "{layer}/per_layer/up", "embed per_layer", when=_PL),
    Tensor(_L + "post_per_layer_input_norm.weight", "{layer}/per_layer/norm/scale", "embed", when=_PL),
    Tensor(_L + "layer_scalar", "{layer}/layer_scalar", "per_layer_scalar"),
    Tensor("model.norm.weight", "final_norm/scale", "embed"),
    LLAMA[-1],
)
# A Gemma4ForConditionalGeneration checkpoint: the vision and audio towers and their projections (not loaded).
GEMMA4_EXTRA = GEMMA3_EXTRA + (r"^(model\.)?(audio_tower|embed_vision|embed_audio)\.",)

__all__ = ["gemma4", "GEMMA4", "GEMMA4_EXTRA"]
