"""Fine-tuning: which parameters train, LoRA adapters on any model, and adapters merged back.

The pieces the train step needs sit here, below it: a trainable subset is a
partition of the state by path (frozen leaves get no gradient and no optimizer
state); LoRA adapters are ordinary parameters with logical names (a ``lora``
rank axis beside the base weight's names), so every rule table lays them out.
The reference models carry adapters in their own layers
(:mod:`partitioning.models.lora`); PEFT's file format is in :mod:`partitioning.hf`.

Modules:

- :mod:`~partitioning.finetune.lora` — ``LoRA`` options: rank, alpha, targets (regexes over parameter paths), checks.
- :mod:`~partitioning.finetune.lora_model` — ``LoRAModel``: LoRA on any model, adapters merged into the weights.
- :mod:`~partitioning.finetune.merge` — LoRA merged into the weights (``W + scale * B A``), for every layout.
- :mod:`~partitioning.finetune.quantize` — a quantized frozen base (QLoRA): int8 / NF4 codes, block absmax scales.
- :mod:`~partitioning.finetune.quantized_base` — a QLoRA model's float twin; its base dequantized for export.
- :mod:`~partitioning.finetune.trainable` — ``trainable`` regexes: the params that train; the params tree split.

Imports: the core modules and :mod:`partitioning.model`.

Example::

    >>> lora = pt.finetune.LoRA(rank=8, targets=["attn/(q|v)$"])
    >>> sorted(pt.finetune.trainable_paths(["_lora_[ab]$"], ["attn/q", "attn/q_lora_a", "attn/q_lora_b"]))
    ['attn/q_lora_a', 'attn/q_lora_b']
"""

from partitioning.finetune.lora import LoRA
from partitioning.finetune.lora_model import LoRAModel
from partitioning.finetune.merge import merge_lora
from partitioning.finetune.quantized_base import dequantize_base
from partitioning.finetune.trainable import trainable_paths

__all__ = ["LoRA", "LoRAModel", "trainable_paths", "merge_lora", "dequantize_base"]
