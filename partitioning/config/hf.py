"""``model: {hf: DIR}``: a Hugging Face checkpoint in a run config, checked at load and built from it.

    model:
      hf: hf/llama-3.1-8b        # a folder with config.json (+ *.safetensors to train), or a config.json
      scan_layers: true
      remat: auto               # the default: the fastest policy that fits (config/remat.py)
      dtype: bfloat16

The path is looked for beside the file that names it, then in the current
directory (a ``--set`` value: the other way round). ``check``, ``plan``,
``tune`` and ``rules explain`` need only ``config.json``
(:func:`partitioning.hf.hf_model`); ``train`` reads the weights onto its mesh
(:func:`partitioning.hf.load_hf`). Text data is tokenized with the checkpoint's
``tokenizer.json`` unless ``data.tokenizer`` names another.

Example::

    >>> from partitioning.config.hf import hf_options
    >>> cfg = pt.load_config("configs/llama3_70b_hf.yaml")
    >>> cfg.model_hf, hf_options(cfg)["scan_layers"]
    (PosixPath('configs/hf/llama-3.1-70b'), True)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from partitioning.config.lora import adapter_lora, at_adapter, hf_adapter, lora_error
from partitioning.config.schema import Config, HfModelConfig
from partitioning.errors import ConfigError, DataError, PartitioningError
from partitioning.yamlfile import Lines, find_beside, where

CONFIG_JSON = "config.json"
TOKENIZER_JSON = "tokenizer.json"


def config_json(source: Path) -> Path:
    """The ``config.json`` of a checkpoint folder (or the file itself)."""
    return source / CONFIG_JSON if source.is_dir() else source


def hf_source(value: Any, path: str, lines: Lines, errors: list[str]) -> Path | None:
    """The checkpoint ``model.hf`` names (a folder with config.json, or a config.json); else an error appended."""
    if not isinstance(value, str):
        return None  # the schema's error says what was expected
    here = where(path, lines, ("model", "hf"))
    found, looked = find_beside(value, path, lines, ("model", "hf"))
    if found is None:
        errors.append(f"{here}: no such checkpoint folder or config.json {value!r} (looked in {', '.join(looked)})")
        return None
    if found.is_dir() and not (found / CONFIG_JSON).is_file():
        errors.append(
            f"{here}: {found} has no {CONFIG_JSON} (a Hugging Face checkpoint folder holds config.json and "
            f"*.safetensors; for planning, config.json alone is enough)"
        )
        return None
    if found.is_file() and found.suffix != ".json":
        errors.append(f"{here}: {found} is a file but not a config.json; name the checkpoint folder")
        return None
    return found


def hf_path(cfg: Config) -> Path:
    """The checkpoint an ``hf`` config names (a folder, or a config.json)."""
    if cfg.model_hf is None:
        raise ValueError(f"{cfg.path}: the model is not a Hugging Face checkpoint")
    return cfg.model_hf


def hf_options(cfg: Config) -> dict[str, Any]:
    """The model options of an ``hf`` config with their defaults (``scan_layers``, ``remat``, dtypes)."""
    out = HfModelConfig.model_validate({"hf": cfg.model_name, **cfg.model_options}).model_dump(
        exclude={"hf", "adapter"}
    )
    lora = adapter_lora(cfg, hf_path(cfg), out)  # model.adapter: its adapter_config.json's LoRA
    out.pop("lora", None)  # without LoRA the options (and what runs recorded) are as before it existed
    if lora is not None:
        out["lora"] = lora
    # `auto` is resolved per run (config/remat.py); a model built without that step runs without remat.
    if out["remat"] == "auto":
        out["remat"] = "none"
    return out


def _at_hf(cfg: Config, e: PartitioningError) -> PartitioningError:
    """An error of the checkpoint, at the config key naming it (options at their own keys)."""
    arg = getattr(e, "arg", None)
    if arg == "adapter":  # config/lora.py put it at model.adapter already
        return e
    if isinstance(arg, str) and arg.split(".")[0] == "lora":
        return lora_error(cfg, e)
    key = ("model", arg) if arg in cfg.model_options else ("model", "hf")
    return type(e)(f"{cfg.where(*key)}: {e}", arg=arg)


def hf_model_from_config(cfg: Config) -> Any:
    """The Flax module of the config's checkpoint, built from its ``config.json`` alone."""
    from partitioning.hf.weights import hf_model

    try:
        return hf_model(hf_path(cfg), **hf_options(cfg))
    except PartitioningError as e:
        raise _at_hf(cfg, e) from None


def hf_params_from_config(cfg: Config, mesh: Any) -> Any:
    """The checkpoint's weights, each array born in its shard of ``mesh`` under the config's rules."""
    from partitioning.hf.weights import load_hf

    adapter = hf_adapter(cfg)
    try:
        _, variables = load_hf(
            hf_path(cfg), mesh, cfg.rules, on_indivisible=cfg.on_indivisible, adapter=adapter, **hf_options(cfg)
        )
    except PartitioningError as e:
        if adapter is not None and str(e).startswith(str(adapter)):
            raise at_adapter(cfg, e) from None
        raise _at_hf(cfg, e) from None
    return variables["params"]


def hf_record(cfg: Config) -> dict[str, Any] | None:
    """What a run's checkpoints record of its Hugging Face source (None without ``model.hf``).

    The ``config.json`` itself is kept, so ``ckpt export-hf`` rebuilds the
    model even when the source folder has moved.
    """
    if cfg.model_hf is None:
        return None
    source = cfg.model_hf.resolve()
    tokenizer = tokenizer_from_config(cfg)
    return {
        "source": str(source if source.is_dir() else source.parent),
        "config": json.loads(config_json(cfg.model_hf).read_text()),
        "options": hf_options(cfg),
        "tokenizer": None if tokenizer is None else str(tokenizer.resolve()),
        "chat_template": trained_template(cfg, tokenizer),
    }


def trained_template(cfg: Config, tokenizer: Path | None) -> dict[str, str] | None:
    """The chat template a ``data.format: chat`` run renders with (``{"template", "source"}``; None otherwise):
    recorded with the checkpoints, so ``export-hf`` writes it out whatever folder it came from."""
    d = cfg.data
    if d.target is not None or d.format != "chat" or tokenizer is None:
        return None
    from partitioning.data.instruct import template_for

    found = None
    if d.chat_template is not None:
        found, _ = find_beside(d.chat_template, cfg.path, cfg.lines, ("data", "chat_template"))
    try:
        template = template_for(Path(tokenizer).parent, None if found is None else str(found))
    except PartitioningError:
        return None  # said by the data's own check, at its key
    return {"template": template.template, "source": template.source}


PICKLED = (".bin", ".pt", ".pth", ".ckpt")


def run_checkpoints(cfg: Config) -> Path:
    """Where the run's checkpoints are: ``checkpoint.dir``, else ``RUN_DIR/checkpoints``."""
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path(cfg.run_dir) / "checkpoints"


def has_checkpoint(cfg: Config) -> bool:
    """The run has a complete checkpoint of its own (a resume would not read the Hugging Face weights)."""
    from partitioning.checkpoint.disk import list_steps

    directory = run_checkpoints(cfg)
    return directory.is_dir() and any(s.finalized for s in list_steps(directory))


def check_hf_weights(cfg: Config) -> None:
    """The checkpoint has safetensors weights to start training from, with whole headers and the tensors
    ``config.json`` implies (no weight read); else one line at ``model.hf``."""
    source = hf_path(cfg)
    folder = source if source.is_dir() else source.parent
    if any(folder.glob("*.safetensors")):
        from partitioning.hf.weights import check_hf_files

        adapter = hf_adapter(cfg)
        try:  # the headers (the base's and the adapter's): what load_hf checks before reading a byte
            check_hf_files(source, adapter=adapter, **hf_options(cfg))
        except PartitioningError as e:
            if adapter is not None and str(e).startswith(str(adapter)):
                raise at_adapter(cfg, e) from None
            raise _at_hf(cfg, e) from None
        return
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLED)
    why = (
        f"only {pickled[0]}: convert it to safetensors (pickled files are never loaded)"
        if pickled
        else "train starts from them; plan and tune need only config.json"
    )
    raise ConfigError(f"{cfg.where('model', 'hf')}: {folder} has no *.safetensors weights ({why})")


def tokenizer_from_config(cfg: Config) -> Path | None:
    """The tokenizer text data is tokenized with: ``data.tokenizer``, else the checkpoint's ``tokenizer.json``.

    None: the data is bytes (no tokenizer, or the data is token arrays / a ``_target_``).
    """
    d = cfg.data
    if d.target is not None:
        return None
    if d.tokenizer is not None:
        found, looked = find_beside(d.tokenizer, cfg.path, cfg.lines, ("data", "tokenizer"))
        if found is None:
            raise DataError(
                f"{cfg.where('data', 'tokenizer')}: no such tokenizer {d.tokenizer!r} (looked in {', '.join(looked)})"
            )
        return found
    if cfg.model_hf is None:
        return None
    from partitioning.data.sources import source_of

    try:
        if source_of(d.path, d.source) != "text":
            return None
    except DataError as e:
        raise DataError(f"{cfg.where('data', 'source')}: {e}") from None
    folder = cfg.model_hf if cfg.model_hf.is_dir() else cfg.model_hf.parent
    if not (folder / TOKENIZER_JSON).is_file():
        raise ConfigError(
            f"{cfg.where('model', 'hf')}: {folder} has no {TOKENIZER_JSON} to tokenize the text data with; "
            f"name one with data.tokenizer, or train on token arrays (data.source: tokens)"
        )
    return folder / TOKENIZER_JSON


__all__ = [
    "find_beside",
    "config_json",
    "hf_source",
    "hf_options",
    "hf_path",
    "hf_model_from_config",
    "hf_params_from_config",
    "hf_record",
    "trained_template",
    "check_hf_weights",
    "has_checkpoint",
    "run_checkpoints",
    "tokenizer_from_config",
    "CONFIG_JSON",
    "TOKENIZER_JSON",
]
