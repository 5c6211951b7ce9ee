"""Published decoder families (Hugging Face checkpoints): ``config.json`` readers and name maps as data.

Each family is the one GPT decoder (:mod:`partitioning.models.gpt`) with the
options its ``config.json`` asks for, so every rule preset applies unchanged,
plus a table from its safetensors tensor names to the decoder's parameter
paths. The loading engine (:mod:`partitioning.hf.weights`) reads these
tables; it knows patterns and shapes, not model classes.

- :mod:`partitioning.models.hf.tables` — the name maps: HF tensor name -> parameter path + einops-like pattern.
- :mod:`partitioning.models.hf.families` — the ``Family`` rows: ``config.json`` -> GPT options for Llama, Mistral,
  Qwen2, Qwen3, Phi-3 / Phi-4, OLMo-2, OLMo-3, SmolLM3, GPT-2 (and the Gemmas' and the MoEs').
- :mod:`partitioning.models.hf.moes` — the readers of the mixture-of-experts families (Mixtral, Qwen3-MoE).
- :mod:`partitioning.models.hf.hybrids` — the reader of Qwen3.5 (linear-attention layers between full ones).
- :mod:`partitioning.models.hf.gemmas` — the readers of Gemma, Gemma 2 and Gemma 3 (text and multimodal).
- :mod:`partitioning.models.hf.gemma4` — Gemma 4's reader and name map (text and multimodal).
- :mod:`partitioning.models.hf.fields` — what every reader shares: activations, RoPE in both dialects, sizes.
- :mod:`partitioning.models.hf.catalog` — the docs' table of families, generated from the rows.
- :mod:`partitioning.models.hf.model` — ``HFDecoder`` (a GPT carrying its ``config.json``), ``build``,
  ``export_config``.

Example::

    >>> from partitioning.models.hf import build
    >>> build({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2}).positions
    'learned'
"""

from partitioning.models.hf.families import ARCHITECTURES, FAMILIES, Family, family_of
from partitioning.models.hf.model import HFDecoder, build, export_config, family_for
from partitioning.models.hf.tables import Tensor

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "Family",
    "HFDecoder",
    "Tensor",
    "build",
    "export_config",
    "family_for",
    "family_of",
]
