"""``model.lora:`` in a run config: parsed, checked against the model's weights, errors at their keys.

    model:
      hf: hf/llama-3.1-8b          # or name: gpt, or _target_: my_models.Model
      lora: {rank: 16, alpha: 32, targets: ["attn/(q|v)$"], dropout: 0.05}

A model with a ``lora`` option of its own (the reference GPT and every
Hugging Face family) gets it and adapts its projections on the activation
path (:mod:`partitioning.models.lora`); any other model (a ``_target_``
Linen / NNX module, the reference ``mlp``) is wrapped in
:class:`~partitioning.finetune.lora_model.LoRAModel` (the weight path). Either
way a target that matches no weight is one line at ``model.lora.targets``.

A PEFT adapter on a Hugging Face base sets the LoRA instead (``model.lora`` is not given beside it)::

    model:
      hf: hf/llama-3.1-8b
      adapter: adapters/my-lora     # adapter_config.json + adapter_model.safetensors, made by peft

Its ``adapter_config.json`` gives rank, alpha, targets (from ``target_modules``), rsLoRA and dropout;
``train`` starts from the adapter's weights, ``generate`` talks with them, ``ckpt export-hf`` writes the
trained adapter back in PEFT's format. The folder is looked for like ``model.hf``: beside the config, then
in the current directory.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("model: {name: gpt, layers: 2, lora: {rank: 4, targets: [attn/qq]}}\\n"
    ...                     "mesh: {shape: {data: 1, fsdp: -1}}\\nrules: fsdp\\n")
    >>> from partitioning.config.build import model_from_config
    >>> model_from_config(pt.load_config(path))
    Traceback (most recent call last):
    partitioning.errors.ConfigError: .../run.yaml:1: model.lora.targets: 'attn/qq' matches no weight LoRA can adapt...
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from partitioning.config.schema import Config
from partitioning.errors import ConfigError, PartitioningError
from partitioning.finetune.lora import LoRA
from partitioning.finetune.lora_model import LoRAModel
from partitioning.model.registry import constructor_options

KEY = "lora"


def lora_error(cfg: Config, e: PartitioningError) -> PartitioningError:
    """``e`` (``arg`` ``lora`` or ``lora.<option>``) at the config key it names."""
    arg = e.arg if isinstance(e.arg, str) and e.arg.split(".")[0] == KEY else KEY
    message = str(e).removeprefix(f"{arg}: ").removeprefix(f"{arg} ")
    return type(e)(f"{cfg.where('model', *arg.split('.'))}: {message}", arg=arg)


def parse_lora(cfg: Config) -> LoRA | None:
    """The config's ``model.lora`` (None without one); a ConfigError at the offending key."""
    try:
        return LoRA.parse(cfg.model_options.get(KEY))
    except PartitioningError as e:
        raise lora_error(cfg, e) from None


def takes_lora(fn: Any) -> bool:
    """Whether a model class (or builder) has a ``lora`` option of its own (the reference GPT does)."""
    try:
        return KEY in constructor_options(fn)
    except (TypeError, ValueError):
        return False


def without_lora(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != KEY}


def wrap_lora(cfg: Config, model: Any, lora: LoRA) -> LoRAModel:
    """A model without a ``lora`` option of its own, with adapters merged into its weights (the weight path)."""
    try:
        return LoRAModel(model, lora, origin=cfg.where("model", KEY, "targets"))
    except PartitioningError as e:
        raise lora_error(cfg, e) from None


ADAPTER = "adapter"  # model.adapter: a PEFT adapter folder, which sets the LoRA


def hf_adapter(cfg: Config) -> Path | None:
    """The adapter folder ``model.adapter`` names (None without one); a ConfigError at the key."""
    from partitioning.yamlfile import find_beside

    value = cfg.model_options.get(ADAPTER)
    if value is None:
        return None
    found, looked = find_beside(str(value), cfg.path, cfg.lines, ("model", ADAPTER))
    if found is None:
        raise ConfigError(
            f"{cfg.where('model', ADAPTER)}: no such adapter folder {value!r} (looked in {', '.join(looked)})",
            arg=ADAPTER,
        )
    return found


def at_adapter(cfg: Config, e: PartitioningError) -> PartitioningError:
    return type(e)(f"{cfg.where('model', ADAPTER)}: {e}", arg=ADAPTER)


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
            arg=ADAPTER,  # located already: _at_hf passes errors of `adapter` through
        )
    try:
        model = hf_model(base, scan_layers=options.get("scan_layers", True))
        lora = lora_of(read_adapter(adapter), _config(base)[2], model)
    except PartitioningError as e:
        raise at_adapter(cfg, e) from None
    return {**dataclasses.asdict(lora), "targets": list(lora.targets)}


__all__ = [
    "parse_lora",
    "takes_lora",
    "without_lora",
    "wrap_lora",
    "lora_error",
    "hf_adapter",
    "adapter_lora",
    "at_adapter",
]
