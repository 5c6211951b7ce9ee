"""Config -> objects: the only code that turns a run config into a mesh, a model, a trainer, ...

Everything below this module takes explicit arguments; the CLI calls these builders. Errors a builder's
arguments cause are re-raised with the config key's ``file:line`` (``PartitioningError.arg`` names the
argument). This is also the one library module that imports the reference models
(:mod:`partitioning.models`), so a config can name ``gpt`` or ``mlp``.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> from partitioning.config.build import mesh_from_config, trainer_from_config
    >>> cfg = pt.load_config(path)
    >>> trainer = trainer_from_config(cfg, mesh_from_config(cfg))
    >>> dict(trainer.mesh.shape), trainer.batch_size
    ({'data': 1, 'fsdp': 8}, 8)

Running and planning a config build on these: :mod:`partitioning.config.run`
(data, checkpoints, trackers) and :mod:`partitioning.config.planning` (plan, compiled view).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax

import partitioning.models  # noqa: F401  (registers the reference models: gpt, mlp)
from partitioning.config.hf import find_beside, hf_model_from_config, hf_options, tokenizer_from_config
from partitioning.config.lora import lora_error, parse_lora, takes_lora, without_lora, wrap_lora
from partitioning.config.positions import check_positions
from partitioning.config.schema import Config
from partitioning.config.targets import TARGET, Factory, build_target, check_kwargs, import_target, takes_rngs
from partitioning.data.batch import lm_batch
from partitioning.data.corpus import Corpus, load_corpus
from partitioning.data.instruct import load_instructions
from partitioning.data.packing import instruction_batch
from partitioning.errors import ConfigError, DataError, MeshError, PartitioningError, ShardingError
from partitioning.mesh import make_mesh
from partitioning.model.annotated import annotated_model
from partitioning.model.interface import NNXModel, as_model
from partitioning.model.registry import REQUIRED, constructor_options, model_class
from partitioning.model.task import Task, as_task, model_inputs
from partitioning.models import GPT
from partitioning.models.lora import check_lora_targets
from partitioning.parallel.pipeline import PipelineError
from partitioning.train.optimizer import make_optimizer
from partitioning.train.step import Trainer

# `model.remat: auto` (the default for a model with a `remat` option) is resolved at run start
# (partitioning.config.remat); a model built before that, for shapes only, gets the model's own default.
AUTO = "auto"

RULES_KEY = {"on_indivisible": ("rules",)}  # an indivisible dimension: at the rule table the config names
BATCH_KEYS = {"batch_size": ("train", "batch_size"), "grad_accum": ("train", "grad_accum")}
# PipelineError.arg -> the config key to point at.
PIPELINE_KEYS = {
    "microbatches": ("train", "microbatches"),
    "repeats": ("train", "pipeline_repeats"),
    "stage": ("mesh", "shape", "stage"),
    "axis_types": ("mesh", "axis_types"),
}


def at_key(cfg: Config, error: PartitioningError, keys: Mapping[str, tuple[str, ...]]) -> PartitioningError:
    """``error`` re-raised at the config key its ``arg`` names (``keys``: arg -> config key)."""
    key = keys.get(error.arg) if error.arg is not None else None
    if key is None:
        return error
    return type(error)(f"{cfg.where(*key)}: {error}", arg=error.arg)


# -- model, mesh, optimizer --------------------------------------------------------------------


def model_from_config(cfg: Config) -> Any:
    """The config's model: a registered name with its options, or a ``_target_`` built recursively.

    Options are checked against the model's constructor (``file:line`` errors
    with a did-you-mean); NNX models come back as :class:`NNXModel` factories,
    so the trainer builds them sharded.
    """
    lora = parse_lora(cfg)
    if cfg.model_hf is not None:
        return check_model_lora(cfg, hf_model_from_config(cfg))
    own_lora = lora is None or takes_lora(_target_class(cfg))  # else: the weight path (LoRAModel)
    model_options = cfg.model_options if own_lora else without_lora(cfg.model_options)
    if cfg.model_target:
        obj = build_target(
            {TARGET: cfg.model_name, **_concrete(model_options, "none")}, path=cfg.path, lines=cfg.lines, key=("model",)
        )
    else:
        try:
            cls = model_class(cfg.model_name)
        except ConfigError as e:
            raise at_key(cfg, e, {"name": ("model", "name")}) from None
        default = constructor_options(cls).get("remat")
        fallback = default if isinstance(default, str) and default != AUTO else "none"
        options = build_target(_concrete(model_options, fallback), path=cfg.path, lines=cfg.lines, key=("model",))
        check_kwargs(cls, options, f"model {cfg.model_name!r}", lambda k: cfg.where("model", *([k] if k else [])))
        obj = Factory(cls, options) if takes_rngs(cls) else _construct(cfg, cls, options)
    if isinstance(obj, Factory):
        obj = NNXModel(obj)
    try:
        model = as_model(obj) if not isinstance(obj, nn.Module) else obj
    except TypeError as e:
        raise ConfigError(f"{cfg.where('model')}: {e}") from None
    if cfg.annotations:
        # `annotations:` name the variables by path (before LoRA derives its adapters' names from them).
        model = annotated_model(model, cfg.annotations)
    if lora is None:
        return model
    return check_model_lora(cfg, model) if own_lora else wrap_lora(cfg, model, lora)


def check_model_lora(cfg: Config, model: Any) -> Any:
    """A reference model built with ``lora``: its targets checked against its weights (ConfigError at the key)."""
    if isinstance(model, GPT):
        try:
            check_lora_targets(model)
        except PartitioningError as e:
            raise lora_error(cfg, e) from None
    return model


def _target_class(cfg: Config) -> Any:
    """The class (or builder) the config's model names, for its options (None: the build step reports it)."""
    try:
        if cfg.model_target:
            return import_target(cfg.model_name, Path(cfg.path).parent, cfg.where("model", TARGET))
        return model_class(cfg.model_name)
    except ConfigError:
        return None


def _concrete(options: dict[str, Any], fallback: str) -> dict[str, Any]:
    """The options with ``remat: auto`` replaced by ``fallback`` (auto is resolved at run start)."""
    return {**options, "remat": fallback} if options.get("remat") == AUTO else options


def _construct(cfg: Config, cls: Any, options: dict[str, Any]) -> Any:
    try:
        return cls(**options)
    except PartitioningError as e:
        raise at_key(cfg, e, {k: ("model", k) for k in options}) from None


def model_options_resolved(cfg: Config) -> dict[str, Any]:
    """The model's options with the constructor's defaults filled in (for a registered model);
    ``remat`` defaults to ``auto``."""
    if cfg.model_hf is not None:
        return hf_options(cfg)
    if cfg.model_target:
        return dict(cfg.model_options)
    try:
        defaults = constructor_options(model_class(cfg.model_name))
    except ConfigError:
        return dict(cfg.model_options)
    if isinstance(defaults.get("remat"), str):
        defaults["remat"] = AUTO
    return {
        k: cfg.model_options.get(k, d)
        for k, d in defaults.items()
        if k in cfg.model_options or d is not REQUIRED and k != "rngs"
    }


def grad_accum(cfg: Config) -> int:
    """``train.grad_accum`` as a count: ``auto`` counts as 1 until the run resolves it (config/defaults.py)."""
    return cfg.train.grad_accum if isinstance(cfg.train.grad_accum, int) else 1


def microbatches(cfg: Config) -> int | None:
    """``train.microbatches`` as the Trainer takes it: None (``auto``, unresolved: the stage count) or a count."""
    return cfg.train.microbatches if isinstance(cfg.train.microbatches, int) else None


def config_devices(cfg: Config, override: int | None = None) -> int | None:
    """Devices a config asks for: ``override`` (--devices), else mesh.devices, else the product of fixed sizes."""
    if override:
        return override
    if cfg.mesh.devices:
        return cfg.mesh.devices
    sizes = list(cfg.mesh.shape.values())
    if -1 in sizes:
        return None
    return math.prod(sizes)


def mesh_from_config(cfg: Config, devices: int | None = None) -> jax.sharding.Mesh:
    """The config's mesh over its device count (``--devices`` overrides), its ``nodes`` spanning the processes;
    errors at ``mesh.shape``'s (or ``mesh.nodes``') file:line."""
    n = config_devices(cfg, devices)
    try:
        return make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, jax.devices()[:n] if n else None, cfg.mesh.nodes)
    except MeshError as e:
        key = "nodes" if e.arg == "nodes" else "shape"
        raise MeshError(f"{cfg.where('mesh', key)}: {str(e).removeprefix('nodes: ')}", arg=e.arg) from None


def optimizer_from_config(cfg: Config) -> Any:
    """The optax transformation the config's ``optimizer`` section describes (over ``train.steps``)."""
    o = cfg.optimizer
    keys = ("warmup_steps", "schedule", "min_lr_ratio", "weight_decay", "b1", "b2", "eps", "momentum", "clip_norm")
    return make_optimizer(o.name, lr=o.lr, total_steps=max(1, cfg.train.steps), **{k: getattr(o, k) for k in keys})


_DATA_KEYS = {
    k: ("data", k)
    for k in ("path", "eval_path", "dtype", "source", "eval_fraction", "tokenizer", "cache_dir", "chat_template")
}


def dataset_from_config(cfg: Config, progress: bool | str = False) -> Any:
    """The config's data: the embedded corpus, text or token arrays (``data.path``), or ``data._target_``;
    ``progress``: how tokenizing instruction rows shows progress (:mod:`partitioning.data.progress`)."""
    d = cfg.data
    if d.target is not None:
        return build_target(d.target, path=cfg.path, lines=cfg.lines, key=("data",))
    _check_format_keys(cfg)
    tokenizer = tokenizer_from_config(cfg)
    if d.format != "text":
        return instructions_from_config(cfg, tokenizer, progress)
    try:
        return load_corpus(
            d.path,
            source=d.source,
            dtype=d.dtype,
            eval_path=d.eval_path,
            eval_fraction=d.eval_fraction,
            tokenizer=None if tokenizer is None else str(tokenizer),
            cache_dir=d.cache_dir,
        )
    except DataError as e:
        if e.arg == "tokenizer" and d.tokenizer is None:  # the checkpoint's own tokenizer
            raise DataError(f"{cfg.where('model', 'hf')}: {e}", arg=e.arg) from None
        raise at_key(cfg, e, _DATA_KEYS) from None


def _check_format_keys(cfg: Config) -> None:
    """Keys of one data format set with another: an error at the key, not silently ignored."""
    d = cfg.data
    if d.target is not None:
        return
    if d.format == "text":
        wrong = [k for k in ("packing", "chat_template", "truncation") if getattr(d, k) is not None]
        wrong = (["train_on_prompt"] if d.train_on_prompt else []) + wrong
        why = "is for data.format: chat or prompt_completion"
    else:
        wrong = [k for k in ("source", "dtype") if getattr(d, k) is not None]
        if d.format == "prompt_completion" and d.chat_template is not None:
            wrong.append("chat_template")
        why = f"does not apply to data.format: {d.format} (JSONL rows)"
    if wrong:
        raise ConfigError(f"{cfg.where('data', wrong[0])}: data.{wrong[0]} {why}")


def instructions_from_config(cfg: Config, tokenizer: Any, progress: bool | str = False) -> Any:
    """``data.format: chat | prompt_completion``: JSONL rows tokenized with the checkpoint's tokenizer."""
    d = cfg.data
    if d.path is None:
        raise ConfigError(f"{cfg.where('data', 'format')}: format {d.format} needs data.path (a .jsonl file or folder)")
    if tokenizer is None:
        raise ConfigError(
            f"{cfg.where('data', 'format')}: format {d.format} needs a tokenizer: data.tokenizer, or model.hf "
            "(the checkpoint's tokenizer.json)"
        )
    template = None
    if d.chat_template is not None:
        found, looked = find_beside(d.chat_template, cfg.path, cfg.lines, ("data", "chat_template"))
        if found is None:
            raise DataError(
                f"{cfg.where('data', 'chat_template')}: no such chat template {d.chat_template!r} "
                f"(looked in {', '.join(looked)})"
            )
        template = str(found)
    try:
        return load_instructions(
            d.path,
            d.format,
            str(tokenizer),
            chat_template=template,
            eval_path=d.eval_path,
            eval_fraction=d.eval_fraction,
            train_on_prompt=d.train_on_prompt,
            packing=True if d.packing is None else d.packing,
            truncation=d.truncation or "right",
            cache_dir=d.cache_dir,
            progress=progress,
        )
    except DataError as e:
        if e.arg in ("tokenizer", "chat_template") and d.tokenizer is None and d.chat_template is None:
            raise DataError(f"{cfg.where('model', 'hf')}: {e}", arg=e.arg) from None
        raise at_key(cfg, e, _DATA_KEYS) from None


def batch_from_config(cfg: Config, dataset: Any = None, seq_len: int | None = None) -> Any:
    """One global batch's shapes: ``(batch_size, seq_len)`` tokens for text (``seq_len``: else ``train.seq_len``,
    checked against the model's learned positions), else ``dataset.example(batch_size)``."""
    n = seq_len if seq_len is not None else check_positions(cfg)
    if cfg.data.target is None and cfg.data.format != "text":
        return instruction_batch(cfg.train.batch_size, n)
    if cfg.data.target is None:
        return lm_batch(cfg.train.batch_size, n)
    dataset = dataset if dataset is not None else dataset_from_config(cfg)
    if isinstance(dataset, Corpus):  # a _target_ that returns tokens, e.g. your own tokenizing loader
        return lm_batch(cfg.train.batch_size, n)
    if not hasattr(dataset, "example"):
        raise ConfigError(
            f"{cfg.where('data', TARGET)}: the data object needs example(batch_size) and "
            f"batches(split, batch_size, shardings, seed=) (see partitioning.data.corpus.ArrayDataset)"
        )
    return dataset.example(cfg.train.batch_size)


def task_from_config(cfg: Config) -> Task:
    """The config's task: ``train.loss`` (a built-in name or a ``_target_`` function) or ``train.step``."""
    t = cfg.train
    if t.step is not None:
        step = build_target(t.step, path=cfg.path, lines=cfg.lines, key=("train", "step"), call=False)
        return Task(step=step, name=getattr(step, "__name__", "custom step"))
    loss = t.loss
    if isinstance(loss, dict):
        loss = build_target(loss, path=cfg.path, lines=cfg.lines, key=("train", "loss"), call=False)
    try:
        task = as_task(loss)
    except ConfigError as e:
        raise at_key(cfg, e, {"loss": ("train", "loss")}) from None
    if t.inputs is not None:
        inputs = build_target(t.inputs, path=cfg.path, lines=cfg.lines, key=("train", "inputs"), call=False)
        task = dataclasses.replace(task, inputs=inputs)
    return task


def abstract_model(cfg: Config, dataset: Any = None, seq_len: int | None = None) -> tuple[Any, Any]:
    """(model, the boxed ``eval_shape`` of its variables on the config's batch), nothing allocated."""
    model = model_from_config(cfg)
    args, kwargs = model_inputs(task_from_config(cfg), batch_from_config(cfg, dataset, seq_len))
    return model, as_model(model).abstract(args, kwargs)


# -- training ----------------------------------------------------------------------------------


OFFLOAD_KEYS = {"offload": ("train", "offload"), "offload_update": ("train", "offload_update")}


def trainable_keys(cfg: Config) -> dict[str, tuple[Any, ...]]:
    """A trainable-subset error's ``arg`` (``trainable/<i>``) -> its config key, for ``file:line``."""
    keys: dict[str, tuple[Any, ...]] = {"trainable": ("train", "trainable")}
    keys.update({f"trainable/{i}": ("train", "trainable", i) for i in range(len(cfg.train.trainable or ()))})
    return keys


def trainer_from_config(cfg: Config, mesh: jax.sharding.Mesh, dataset: Any = None) -> Trainer:
    """The :class:`Trainer` for a config on ``mesh`` (its model, optimizer, rules, task, batch shape)."""
    model = model_from_config(cfg)
    t = cfg.train
    if t.steps < 1:
        raise ConfigError(f"{cfg.where('train', 'steps')}: must be >= 1, got {t.steps}")
    try:
        return Trainer(
            model,
            optimizer_from_config(cfg),
            mesh,
            cfg.rules,
            batch=batch_from_config(cfg, dataset),
            task=task_from_config(cfg),
            rng_streams=t.rngs,
            seed=t.seed,
            optimizer_rules=cfg.optimizer_rules,
            on_indivisible=cfg.on_indivisible,
            grad_accum=grad_accum(cfg),
            microbatches=microbatches(cfg),
            on_nonfinite=t.on_nonfinite,
            pipeline_repeats=t.pipeline_repeats,
            trainable=t.trainable,
            offload=t.offload,
            offload_update=t.offload_update,
        )
    except ConfigError as e:
        raise at_key(cfg, e, {**trainable_keys(cfg), **OFFLOAD_KEYS}) from None
    except (ShardingError, PipelineError) as e:
        raise at_key(cfg, e, {**BATCH_KEYS, **PIPELINE_KEYS, **RULES_KEY}) from None


__all__ = [
    *("AUTO", "at_key", "model_options_resolved", "model_from_config", "grad_accum", "microbatches"),
    *("config_devices", "mesh_from_config", "optimizer_from_config", "abstract_model", "dataset_from_config"),
    *("batch_from_config", "task_from_config", "trainer_from_config", "trainable_keys", "PIPELINE_KEYS", "RULES_KEY"),
]
