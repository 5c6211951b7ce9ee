"""Golden fixtures for `partitioning.hf.load_hf`: tiny random checkpoints made by `transformers` itself.

Run it with a Python that has torch, transformers, safetensors and tokenizers (NOT the project's
dependencies; a separate venv)::

    python3 -m venv /work/hfref && /work/hfref/bin/pip install torch transformers safetensors tokenizers
    /work/hfref/bin/python tools/make_hf_fixtures.py            # writes tests/fixtures/hf/<name>/
    /work/hfref/bin/python tools/make_hf_fixtures.py --check OUT_DIR --expect tests/fixtures/hf/llama

Each fixture directory holds what `save_pretrained` wrote (config.json, model.safetensors or
shards + index), a tiny byte-level BPE `tokenizer.json` + `tokenizer_config.json` with the
family's BOS/EOS, `tokens.npy` (fixed int32 tokens, longer than every sliding window) and
`logits.npy` (transformers' float32 logits on them, eager attention) and, for the newer families,
`greedy.npy` (transformers' greedy continuation of the first tokens). Weights are random with a
larger spread than `initializer_range` so the logits are far from uniform and a wrong transpose,
norm or scale shows. `--check` loads a directory (e.g. one `save_hf` wrote) with `transformers`
and compares its logits on the expected fixture's tokens; exit 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"
VOCAB = 320
TOKENS_SHAPE = (2, 16)

# name -> (config class, config kwargs, tokenizer family, save options)
FIXTURES: dict[str, tuple[str, dict, str, dict]] = {
    # GQA, untied, Llama 3.1 rope scaling, a large rope_theta.
    "llama": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            ),
        ),
        "llama",
        {},
    ),
    # Tied embeddings, multi-head, linear rope scaling, attention and MLP biases.
    "llama_tied": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
        ),
        "llama",
        {},
    ),
    # Sliding window (5) smaller than the test sequence (16), GQA.
    "mistral": (
        "MistralConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=64,
            sliding_window=5,
            tie_word_embeddings=False,
        ),
        "llama",
        {},
    ),
    # q/k/v biases (no o bias), tied embeddings as in Qwen2-0.5B.
    "qwen2": (
        "Qwen2Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        "qwen2",
        {},
    ),
    # head_dim (12) != hidden / heads (8), multi-query, GeGLU, (1 + w) norms, sqrt(d) embedding scale.
    "gemma": (
        "GemmaConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=12,
            max_position_embeddings=64,
            hidden_act="gelu_pytorch_tanh",
        ),
        "gemma",
        {},
    ),
    # Learned positions, LayerNorm, fused Conv1D c_attn, gelu_new, tied.
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=None), "gpt2", {}),
    # bf16 and fp16 on disk; logits of the float32 model with those rounded weights.
    "llama_bf16": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        "llama",
        {"dtype": torch.bfloat16},
    ),
    "qwen2_fp16": (
        "Qwen2Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "qwen2",
        {"dtype": torch.float16},
    ),
    # Sharded: several model-0000k-of-0000n.safetensors files + model.safetensors.index.json.
    "llama_sharded": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "llama",
        {"max_shard_size": "40KB"},
    ),
    # Issue 27's dense families.
    # Per-head q/k norms, head_dim (16) != hidden / heads (8), GQA, untied.
    "qwen3": (
        "Qwen3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        "qwen2",
        {},
    ),
    # Soft-capped scores and logits (caps small enough to bite), local/global layers with a window (5)
    # shorter than the sequence, four norms a block, query_pre_attn_scalar != head_dim.
    "gemma2": (
        "Gemma2Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=64,
            sliding_window=5,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=2.5,
        ),
        "gemma",
        {},
    ),
    # A 3-layer pattern over 4 layers (sliding, sliding, full, sliding: no whole number of groups),
    # per-head (1 + w) q/k norms, linear-scaled global RoPE and a local RoPE of its own base.
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=64,
            sliding_window=5,
            sliding_window_pattern=3,
            query_pre_attn_scalar=16,
            rope_parameters=dict(
                full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                sliding_attention=dict(rope_type="default", rope_theta=100.0),
            ),
        ),
        "gemma",
        {},
    ),
    # The text tower of a multimodal checkpoint (model.language_model.* beside a tiny vision tower).
    "gemma3_mm": (
        "Gemma3Config",
        dict(
            text_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=64,
                sliding_window=5,
                sliding_window_pattern=2,
            ),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=32,
                patch_size=16,
            ),
            mm_tokens_per_image=4,
            boi_token_index=VOCAB - 3,
            eoi_token_index=VOCAB - 2,
            image_token_index=VOCAB - 1,
        ),
        "gemma",
        {},
    ),
    # Fused qkv_proj and gate_up_proj, a sliding window on every layer.
    "phi3": (
        "Phi3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
            original_max_position_embeddings=64,
            sliding_window=5,
            tie_word_embeddings=False,
            pad_token_id=0,
        ),
        "llama",
        {},
    ),
    # Norms after attention and MLP only, q/k norms over the whole projection, GQA.
    "olmo2": (
        "Olmo2Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        ),
        "gpt2",
        {},
    ),
    # --- mixture-of-experts families (helper moe): 4 experts, top-2, per-expert tensors on disk ---
    # Mixtral: softmax router, top-2, gates renormalised; GQA.
    "mixtral": (
        "MixtralConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "llama",
        {},
    ),
    # Qwen3-MoE, every layer sparse (scans): q/k norm, head_dim 16 != 32 / 4, experts 24 wide, norm_topk_prob.
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "qwen2",
        {},
    ),
    # Qwen3-MoE with a dense layer (1, intermediate_size 64) between sparse ones, gates not renormalised.
    "qwen3_moe_mixed": (
        "Qwen3MoeConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=24,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            mlp_only_layers=[1],
            max_position_embeddings=64,
            tie_word_embeddings=True,
        ),
        "qwen2",
        {},
    ),
    # The same Mixtral as transformers 5 holds it in memory (save_original_format=False): experts fused
    # in one gate_up_proj (experts, 2 mlp, embed) and one down_proj per layer, router `mlp.gate`.
    "mixtral_fused": (
        "MixtralConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "llama",
        {"save_original_format": False},
    ),
    # --- issue 37's dense families ---
    # Phi-4: fused qkv_proj split [heads*d, kv*d, kv*d] with fewer kv heads (2) than heads (4).
    "phi4": (
        "Phi3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            original_max_position_embeddings=64,
            tie_word_embeddings=False,
            pad_token_id=0,
            rope_parameters=dict(rope_type="default", rope_theta=250000.0),
        ),
        "llama",
        {},
    ),
    # Phi-4-mini: GQA, partial rotary (0.75 of head_dim 8: 6 features) and LongRoPE whose original length (8)
    # the test sequence (16) passes: the long factors and the attention factor bite.
    "phi4_mini": (
        "Phi3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            original_max_position_embeddings=8,
            tie_word_embeddings=True,
            pad_token_id=0,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                partial_rotary_factor=0.75,
                short_factor=[1.0, 1.5, 2.0],
                long_factor=[1.0, 4.0, 16.0],
                original_max_position_embeddings=8,
            ),
        ),
        "llama",
        {},
    ),
    # OLMo-3: OLMo-2's block, sliding (window 5) and full layers mixed (3 of 4 sliding), YaRN on the full layers.
    "olmo3": (
        "Olmo3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            sliding_window=5,
            rope_parameters=dict(
                full_attention=dict(
                    rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8
                ),
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            ),
        ),
        "gpt2",
        {},
    ),
    # SmolLM3: NoPE on every 2nd layer (1, 3), those layers sliding (window 5), GQA, tied embeddings.
    "smollm3": (
        "SmolLM3Config",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            no_rope_layer_interval=2,
            pad_token_id=0,
            use_sliding_window=True,
            sliding_window=5,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=2000000.0),
        ),
        "gpt2",
        {},
    ),
    # --- issue 37's mixtures of experts ---
    # GPT-OSS: sinks, q/k/v/o biases, sliding (window 5) and full layers alternating, YaRN (truncate false); 4
    # experts top-2 with router and expert biases, gates the softmax of the top-2 logits, a SwiGLU clamped at 0.5
    # (small enough to bite); experts fused and interleaved (gate_up_proj) as transformers saves them.
    "gpt_oss": (
        "GptOssConfig",
        dict(
            hidden_size=32,
            intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=5,
            max_position_embeddings=64,
            swiglu_limit=0.5,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=16,
            ),
        ),
        "gpt2",
        {},
    ),
    # DeepSeek-V3: multi-head latent attention (q and kv latents, interleaved RoPE, YaRN with mscale_all_dim);
    # 1 dense layer then 2 MoE layers of 8 experts in 4 groups (top-2 groups, top-2 experts, sigmoid scores with a
    # random correction bias, routed_scaling_factor 2.5) beside a shared expert; one tensor per expert on disk.
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                mscale=1.0,
                mscale_all_dim=1.0,
                beta_fast=32.0,
                beta_slow=1.0,
                original_max_position_embeddings=8,
            ),
        ),
        "llama",
        {},
    ),
    # The same DeepSeek-V3 as transformers 5 holds it in memory: each layer's routed experts fused.
    "deepseek_v3_fused": (
        "DeepseekV3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                mscale=1.0,
                mscale_all_dim=1.0,
                beta_fast=32.0,
                beta_slow=1.0,
                original_max_position_embeddings=8,
            ),
        ),
        "llama",
        {"save_original_format": False},
    ),
    # Qwen3.5 (text): linear-attention layers (gated delta rule: 2 key heads shared by 4 value heads of 8, a 4-tap
    # convolution) at 0 and 2, full-attention layers (gated output, per-head (1 + w) q/k norms, a quarter of each
    # 16-wide head rotated) at 1 and 3.
    "qwen3_5": (
        "Qwen3_5TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"] * 2,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        ),
        "qwen2",
        {},
    ),
    # The text tower of a Qwen3.5 multimodal checkpoint (model.language_model.* beside a tiny vision tower).
    "qwen3_5_mm": (
        "Qwen3_5Config",
        dict(
            text_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                layer_types=["linear_attention", "full_attention"],
                max_position_embeddings=64,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                out_hidden_size=32,
                patch_size=4,
                spatial_merge_size=2,
                temporal_patch_size=2,
            ),
            tie_word_embeddings=False,
        ),
        "qwen2",
        {"model_class": "Qwen3_5ForConditionalGeneration"},
    ),
    # DeepSeek-V3's architecture without a query latent (q_proj straight from the hidden state), every layer
    # sparse (first_k_dense_replace 0: the layers scan).
    "deepseek_v3_noq": (
        "DeepseekV3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            first_k_dense_replace=0,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=12,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                mscale=1.0,
                mscale_all_dim=1.0,
                beta_fast=32.0,
                beta_slow=1.0,
                original_max_position_embeddings=8,
            ),
        ),
        "llama",
        {},
    ),
    # Gemma 4 (text): sliding layers of 8-wide heads (2 kv heads) at 0 and 2, global ones at 1 and 3 with 16-wide
    # heads, 1 kv head whose values are its keys (attention_k_eq_v), proportional RoPE on a quarter of the
    # frequencies; per-layer inputs 8 wide; the logits soft-capped.
    "gemma4": (
        "Gemma4TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            global_head_dim=16,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB,
            layer_types=["sliding_attention", "full_attention"] * 2,
            sliding_window=5,
            final_logit_softcapping=30.0,
            max_position_embeddings=64,
        ),
        "gemma",
        {},
    ),
    # The text tower of a Gemma 4 multimodal checkpoint (model.language_model.* beside a tiny vision tower); its
    # global layers keep their own values (no attention_k_eq_v) and take global_head_dim's default shape rule.
    "gemma4_mm": (
        "Gemma4Config",
        dict(
            text_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                global_head_dim=16,
                hidden_size_per_layer_input=8,
                vocab_size_per_layer_input=VOCAB,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=5,
                max_position_embeddings=64,
            ),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                patch_size=4,
                position_embedding_size=64,
            ),
            audio_config=None,
        ),
        "gemma",
        {"model_class": "Gemma4ForConditionalGeneration"},
    ),
    # Gemma 4 as its small (E2B, E4B) checkpoints are: the last 2 of 5 layers reuse the keys and values of the last
    # earlier layer of their type (layers 2 and 1), with MLPs twice as wide; per-layer inputs; the global layers'
    # own values.
    "gemma4_shared": (
        "Gemma4TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=5,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            global_head_dim=16,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
            + ["full_attention"],
            sliding_window=5,
            final_logit_softcapping=30.0,
            max_position_embeddings=64,
        ),
        "gemma",
        {},
    ),
    # Gemma 4 as the 31B is (no per-layer inputs, values from the keys on the global layers), with what no published
    # checkpoint has but the config allows: attention biases (q/k/v/o), untied logits, proportional RoPE with a
    # factor, no soft-cap.
    "gemma4_dense": (
        "Gemma4TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            global_head_dim=16,
            num_global_key_value_heads=2,
            attention_k_eq_v=True,
            attention_bias=True,
            hidden_size_per_layer_input=0,
            layer_types=["sliding_attention", "full_attention", "full_attention"],
            sliding_window=5,
            rope_parameters=dict(
                full_attention=dict(rope_type="proportional", partial_rotary_factor=0.5, factor=2.0, rope_theta=5e5),
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            ),
            final_logit_softcapping=None,
            tie_word_embeddings=False,
            max_position_embeddings=64,
        ),
        "gemma",
        {},
    ),
}

# Fixtures that also get `greedy.npy`: transformers' greedy continuation of their first GREEDY_PROMPT tokens
# (past the 5-token windows), the reference for cached decoding (`generate`).
# (phi4_mini's LongRoPE switches every position's frequencies once the sequence passes 8 tokens, which a
# cached decode cannot redo for the keys it already holds: its greedy tokens are not compared.)
GREEDY = (
    "qwen3",
    "gemma2",
    "gemma3",
    "gemma3_mm",
    "phi3",
    "olmo2",
    "phi4",
    "olmo3",
    "smollm3",
    "gpt_oss",
    "deepseek_v3",
    "qwen3_5",
    "gemma4",
    "gemma4_shared",
)
GREEDY_PROMPT, GREEDY_TOKENS = 5, 12

# Tokenizer family -> (special tokens in id order, bos, eos, add_bos)
SPECIALS = {
    "llama": (["<unk>", "<s>", "</s>"], "<s>", "</s>", True),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|endoftext|>", False),
    "gemma": (["<pad>", "<eos>", "<bos>", "<unk>"], "<bos>", "<eos>", True),
    "gpt2": (["<|endoftext|>"], "<|endoftext|>", "<|endoftext|>", False),
}


def corpus() -> list[str]:
    """Text to train the tiny BPE on: a few stdlib modules (the same kind of text as the toolkit's corpus)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return [(lib / name).read_text() for name in ("this.py", "textwrap.py", "string.py", "bisect.py")]


def make_tokenizer(family: str, out: Path) -> dict:
    """A byte-level BPE of VOCAB tokens with the family's specials; returns their ids."""
    specials, bos, eos, add_bos = SPECIALS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    ids = {s: tok.token_to_id(s) for s in specials}
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token="<unk>" if "<unk>" in specials else None,
        pad_token="<pad>" if "<pad>" in specials else None,
        model_max_length=64,
    )
    fast.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(add_bos_token=add_bos, add_eos_token=False)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return {"bos_token_id": ids.get(bos) if bos else None, "eos_token_id": ids[eos], "size": tok.get_vocab_size()}


def randomize(model: torch.nn.Module, family: str, seed: int) -> None:
    """Weights with a spread that makes every part of the forward pass matter to the logits."""
    g = torch.Generator().manual_seed(seed)
    offset = 0.0 if family == "gemma" and "Gemma4" not in type(model).__name__ else 1.0  # Gemma 4: x * w norms
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.ndim == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                # RMSNorm / LayerNorm scales: around 1 (Gemma stores w of (1 + w): around 0).
                p.copy_(offset + 0.2 * noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)  # biases
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5 if "c_" not in name else noise / p.shape[0] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek's routing correction: a saved buffer
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=torch.float32))
            if name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale: a saved buffer
                b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=g, dtype=torch.float32))


def model_class(model_dir: Path) -> type:
    """The checkpoint's own class (a multimodal one's ``...ForConditionalGeneration``), else the auto class."""
    arch = (json.loads((model_dir / "config.json").read_text()).get("architectures") or [""])[0]
    return getattr(transformers, arch, transformers.AutoModelForCausalLM)


def logits_of(model_dir: Path, tokens: np.ndarray) -> np.ndarray:
    model = model_class(model_dir).from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def greedy_of(model_dir: Path, prompt: np.ndarray, n: int) -> np.ndarray:
    """transformers' greedy continuation of ``prompt`` (``n`` tokens, recomputing the sequence, no stop token)."""
    model = model_class(model_dir).from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.from_numpy(prompt.astype(np.int64))[None]
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].numpy().astype(np.int32)


def v4_dialect(cfg: dict) -> dict:
    """The same config as transformers 4.x wrote it: rope_theta + rope_scaling, torch_dtype, no layer_types."""
    cfg = dict(cfg)
    rope = dict(cfg.pop("rope_parameters", None) or {})
    cfg["rope_theta"] = rope.pop("rope_theta", 10000.0)
    rope_type = rope.pop("rope_type", "default")
    cfg["rope_scaling"] = None if rope_type == "default" else {"rope_type": rope_type, **rope}
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    cfg.pop("layer_types", None)
    cfg["transformers_version"] = "4.46.0"
    return cfg


def make(name: str, seed: int) -> None:
    cls_name, kwargs, family, save = FIXTURES[name]
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ids = make_tokenizer(family, out)
    assert ids["size"] <= VOCAB, ids
    special = {k: v for k, v in ids.items() if k != "size"}
    if "text_config" in kwargs:  # multimodal: the vocabulary and special tokens are the text model's
        kwargs = {**kwargs, "text_config": {**kwargs["text_config"], "vocab_size": VOCAB, **special}}
        config = getattr(transformers, cls_name)(**kwargs)
    else:
        config = getattr(transformers, cls_name)(vocab_size=VOCAB, **kwargs, **special)
    torch.manual_seed(seed)
    if "model_class" in save:  # a multimodal checkpoint the causal-LM auto class would build as its text model
        model = getattr(transformers, save["model_class"])._from_config(config, attn_implementation="eager")
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize(model, family, seed)
    model.tie_weights()
    if "dtype" in save:
        model = model.to(save["dtype"])
    fmt = {"save_original_format": save["save_original_format"]} if "save_original_format" in save else {}
    model.save_pretrained(out, max_shard_size=save.get("max_shard_size", "5GB"), **fmt)
    tokens = np.random.default_rng(seed).integers(0, VOCAB, TOKENS_SHAPE).astype(np.int32)
    np.save(out / "tokens.npy", tokens)
    logits = logits_of(out, tokens)
    np.save(out / "logits.npy", logits.astype(np.float32))
    if name in GREEDY:
        np.save(out / "greedy.npy", greedy_of(out, tokens[0, :GREEDY_PROMPT], GREEDY_TOKENS))
    if name == "llama":
        # transformers 4.x's dialect of the same config: transformers 5 reads it to the same model.
        v4 = out / "v4"
        v4.mkdir()
        for f in out.iterdir():
            if f.suffix == ".safetensors":
                (v4 / f.name).symlink_to(Path("..") / f.name)
        (v4 / "config.json").write_text(json.dumps(v4_dialect(json.loads((out / "config.json").read_text())), indent=2))
        assert np.array_equal(logits_of(v4, tokens), logits), "the 4.x dialect config gives other logits"
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{name}: {cls_name}, logits std {logits.std():.3f}, {size / 1024:.0f} KiB")


def check(model_dir: Path, expect: Path, atol: float) -> int:
    """Loads `model_dir` with transformers; compares logits with `expect`'s on its tokens."""
    tokens = np.load(expect / "tokens.npy")
    got = logits_of(model_dir, tokens)
    want = np.load(expect / "logits.npy")
    diff = float(np.abs(got - want).max())
    ok = got.shape == want.shape and diff <= atol
    print(f"{'OK' if ok else 'MISMATCH'} {model_dir}: max |diff| {diff:.3g} vs {expect} (atol {atol})")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"fixtures to make (default all: {', '.join(FIXTURES)})")
    ap.add_argument("--check", type=Path, help="a checkpoint directory to load with transformers")
    ap.add_argument("--expect", type=Path, help="the fixture whose tokens and logits --check compares with")
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    if args.check:
        return check(args.check, args.expect, args.atol)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name in args.names or FIXTURES:
        make(name, seed=list(FIXTURES).index(name))  # the same seed whichever fixtures are made
    return 0


if __name__ == "__main__":
    sys.exit(main())
