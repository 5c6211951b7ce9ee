"""Hugging Face and PEFT files: checkpoints (``config.json`` + safetensors) and LoRA adapters, in and out.

A published checkpoint is a model family (:mod:`partitioning.models.hf`: the
reference decoder's options and a name table, kept there as data) plus a name
map. Loading never assembles the whole model anywhere: each process reads the
byte ranges of the shards it holds and applies the map's transposes per shard;
saving gathers one tensor at a time.

Modules:

- :mod:`~partitioning.hf.weights` — ``load_hf`` / ``save_hf`` / ``hf_model``: Hugging Face checkpoints in and out.
- :mod:`~partitioning.hf.files` — ``config.json``, safetensors headers (validated), indexes, writing files.
- :mod:`~partitioning.hf.check` — ``config.json`` checked: types, misspelt keys, the architecture.
- :mod:`~partitioning.hf.pattern` — name-map patterns (``"(h k) d -> d h k"``): file boxes of a shard.
- :mod:`~partitioning.hf.name_map` — a family's name map applied to a model; missing / extra / misshaped tensors.
- :mod:`~partitioning.hf.read` — per-shard reads: each process reads only its devices' bytes.
- :mod:`~partitioning.hf.write` — safetensors out, one tensor gathered at a time.
- :mod:`~partitioning.hf.peft_config` — PEFT's ``adapter_config.json`` checked; adapter rows of a name map.
- :mod:`~partitioning.hf.peft` — PEFT LoRA adapters in (per shard) and out.
- :mod:`~partitioning.hf.tokenizer` — a checkpoint's tokenizer files, chat template and generation config, as
  transformers 5 saves them.

Imports: every stage below it (the core, :mod:`partitioning.finetune`, :mod:`partitioning.checkpoint`'s reader)
and, inside functions, the families of :mod:`partitioning.models.hf`.

Example::

    >>> model = pt.hf.hf_model("tests/fixtures/hf/llama")      # config.json only: nothing is read
    >>> model.embed, model.layers, model.kv_heads
    (32, 2, 2)
"""

from partitioning.hf.peft import save_peft
from partitioning.hf.tokenizer import save_tokenizer
from partitioning.hf.weights import hf_family, hf_model, load_hf, save_hf

__all__ = ["load_hf", "save_hf", "hf_model", "hf_family", "save_peft", "save_tokenizer"]
