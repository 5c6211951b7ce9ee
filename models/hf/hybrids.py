"""``config.json`` readers of the hybrid families: Qwen3.5, linear-attention layers between full-attention ones.

Example::

    >>> from partitioning.models.hf.hybrids import qwen3_5
    >>> opts = qwen3_5({"num_hidden_layers": 8})
    >>> opts["linear_layers"], opts["partial_rotary_factor"], opts["attn_gate"]
    ((0, 1, 2, 4, 5, 6), 0.25, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.hf.fields import _LLAMA_DEFAULTS, _decoder
from partitioning.models.hf.gemmas import text_config

_QWEN3_5_DEFAULTS: dict[str, Any] = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
}


def qwen3_5(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3.5: gated delta rule linear-attention layers (`linear_*` sizes, a causal convolution) between
    full-attention ones (`layer_types`; by default every 4th full), the full layers' output gated and RoPE partial
    (0.25), `(1 + w)` norms, per-head q/k norms; a `Qwen3_5ForConditionalGeneration` loads its text tower only (the
    vision tower and the multi-token-prediction head are not loaded)."""
    cfg = text_config(cfg)
    rp = dict(cfg.get("rope_parameters") or {})
    if rp:
        rp.setdefault("rope_theta", 10000000.0)
        rp.setdefault("partial_rotary_factor", 0.25)
        for key in ("mrope_section", "mrope_interleaved"):  # text positions: every section the same
            rp.pop(key, None)
        cfg = {**cfg, "rope_parameters": rp}
    else:
        cfg = {**cfg, "rope_theta": cfg.get("rope_theta", 10000000.0)}
        cfg.setdefault("partial_rotary_factor", 0.25)
    bias = bool(cfg.get("attention_bias", False))
    out = _decoder({**cfg, "layer_types": None}, _QWEN3_5_DEFAULTS, partial=True)
    out.update(norm="rms_offset", qk_norm="head", attn_gate=True, qkv_bias=bias, out_bias=bias)
    n = out["layers"]
    interval = int(cfg.get("full_attention_interval") or 4)
    types = cfg.get("layer_types") or ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in ("linear_attention", "full_attention") for t in types):
        raise ConfigError(
            f"layer_types must list linear_attention or full_attention for each of the {n} layers", arg="layer_types"
        )

    def get(key: str, default: int) -> int:
        v = cfg.get(key)
        return default if v is None else int(v)

    out["linear_attn"] = dict(
        key_heads=get("linear_num_key_heads", 16),
        value_heads=get("linear_num_value_heads", 32),
        key_dim=get("linear_key_head_dim", 128),
        value_dim=get("linear_value_head_dim", 128),
        conv_kernel=get("linear_conv_kernel_dim", 4),
    )
    out["linear_layers"] = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    return out


__all__ = ["qwen3_5"]
