"""What every ``config.json`` reader shares: activations, RoPE settings in both dialects, the Llama-shaped options.

Example::

    >>> from partitioning.models.hf.fields import rope_options
    >>> rope_options({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    {'rope_theta': 500000.0, 'rope_scaling': {'rope_type': 'linear', 'factor': 2.0}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.attention import parse_rope_scaling

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


def _act(cfg: Mapping[str, Any], key: str, default: str) -> str:
    name = cfg.get(key) or default
    if name not in ACTS:
        raise ConfigError(f"{key} {name!r} is not supported; supported: {', '.join(ACTS)}", arg=key)
    return ACTS[name]


def _rope(cfg: Mapping[str, Any], partial: bool = False) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` from either dialect (and ``partial_rotary_factor`` where the family
    has partial rotary: ``partial``)."""
    key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    rp = dict(cfg.get(key) or {})
    layer_types = set(cfg.get("layer_types") or ())
    if layer_types & set(rp):
        raise ConfigError(
            f"{key} per layer type ({', '.join(sorted(layer_types & set(rp)))}) is not supported", arg=key
        )
    fraction = rp.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 1.0
    if fraction not in (1, 1.0) and not partial:
        raise ConfigError(
            f"partial_rotary_factor {fraction} is not supported (only 1.0: rotate every feature)", arg=key
        )
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = rp.get("rope_type", rp.get("type", "default"))
    original = cfg.get("original_max_position_embeddings")
    if kind == "llama3":
        rp.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    elif kind in ("yarn", "longrope"):
        rp.setdefault("original_max_position_embeddings", original or cfg.get("max_position_embeddings"))
        rp.setdefault("max_position_embeddings", cfg.get("max_position_embeddings"))
    try:
        scaling = parse_rope_scaling(None if kind == "default" else {**rp, "rope_type": kind})
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}", arg=key) from e
    out = {"rope_theta": theta, "rope_scaling": _plain(scaling)}
    if partial:
        out["partial_rotary_factor"] = float(fraction)
    return out


def _plain(scaling: tuple | None) -> dict[str, Any] | None:
    """A parsed scaling as the plain mapping a GPT option holds (LongRoPE's factor tuples as lists)."""
    if not scaling:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in scaling}


def _decoder(cfg: Mapping[str, Any], defaults: Mapping[str, Any], partial: bool = False) -> dict[str, Any]:
    """The options every Llama-shaped family shares (``partial``: the family has partial rotary)."""

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
        **_rope(cfg, partial),
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


# Public names for the other reader modules (the underscored ones stay for existing imports).
rope_options, decoder_options, LLAMA_DEFAULTS = _rope, _decoder, _LLAMA_DEFAULTS

__all__ = ["ACTS", "rope_options", "decoder_options", "LLAMA_DEFAULTS"]
