"""A decoder-only transformer annotated only with logical axis names.

Parameters (logical names in brackets):
  token embedding ``(vocab, embed)``; per block: q ``(embed, heads, kv)``,
  k/v ``(embed, kv_heads, kv)`` (grouped-query when ``kv_heads < heads``),
  o ``(heads, kv, embed)``, MLP ``wi (embed, mlp)`` / ``wo (mlp, embed)``,
  norm scales ``(embed,)``; final norm; untied unembedding ``(embed, vocab)``. With ``moe`` every
  block's MLP is a mixture of experts (:mod:`partitioning.models.moe`): router ``(embed, expert)``,
  experts ``(expert, embed, mlp)``. By default positions are rotary (RoPE), so there are no
  position parameters and no biases: the parameter count of a Llama-3 shape is exact.
With ``scan_layers`` one block is scanned ``layers`` times and every block
parameter gains a leading ``layers`` axis, so compile time stays flat in depth.

Options for the published families (:mod:`partitioning.models.hf` sets them from a
``config.json``; each defaults to the Llama shape above): ``tie_embeddings`` (logits from the
token embedding), ``qkv_bias`` / ``out_bias`` / ``mlp_bias`` (biases named by the dimensions
they live on: ``q_bias (heads, kv)``, ``k_bias`` / ``v_bias (kv_heads, kv)``, ``o_bias`` /
``wo_bias (embed,)``, ``wi*_bias (mlp,)``), ``norm`` (``rms`` | ``rms_offset`` (Gemma's
``1 + w``) | ``layer``), ``norm_eps``, ``embed_scale`` (``x * sqrt(embed)`` in the compute
dtype), ``mlp_act`` / ``mlp_glu`` (SwiGLU, GeGLU or GPT-2's plain gelu MLP), ``positions``
(``rope`` | ``learned``: a ``pos_embedding (positions, embed)`` table of ``max_positions``
rows), ``rope_scaling`` (``llama3`` / ``linear``), ``sliding_window``, ``attn_scale``,
``kernel_order`` (``out_in``: projection weights stored outputs first, ``q (heads, kv, embed)``,
``wo (embed, mlp)``, ``unembed (vocab, embed)``, as torch's ``Linear`` stores them, so a Hugging
Face checkpoint loads without transposes). The newer families' options (:mod:`partitioning.models.variants`):
``qk_norm`` (``head``: ``q_norm`` / ``k_norm`` scales ``(kv,)``; ``all``: ``(heads, kv)`` / ``(kv_heads, kv)``),
``norm_placement`` (``pre`` | ``pre_post`` | ``post``: ``attn_post_norm`` / ``mlp_post_norm``),
``attn_softcap`` / ``final_softcap``, ``layer_types`` (local sliding-window layers beside global ones,
carried through the layer scan as data) with ``local_rope_theta`` / ``local_rope_scaling``. Gemma 4's
(:mod:`partitioning.models.per_layer`): ``global_head_dim`` / ``global_kv_heads`` / ``global_k_eq_v`` (the
global layers' own sizes, values from the keys), ``v_norm``, ``per_layer_input`` / ``per_layer_vocab``
(per-layer inputs: ``ple/per_layer_embedding (vocab, per_layer_layers, per_layer)``, ``ple/per_layer_proj``,
each block's ``per_layer/gate`` / ``per_layer/up``), ``layer_scalar``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from partitioning.boxes import param_for_compute, with_logical_constraint, with_logical_partitioning
from partitioning.decode.cache import position_offset
from partitioning.errors import ConfigError
from partitioning.model.registry import register_model
from partitioning.models.attention import packed_args, parse_rope_scaling, rope
from partitioning.models.block import Block
from partitioning.models.checks import choice, divides, float_dtype, positive
from partitioning.models.fused_attention import check_attention, resolve_attention
from partitioning.models.layers import ACTIVATIONS, NORMS, embed_lookup, kernel, make_norm, order
from partitioning.models.linear_attention import LinearShape, check_linear_layers
from partitioning.models.lora import LoRA, adapt, checks_targets, for_call
from partitioning.models.mla import MLAShape
from partitioning.models.moe import MoE, check_moe_layers
from partitioning.models.per_layer import PerLayerInputs, check_per_layer, kv_sharing, layer_shape, per_layer_kwargs
from partitioning.models.variants import (
    NORM_PLACEMENTS,
    QK_NORMS,
    check_layer_types,
    check_nope_layers,
    layer_flags,
    softcap,
    variant_options,
)
from partitioning.parallel.context import balance, balances, check_strategy, context_axes, resolve_strategy, whole_rows
from partitioning.parallel.pipeline import LayerStack


def rotary_dim(head_dim: int, fraction: float) -> int | None:
    """The features RoPE rotates: ``int(head_dim * fraction)`` as transformers computes it (None: all)."""
    return None if fraction >= 1 else int(head_dim * fraction)


REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "offload": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),  # docs/scaling.md
}


@register_model("gpt")
class GPT(nn.Module):
    """Decoder-only transformer; tokens ``(batch, length)`` -> logits ``(batch, length, vocab)``."""

    vocab_size: int = 256
    embed: int = 128
    heads: int = 4
    kv_heads: int | None = None  # None: = heads (multi-head); fewer: grouped-query
    head_dim: int | None = None  # None: embed // heads
    mlp: int = 512
    layers: int = 4
    rope_theta: float = 10000.0
    norm: str = "rms"  # rms | layer | rms_offset
    scan_layers: bool = True
    remat: str = "none"  # none | full | dots | dots_no_batch | offload
    dtype: str = "float32"  # compute dtype, e.g. bfloat16
    param_dtype: str = "float32"
    moe: Any = None  # {experts, top_k, capacity_factor | dropless, aux_loss_weight}: MoE MLPs
    norm_eps: float = 1e-6
    tie_embeddings: bool = False  # logits from the token embedding (no unembed)
    qkv_bias: bool = False
    out_bias: bool = False  # attention output projection bias
    mlp_bias: bool = False
    mlp_act: str = "silu"  # silu | gelu_tanh | gelu | relu
    mlp_glu: bool = True  # gated MLP (SwiGLU / GeGLU); False: act(x wi) wo
    embed_scale: bool = False  # multiply the embeddings by sqrt(embed) (Gemma)
    positions: str = "rope"  # rope | learned
    max_positions: int | None = None  # rows of the learned position table
    rope_scaling: Any = None  # {rope_type: llama3 | linear, factor, ...}
    sliding_window: int | None = None  # query i sees keys i - w < j <= i
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attention: str = "xla"  # xla (einsums) | cudnn (jax.nn.dot_product_attention's flash kernel) | auto
    # With `length` split by the rules (a `context` axis): ring | all_gather | auto (partitioning.parallel.context)
    context_parallel: str = "auto"
    decode: bool = False  # KV cache in the `cache` collection, for generation (partitioning.decode.generate)
    kernel_order: str = "in_out"  # in_out | out_in: projection weights stored outputs first (torch's Linear)
    lora: Any = None  # {rank, alpha, targets, dropout, rslora, dtype}: LoRA adapters (partitioning.models.lora)
    moe_layers: tuple[int, ...] | None = None  # with moe: the layers whose MLP is MoE (None: all); see models/moe.py
    # The newer families (models/variants.py):
    qk_norm: str | None = None  # head (Qwen3, Gemma 3) | all (OLMo-2): RMSNorm of q and k before RoPE
    norm_placement: str = "pre"  # pre | pre_post (Gemma 2/3) | post (OLMo-2)
    attn_softcap: float | None = None  # cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # the same on the logits
    layer_types: Any = None  # per layer full_attention | sliding_attention: sliding_window on the sliding ones
    local_rope_theta: float | None = None  # RoPE base of the sliding layers (default: rope_theta)
    local_rope_scaling: Any = None  # their rope_scaling (with local_rope_theta; default: none)
    partial_rotary_factor: float = 1.0  # RoPE on the first fraction of each head's features (Phi-4-mini: 0.75)
    nope_layers: tuple[int, ...] | None = None  # layers without RoPE (SmolLM3's NoPE layers)
    attn_sinks: bool = False  # a learned logit per head in every attention softmax (GPT-OSS): `sinks (heads,)`
    mla: Any = None  # {q_lora_rank, kv_lora_rank, qk_rope_head_dim, ...}: multi-head latent attention (models/mla.py)
    attn_gate: bool = False  # the attention's output gated by sigmoid(x W_q_gate) (Qwen3.5, Qwen3-Next)
    linear_attn: Any = None  # {key_heads, value_heads, key_dim, value_dim, conv_kernel, chunk}: gated delta rule
    linear_layers: tuple[int, ...] | None = None  # the layers that are linear attention (needs scan_layers: false)
    # Gemma 4 (models/per_layer.py; the per-layer sizes need scan_layers: false): the full_attention layers' own
    # head size, kv heads and values-are-keys; values RMS-normed; per-layer inputs of this width; a layer scalar.
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    global_k_eq_v: bool = False
    v_norm: bool = False
    per_layer_input: int | None = None
    per_layer_vocab: int | None = None  # rows of the per-layer input table (None: vocab_size)
    layer_scalar: bool = False
    kv_shared_layers: int = 0  # the last n layers reuse the keys and values of the last earlier layer of their type
    shared_wide_mlp: bool = False  # ... and their MLP is twice as wide (use_double_wide_mlp)

    def __post_init__(self):
        positive(self, "vocab_size", "embed", "heads", "kv_heads", "head_dim", "mlp", "layers")
        positive(self, "max_positions", "sliding_window")
        divides(self, "kv_heads", "heads")
        if self.head_dim is None:
            divides(self, "heads", "embed")
        head_dim = self.head_dim or self.embed // self.heads
        choice(self, "positions", ("rope", "learned"))
        if head_dim % 2 and self.positions == "rope":
            # RoPE rotates pairs of features; an odd head size fails deep inside attention.
            arg = "head_dim" if self.head_dim else "embed"
            how = (
                f"head_dim {head_dim}" if self.head_dim else f"embed / heads = {self.embed} / {self.heads} = {head_dim}"
            )
            raise ConfigError(f"{how} must be even: rotary position embeddings rotate pairs of features", arg=arg)
        if self.positions == "learned" and self.max_positions is None:
            raise ConfigError(
                "positions: learned needs max_positions (rows of the position table)", arg="max_positions"
            )
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.rope_theta!r}", arg="rope_theta")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps!r}", arg="norm_eps")
        choice(self, "norm", NORMS)
        choice(self, "mlp_act", ACTIVATIONS)
        choice(self, "remat", REMAT_POLICIES)
        choice(self, "kernel_order", ("in_out", "out_in"))
        choice(self, "norm_placement", NORM_PLACEMENTS)
        if self.qk_norm is not None:
            choice(self, "qk_norm", QK_NORMS)
        check_layer_types(self)
        check_nope_layers(self)
        MLAShape.parse(self.mla)
        check_per_layer(self)
        check_linear_layers(self.linear_layers, LinearShape.parse(self.linear_attn), self.layers, self.scan_layers)
        if not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError(
                f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}",
                arg="partial_rotary_factor",
            )
        rd = rotary_dim(head_dim, self.partial_rotary_factor)
        if rd is not None and (rd < 2 or rd % 2):
            raise ConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} rotates {rd} of head_dim {head_dim} features; "
                "RoPE needs an even number",
                arg="partial_rotary_factor",
            )
        parse_rope_scaling(self.local_rope_scaling)
        check_attention(self.attention, self.dtype)
        check_strategy(self.context_parallel)
        float_dtype(self, "dtype", "param_dtype")
        MoE.parse(self.moe)  # a bad `moe:` option fails at construction, naming `moe`
        check_moe_layers(self.moe_layers, self.layers, self.scan_layers)
        parse_rope_scaling(self.rope_scaling)
        LoRA.parse(self.lora)
        super().__post_init__()

    @nn.compact
    @checks_targets
    def __call__(self, tokens, deterministic: bool = True, segment_ids=None, positions=None):
        dt, pd = jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)
        kv_heads = self.kv_heads or self.heads
        head_dim = self.head_dim or self.embed // self.heads
        emb = param_for_compute(
            self.param(
                "embedding",
                with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
                (self.vocab_size, self.embed),
                pd,
            ),
            ("vocab", "embed"),
        )
        packed = packed_args(self, segment_ids, positions)  # () unless packed rows: (segment_ids, positions)
        x = embed_lookup(emb, tokens).astype(dt)
        if self.embed_scale:
            x = x * jnp.asarray(self.embed**0.5, dt)  # rounded to the compute dtype first, as transformers does
        if self.positions == "learned":
            t = tokens.shape[1]
            if t > self.max_positions:
                raise ConfigError(
                    f"sequence length {t} is longer than the {self.max_positions} learned positions",
                    arg="max_positions",
                )
            names = ("positions", "embed")
            init = with_logical_partitioning(nn.initializers.normal(0.02), names)
            pos = param_for_compute(self.param("pos_embedding", init, (self.max_positions, self.embed), pd), names)
            start = position_offset(self, t) if self.decode else 0
            if not packed:
                x = x + jax.lax.dynamic_slice_in_dim(pos, start, t).astype(dt)[None]
            else:  # packed rows: each example's positions restart at 0
                x = x + jnp.take(pos, packed[1], axis=0).astype(dt)
        ple = None
        if self.per_layer_input:  # Gemma 4: from the scaled embeddings, before any position table
            vocab, oi = self.per_layer_vocab or self.vocab_size, self.kernel_order == "out_in"
            inputs = PerLayerInputs(vocab, self.layers, self.per_layer_input, dt, pd, self.norm_eps, oi, name="ple")
            ple = inputs(tokens, x)
        x = with_logical_constraint(x, ("batch", "length", "embed"))
        # `length` split by the rules: attention reads positions (any order), and where the length allows, each
        # device holds chunks i and 2C - 1 - i of the sequence, so causal attention gives every device equal work.
        split = () if self.decode else context_axes()
        # Latent (MLA) and linear attention read the sequence in order: they keep it (XLA gathers what they need).
        ordered = self.mla is not None or bool(self.linear_layers)
        balanced = bool(split) and not ordered and balances(tokens.shape[1], split)
        if split:
            packed = packed or whole_rows(tokens.shape)
        if balanced:
            x, packed = balance(x, split), tuple(balance(a, split) for a in packed)
            ple = None if ple is None else balance(ple, split)

        block = Block
        if self.remat != "none":
            block = nn.remat(Block, policy=REMAT_POLICIES[self.remat], prevent_cse=not self.scan_layers)
        kw: dict[str, Any] = dict(
            heads=self.heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            mlp=self.mlp,
            norm=self.norm,
            rope_theta=self.rope_theta,
            dtype=dt,
            param_dtype=pd,
            moe=MoE.parse(self.moe),
            norm_eps=self.norm_eps,
            qkv_bias=self.qkv_bias,
            out_bias=self.out_bias,
            mlp_bias=self.mlp_bias,
            mlp_act=self.mlp_act,
            mlp_glu=self.mlp_glu,
            rope=self.positions == "rope",
            rope_scaling=parse_rope_scaling(self.rope_scaling),
            sliding_window=self.sliding_window,
            attn_scale=self.attn_scale,
            decode=self.decode,
            attention=resolve_attention(self.attention, self.dtype),
            context_parallel=resolve_strategy(self.context_parallel, tokens.shape[1], split),
            out_in=self.kernel_order == "out_in",
            lora=for_call(self.lora, deterministic),
            rotary_dim=rotary_dim(head_dim, self.partial_rotary_factor),
            mla=MLAShape.parse(self.mla),
            attn_gate=self.attn_gate,
            v_norm=self.v_norm,
            per_layer=self.per_layer_input,
            layer_scalar=self.layer_scalar,
            **variant_options(self, parse_rope_scaling),
        )
        flags = layer_flags(self.layer_types, self.nope_layers, self.layers)
        if self.scan_layers:
            # nn.scan over a `layers` axis; a GPipe pipeline when the mesh has a `stage` axis.
            x, _ = LayerStack(block, self.layers, kw, name="blocks", layer_data=flags)(x, *packed)
        else:
            linear = LinearShape.parse(self.linear_attn)
            modes = kv_sharing(self.layer_types, self.layers, self.kv_shared_layers)
            shared: dict[str, Any] = {}  # layer type -> the (keys, values) its shared layers reuse
            for i in range(self.layers):
                moe = kw["moe"] if self.moe_layers is None or i in self.moe_layers else None
                layer = {"layer": flags[i]} if flags else {}
                lin = linear if self.linear_layers and i in self.linear_layers else None
                layer.update(per_layer_kwargs(ple, i, shared, self.layer_types, modes))
                own = layer_shape(self, i, head_dim, kv_heads, modes)  # Gemma 4's global and shared layers
                if own:
                    own["rotary_dim"] = rotary_dim(own.get("head_dim", head_dim), self.partial_rotary_factor)
                x, kv = block(**{**kw, "moe": moe, "linear": lin, **own}, name=f"block_{i}")(x, *packed, **layer)
                if kv is not None:
                    shared[self.layer_types[i]] = kv
        if balanced:
            x = balance(x, split, inverse=True)
        x = make_norm(self.norm, dt, pd, "final_norm", self.norm_eps)(x)
        if self.tie_embeddings:
            logits = jnp.einsum("btd,vd->btv", x, emb.astype(dt)).astype(jnp.float32)
        else:
            oi = self.kernel_order == "out_in"
            # The head stays in the param dtype under a quantized base (as bitsandbytes' QLoRA leaves lm_head).
            head = (("vocab", self.vocab_size),)
            w = kernel(self, "unembed", (("embed", self.embed),), head, pd, self.embed, oi, quantizable=False)
            eq, ins, outs = f"btd,{order(oi, 'd', 'v')}->btv", (("embed", self.embed),), (("vocab", self.vocab_size),)
            logits = adapt(self, "unembed", jnp.einsum(eq, x, w.astype(dt)), x, eq, kw["lora"], ins, outs, oi)
            logits = logits.astype(jnp.float32)
        logits = softcap(logits, self.final_softcap)
        return with_logical_constraint(logits, ("batch", "length", "vocab"))


__all__ = ["GPT", "Block", "REMAT_POLICIES", "rope"]
