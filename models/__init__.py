"""Reference models, annotated only with logical axis names.

- :mod:`partitioning.models.mlp` — ``MLP``: a byte-level MLP language model, the smallest model with real layouts.
- :mod:`partitioning.models.gpt` — ``GPT``: a Llama-shaped decoder (RMSNorm, SwiGLU, RoPE, GQA, scanned layers),
  with the options of the published families (biases, tied embeddings, LayerNorm, GeGLU, learned positions, ...).
- :mod:`partitioning.models.block` — one decoder layer: attention (full, latent or linear), MLP or experts, norms.
- :mod:`partitioning.models.layers` — norms, the embedding lookup, gated and plain MLPs, parameter helpers.
- :mod:`partitioning.models.attention` — causal attention: RoPE (``llama3`` / ``linear`` scaling), GQA, sliding window.
- :mod:`partitioning.models.mla` — multi-head latent attention (DeepSeek-V3) and its latent cache.
- :mod:`partitioning.models.linear_attention` — the gated delta rule (Qwen3.5's linear attention) as a chunked scan.
- :mod:`partitioning.models.rope` — the long-context RoPE scalings: YaRN and LongRoPE (their attention factors),
  Gemma 4's proportional RoPE.
- :mod:`partitioning.models.per_layer` — Gemma 4's per-layer inputs, value norm, layer scalar and shared kv layers.
- :mod:`partitioning.models.hf` — the Hugging Face families: ``config.json`` readers and name maps (``load_hf``).
- :mod:`partitioning.models.checks` — option checks on construction: bad values are errors at their config key.
- :mod:`partitioning.models.moe` — ``MoE`` options and the GPT's mixture-of-experts MLP (``moe:``).
- :mod:`partitioning.decode.cache` — decode mode's KV cache (the ``cache`` collection) for ``generate``.
- :mod:`partitioning.models.variants` — the newer families' options: q/k norms, soft-caps, norm placement,
  local/global and NoPE layers carried through the layer scan as data.
- :mod:`partitioning.models.lora` — LoRA adapters on the decoder's projections (``lora:``), the activation path.
- :mod:`partitioning.models.quantized` — a quantized frozen base (``lora.base_dtype``): kernels dequantized per layer.
- :mod:`partitioning.models.fused_attention` — ``attention: xla | cudnn | auto``: cuDNN's flash kernel where it applies.

Importing this package registers them as ``mlp`` and ``gpt``. The library
never imports it; the config build step (:mod:`partitioning.config.build`)
and the CLI do.

Example::

    >>> from partitioning.models import GPT
    >>> model = GPT(embed=128, heads=4, layers=4)
    >>> "gpt" in pt.model.model_names()
    True
"""

from partitioning.models.gpt import GPT
from partitioning.models.mlp import MLP

__all__ = ["GPT", "MLP"]
