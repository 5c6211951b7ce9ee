"""``HFDecoder``: the GPT decoder built from a ``config.json``, carrying that config for ``save_hf``.

:func:`build` reads a ``config.json`` dict through its family
(:mod:`partitioning.models.hf.families`); :func:`export_config` is the
``config.json`` a model is saved with: the original dict for an
``HFDecoder``, or a Llama (Mistral, with a sliding window) config written in
the dialect both transformers 4.x and 5.x read for a plain ``GPT`` of that
shape, so a model trained from scratch can be exported too.

Example::

    >>> from partitioning.models import GPT
    >>> from partitioning.models.hf.model import build, export_config
    >>> model = build({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
    ...                "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256})
    >>> model.family, model.heads
    ('llama', 4)
    >>> export_config(GPT(layers=2))["architectures"], export_config(GPT(layers=2))["num_hidden_layers"]
    (['LlamaForCausalLM'], 2)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from partitioning.errors import ConfigError
from partitioning.models.attention import parse_rope_scaling
from partitioning.models.gpt import GPT
from partitioning.models.hf.families import Family, family_of, text_config


class HFDecoder(GPT):
    """A :class:`~partitioning.models.gpt.GPT` whose options come from ``hf_config`` (``config.json`` text)."""

    hf_config: str = "{}"

    @property
    def config(self) -> dict[str, Any]:
        return json.loads(self.hf_config)

    @property
    def family(self) -> str:
        return family_of(self.config).name

    @property
    def experts(self) -> int:
        """Experts per MoE layer (0: a dense model): the name map's ``{e}``."""
        return int(self.moe["experts"]) if self.moe else 0

    # Multi-head latent attention's sizes, for the name map (DeepSeek-V3: `when` and `split`).
    @property
    def q_lora_rank(self) -> int | None:
        return self.mla["q_lora_rank"] if self.mla else None

    @property
    def kv_lora_rank(self) -> int:
        return int(self.mla["kv_lora_rank"]) if self.mla else 0

    @property
    def qk_rope_head_dim(self) -> int:
        return int(self.mla["qk_rope_head_dim"]) if self.mla else 0

    @property
    def shared_expert(self) -> bool:
        return bool(self.moe and self.moe.get("shared_mlp"))

    def linear_layer(self, i: int) -> bool:
        """Whether layer ``i`` is a linear-attention layer (Qwen3.5; the name map's ``when="linear_layer"``)."""
        return self.linear_layers is not None and i in self.linear_layers

    def kv_layer(self, i: int) -> bool:
        """Whether layer ``i`` has key (and value) projections: not one of Gemma 4's last layers reusing shared ones."""
        return i < self.layers - self.kv_shared_layers

    def v_layer(self, i: int) -> bool:
        """Whether layer ``i`` has a value projection (not a Gemma 4 global layer whose values are its keys)."""
        glob = self.global_k_eq_v and self.layer_types is not None and self.layer_types[i] == "full_attention"
        return self.kv_layer(i) and not glob

    def k_bias_layer(self, i: int) -> bool:
        """Whether layer ``i`` has a key bias (``attention_bias`` on a layer with keys of its own)."""
        return self.qkv_bias and self.kv_layer(i)

    def v_bias_layer(self, i: int) -> bool:
        """Whether layer ``i`` has a value bias (``attention_bias`` on a layer with a value projection)."""
        return self.qkv_bias and self.v_layer(i)

    def moe_layer(self, i: int) -> bool:
        """Whether layer ``i``'s MLP is a mixture of experts (the name map's ``when="moe_layer"``)."""
        return self.moe is not None and (self.moe_layers is None or i in self.moe_layers)


def build(
    cfg: Mapping[str, Any],
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    scan_layers: bool = True,
    remat: str = "none",
    lora: Any = None,
    capacity_factor: float | None = None,
    attention: str = "xla",
    context_parallel: str = "auto",
) -> HFDecoder:
    """The decoder a ``config.json`` describes (float32 unless ``dtype`` / ``param_dtype`` say otherwise);
    ``lora``: LoRA adapters (:mod:`partitioning.models.lora`).

    A mixture of experts routes dropless; ``capacity_factor`` caps each expert's tokens per sequence.
    """
    opts = family_of(cfg).options(cfg)
    if capacity_factor is not None:
        if not opts.get("moe"):
            raise ConfigError(
                "capacity_factor applies to mixture-of-experts checkpoints (Mixtral, Qwen3-MoE) only; "
                f"this one is a dense {family_of(cfg).name}",
                arg="capacity_factor",
            )
        opts["moe"] = {**opts["moe"], "dropless": False, "capacity_factor": float(capacity_factor)}
    if opts.get("moe_layers") is not None or opts.get("linear_layers") or opts.get("global_head_dim"):
        # Dense layers between sparse ones, Gemma 4's global layers of their own size: a scanned stack repeats
        # one block (docs/pipeline-experts.md).
        scan_layers = False
    return HFDecoder(
        **opts,
        scan_layers=scan_layers,
        remat=remat,
        lora=lora,
        attention=attention,
        context_parallel=context_parallel,
        dtype=dtype or "float32",
        param_dtype=param_dtype or "float32",
        hf_config=json.dumps(dict(cfg)),
    )


def family_for(model: Any) -> Family:
    """The family of a model :func:`export_config` accepts."""
    return family_of(export_config(model))


def export_config(model: Any) -> dict[str, Any]:
    """The ``config.json`` dict to save ``model`` with (see the module docstring); ConfigError if none fits."""
    if isinstance(model, HFDecoder):
        own = model.config
        if own.get("text_config") is not None and family_of(own).name == "gemma3":
            # A multimodal checkpoint's text tower (the only part loaded) is saved as the text model it is.
            return {**text_config(own), "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}
        if own.get("text_config") is not None and family_of(own).name == "gemma4":
            return {**text_config(own), "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"}
        if own.get("text_config") is not None and family_of(own).name == "qwen3_5":
            return {**text_config(own), "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text"}
        return own
    if not isinstance(model, GPT):
        raise ConfigError(f"save_hf needs a model built by hf_model / load_hf or a GPT, got {type(model).__name__}")
    unsupported = {
        "moe": model.moe is not None,
        "norm": model.norm != "rms",
        "positions": model.positions != "rope",
        "mlp_glu": not model.mlp_glu,
        "mlp_act": model.mlp_act != "silu",
        "embed_scale": model.embed_scale,
        "attn_scale": model.attn_scale is not None,
        "out_bias": model.out_bias != model.qkv_bias,
        "qk_norm": model.qk_norm is not None,
        "norm_placement": model.norm_placement != "pre",
        "attn_softcap": model.attn_softcap is not None,
        "final_softcap": model.final_softcap is not None,
        "layer_types": model.layer_types is not None,
        "v_norm": model.v_norm,
        "per_layer_input": model.per_layer_input is not None,
        "layer_scalar": model.layer_scalar,
        "kv_shared_layers": model.kv_shared_layers > 0,
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad or (model.sliding_window and (model.qkv_bias or model.mlp_bias)):
        raise ConfigError(
            f"a GPT with {', '.join(bad) or 'sliding_window and biases'} has no Hugging Face architecture to export to "
            "(plain GPTs export as LlamaForCausalLM, with sliding_window as MistralForCausalLM)",
            arg=(bad or ["sliding_window"])[0],
        )
    scaling = parse_rope_scaling(model.rope_scaling)
    arch, kind = ("MistralForCausalLM", "mistral") if model.sliding_window else ("LlamaForCausalLM", "llama")
    cfg: dict[str, Any] = {
        "architectures": [arch],
        "model_type": kind,
        "vocab_size": model.vocab_size,
        "hidden_size": model.embed,
        "intermediate_size": model.mlp,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.kv_heads or model.heads,
        "head_dim": model.head_dim or model.embed // model.heads,
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_eps,
        "tie_word_embeddings": model.tie_embeddings,
        "max_position_embeddings": 2048,
        # transformers 4.x's keys: 5.x reads them too (4.x ignores rope_parameters).
        "rope_theta": model.rope_theta,
        "rope_scaling": dict(scaling) if scaling else None,
        "torch_dtype": str(model.param_dtype),
    }
    if kind == "llama":
        cfg.update(attention_bias=model.qkv_bias, mlp_bias=model.mlp_bias)
    else:
        cfg["sliding_window"] = model.sliding_window
    return cfg


__all__ = ["HFDecoder", "build", "export_config", "family_for"]
