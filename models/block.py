"""One decoder layer of the reference GPT: attention (full, latent or linear) and an MLP (dense or experts),
with the norms the family places around them.

The layer is the unit :class:`~partitioning.parallel.LayerStack` scans (or pipelines): its options are the
GPT's, resolved once (:mod:`partitioning.models.gpt`); a mixed stack's per-layer flags (local windows, layers
without RoPE) arrive as ``layer`` data.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from partitioning.boxes import with_logical_constraint
from partitioning.models.attention import Attention
from partitioning.models.layers import MlpBlock, make_norm
from partitioning.models.linear_attention import GatedDeltaNet, LinearShape
from partitioning.models.lora import LoRA
from partitioning.models.mla import MLA, MLAShape
from partitioning.models.moe import MoE, MoeMlp
from partitioning.models.per_layer import PerLayerResidual, layer_scalar
from partitioning.models.variants import LOCAL, NOPE, layer_flag, post_norm, pre_norm


class Block(nn.Module):
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    norm: str
    rope_theta: float
    dtype: Any
    param_dtype: Any
    moe: MoE | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    mlp_act: str = "silu"
    mlp_glu: bool = True
    rope: bool = True
    rope_scaling: tuple | None = None
    sliding_window: int | None = None
    attn_scale: float | None = None
    decode: bool = False
    out_in: bool = False
    lora: LoRA | None = None
    norm_placement: str = "pre"
    qk_norm: str | None = None
    attn_softcap: float | None = None
    local_rope: tuple | None = None
    attention: str = "xla"
    context_parallel: str = "ring"
    rotary_dim: int | None = None
    mixed_window: bool = False  # layer_types: the window on the local layers only
    mixed_rope: bool = False  # nope_layers: some layers without RoPE
    attn_sinks: bool = False
    mla: MLAShape | None = None
    attn_gate: bool = False
    linear: LinearShape | None = None  # this layer is a gated-delta-rule linear attention (models/linear_attention.py)
    # Gemma 4 (models/per_layer.py): value norm, values = keys, a per-layer input residual of this width, a scalar.
    v_norm: bool = False
    k_eq_v: bool = False
    per_layer: int | None = None
    layer_scalar: bool = False
    store_kv: bool = False  # return this layer's (keys, values) for the layers that reuse them (num_kv_shared_layers)

    @nn.compact
    def __call__(self, x, segment_ids=None, positions=None, layer=None, per_layer_input=None, shared_kv=None):
        # `layer`: this layer's flags in a mixed stack (LayerStack's layer_data; models/variants.py's LOCAL, NOPE).
        local = layer_flag(layer, LOCAL, self.mixed_window)
        nope = layer_flag(layer, NOPE, self.mixed_rope)
        y = pre_norm(self, x, "attn", make_norm)
        stored = None
        if self.linear is not None:  # Qwen3.5's linear-attention layers
            y = GatedDeltaNet(
                self.linear,
                self.dtype,
                self.param_dtype,
                norm_eps=self.norm_eps,
                decode=self.decode,
                out_in=self.out_in,
                name="attn",
            )(y, segment_ids, positions)
        elif self.mla is not None:  # DeepSeek's multi-head latent attention (models/mla.py)
            y = MLA(
                self.heads,
                self.mla,
                self.rope_theta,
                self.dtype,
                self.param_dtype,
                rope_scaling=self.rope_scaling,
                bias=self.qkv_bias,
                norm_eps=self.norm_eps,
                decode=self.decode,
                out_in=self.out_in,
                name="attn",
            )(y, segment_ids, positions)
        else:
            y = Attention(
                self.heads,
                self.kv_heads,
                self.head_dim,
                self.rope_theta,
                self.dtype,
                self.param_dtype,
                qkv_bias=self.qkv_bias,
                out_bias=self.out_bias,
                rope=self.rope,
                rope_scaling=self.rope_scaling,
                window=self.sliding_window,
                scale=self.attn_scale,
                decode=self.decode,
                impl=self.attention,
                context_parallel=self.context_parallel,
                out_in=self.out_in,
                lora=self.lora,
                qk_norm=self.qk_norm,
                norm=self.norm,
                norm_eps=self.norm_eps,
                softcap=self.attn_softcap,
                local_rope=self.local_rope,
                rotary_dim=self.rotary_dim,
                sinks=self.attn_sinks,
                gate=self.attn_gate,
                v_norm=self.v_norm,
                k_eq_v=self.k_eq_v,
                store_kv=self.store_kv,
                name="attn",
            )(y, segment_ids, positions, local=local, nope=nope, shared_kv=shared_kv)
            if self.store_kv:
                y, stored = y
        x = x + post_norm(self, y, "attn", make_norm)
        y = pre_norm(self, x, "mlp", make_norm)
        if self.moe is not None:
            y = MoeMlp(self.moe, self.mlp, self.dtype, self.param_dtype, name="mlp")(y)
        else:
            y = MlpBlock(
                self.mlp,
                self.dtype,
                self.param_dtype,
                act=self.mlp_act,
                glu=self.mlp_glu,
                bias=self.mlp_bias,
                out_in=self.out_in,
                lora=self.lora,
                name="mlp",
            )(y)
        x = x + post_norm(self, y, "mlp", make_norm)
        if self.per_layer:
            act, eps, oi = self.mlp_act, self.norm_eps, self.out_in
            res = PerLayerResidual(self.per_layer, self.dtype, self.param_dtype, act, eps, oi, name="per_layer")
            x = res(x, per_layer_input)
        if self.layer_scalar:
            x = layer_scalar(self, x)
        x = with_logical_constraint(x, ("batch", "length", "embed"))
        return x, stored


__all__ = ["Block"]
