"""``model: {hf: BASE, adapter: DIR}``: a PEFT LoRA adapter on a Hugging Face base, in a run config.

    model:
      hf: hf/llama-3.1-8b
      adapter: adapters/my-lora     # adapter_config.json + adapter_model.safetensors, made by peft

The adapter's ``adapter_config.json`` sets the model's LoRA (rank, alpha,
targets from its ``target_modules``, rsLoRA, dropout), so ``model.lora`` is
not given beside it; ``train`` starts from the adapter's weights (and the
base's), ``generate`` talks with them, ``ckpt export-hf`` writes the trained
adapter back in PEFT's format. The folder is looked for like ``model.hf``:
beside the config, then in the current directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from partitioning.config.schema import Config
from partitioning.errors import ConfigError, PartitioningError

KEY = "adapter"


def hf_adapter(cfg: Config) -> Path | None:
    """The adapter folder ``model.adapter`` names (None without one); a ConfigError at the key."""
    from partitioning.yamlfile import find_beside

    value = cfg.model_options.get(KEY)
    if value is None:
        return None
    found, looked = find_beside(str(value), cfg.path, cfg.lines, ("model", KEY))
    if found is None:
        raise ConfigError(
            f"{cfg.where('model', KEY)}: no such adapter folder {value!r} (looked in {', '.join(looked)})", arg=KEY
        )
    return found


def at_adapter(cfg: Config, e: PartitioningError) -> PartitioningError:
    return type(e)(f"{cfg.where('model', KEY)}: {e}", arg=KEY)


def adapter_lora(cfg: Config, base: Path, options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``lora`` option the adapter sets (None without ``model.adapter``); one line at the key otherwise."""
    from partitioning.hf.peft import lora_of
    from partitioning.hf.peft_config import read_adapter
    from partitioning.hf.weights import _config, hf_model

    adapter = hf_adapter(cfg)
    if adapter is None:
        return options.get("lora")
    if options.get("lora") is not None:
        raise ConfigError(
            f"{cfg.where('model', 'lora')}: model.adapter sets the LoRA (its adapter_config.json); drop model.lora",
            arg=KEY,  # located already: _at_hf passes errors of `adapter` through
        )
    try:
        model = hf_model(base, scan_layers=options.get("scan_layers", True))
        lora = lora_of(read_adapter(adapter), _config(base)[2], model)
    except PartitioningError as e:
        raise at_adapter(cfg, e) from None
    return {**dataclasses.asdict(lora), "targets": list(lora.targets)}


__all__ = ["hf_adapter", "adapter_lora", "at_adapter"]
