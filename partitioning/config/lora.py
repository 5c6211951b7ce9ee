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

from typing import Any

from partitioning.config.schema import Config
from partitioning.errors import PartitioningError
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


__all__ = ["parse_lora", "takes_lora", "without_lora", "wrap_lora", "lora_error"]
