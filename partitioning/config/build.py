"""Config -> objects: the only code that turns a run config into a mesh, a model, a trainer, ...

Everything below this module takes explicit arguments; the CLI calls these
builders. Errors a builder's arguments cause are re-raised with the config
key's ``file:line`` (``PartitioningError.arg`` names the argument). This is
also the one library module that imports the reference models
(:mod:`partitioning.models`), so a config can name ``gpt`` or ``mlp``.

Example::

    >>> cfg = load_config("configs/quickstart.yaml")
    >>> mesh = mesh_from_config(cfg)
    >>> trainer = trainer_from_config(cfg, mesh)
    >>> corpus, train, evals = data_from_config(cfg, trainer)
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import AbstractMesh

import partitioning.models  # noqa: F401  (registers the reference models: gpt, mlp)
from partitioning.checkpoint.hook import CheckpointHook, prepare_directory
from partitioning.checkpoint.manager import CheckpointManager
from partitioning.checkpoint.restore import abstract_target
from partitioning.config.schema import Config
from partitioning.config.targets import TARGET, Factory, build_target, check_kwargs, takes_rngs
from partitioning.errors import ConfigError, DataError, PartitioningError, ShardingError
from partitioning.mesh import AXIS_TYPES, make_mesh
from partitioning.parallel.pipeline import (
    PipelineError, check_layers, check_microbatches, layers_sizes, microbatching,
)
from partitioning.parallel.schedule import STAGE_AXIS
from partitioning.parallel.trace import recording
from partitioning.plan.parallel import costs_from_records
from partitioning.plan.compiled import compiled_view
from partitioning.plan.coverage import activation_names
from partitioning.plan.flops import transformer_flops
from partitioning.plan.plan import Plan, build_plan, mesh_sizes
from partitioning.registry import REQUIRED, constructor_options, model_class
from partitioning.train.batch import lm_batch
from partitioning.train.data import Corpus, load_corpus
from partitioning.train.model import NNXModel, as_model
from partitioning.train.optimizer import make_optimizer
from partitioning.train.state import abstract_train_state, model_inputs
from partitioning.train.step import Trainer
from partitioning.train.task import Task, as_task
from partitioning.train.hooks import JsonlLogger
from partitioning.train.trackers import TensorBoardLogger, WandbLogger


# PipelineError.arg -> the config key to point at.
PIPELINE_KEYS = {"microbatches": ("train", "microbatches"), "stage": ("mesh", "shape", "stage"),
                 "axis_types": ("mesh", "axis_types")}


def at_key(cfg: Config, error: PartitioningError, keys: dict[str, tuple[str, ...]]) -> PartitioningError:
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
    if cfg.model_target:
        obj = build_target({TARGET: cfg.model_name, **cfg.model_options}, path=cfg.path, lines=cfg.lines,
                           key=("model",))
    else:
        try:
            cls = model_class(cfg.model_name)
        except ConfigError as e:
            raise at_key(cfg, e, {"name": ("model", "name")}) from None
        options = build_target(cfg.model_options, path=cfg.path, lines=cfg.lines, key=("model",))
        check_kwargs(cls, options, f"model {cfg.model_name!r}", lambda k: cfg.where("model", *([k] if k else [])))
        obj = Factory(cls, options) if takes_rngs(cls) else _construct(cfg, cls, options)
    if isinstance(obj, Factory):
        return NNXModel(obj)
    try:
        return as_model(obj) if not isinstance(obj, nn.Module) else obj
    except TypeError as e:
        raise ConfigError(f"{cfg.where('model')}: {e}") from None


def _construct(cfg: Config, cls: Any, options: dict[str, Any]) -> Any:
    try:
        return cls(**options)
    except PartitioningError as e:
        raise at_key(cfg, e, {k: ("model", k) for k in options}) from None


def model_options_resolved(cfg: Config) -> dict[str, Any]:
    """The model's options with the constructor's defaults filled in (for a registered model)."""
    if cfg.model_target:
        return dict(cfg.model_options)
    try:
        defaults = constructor_options(model_class(cfg.model_name))
    except ConfigError:
        return dict(cfg.model_options)
    return {k: cfg.model_options.get(k, d) for k, d in defaults.items()
            if k in cfg.model_options or d is not REQUIRED and k != "rngs"}


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
    """The config's mesh over its device count (``devices`` overrides, as --devices does)."""
    n = config_devices(cfg, devices)
    return make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=jax.devices()[:n] if n else None)


def optimizer_from_config(cfg: Config) -> Any:
    """The optax transformation the config's ``optimizer`` section describes (over ``train.steps``)."""
    o = cfg.optimizer
    return make_optimizer(o.name, lr=o.lr, total_steps=max(1, cfg.train.steps), warmup_steps=o.warmup_steps,
                          schedule=o.schedule, min_lr_ratio=o.min_lr_ratio, weight_decay=o.weight_decay,
                          b1=o.b1, b2=o.b2, eps=o.eps, momentum=o.momentum, clip_norm=o.clip_norm)


_DATA_KEYS = {k: ("data", k) for k in ("path", "eval_path", "dtype", "source", "eval_fraction")}


def dataset_from_config(cfg: Config) -> Any:
    """The config's data: the embedded corpus, text or token arrays (``data.path``), or ``data._target_``."""
    d = cfg.data
    if d.target is not None:
        return build_target(d.target, path=cfg.path, lines=cfg.lines, key=("data",))
    try:
        return load_corpus(d.path, source=d.source, dtype=d.dtype, eval_path=d.eval_path,
                           eval_fraction=d.eval_fraction)
    except DataError as e:
        raise at_key(cfg, e, _DATA_KEYS) from None


def batch_from_config(cfg: Config, dataset: Any = None) -> Any:
    """One global batch's shapes: ``(batch_size, seq_len)`` tokens for text, else ``dataset.example(batch_size)``."""
    if cfg.data.target is None:
        return lm_batch(cfg.train.batch_size, cfg.train.seq_len)
    dataset = dataset if dataset is not None else dataset_from_config(cfg)
    if isinstance(dataset, Corpus):   # a _target_ that returns tokens, e.g. your own tokenizing loader
        return lm_batch(cfg.train.batch_size, cfg.train.seq_len)
    if not hasattr(dataset, "example"):
        raise ConfigError(f"{cfg.where('data', TARGET)}: the data object needs example(batch_size) and "
                          f"batches(split, batch_size, shardings, seed=) (see partitioning.train.data.ArrayDataset)")
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


def abstract_model(cfg: Config, dataset: Any = None) -> tuple[Any, Any]:
    """(model, the boxed ``eval_shape`` of its variables on the config's batch), nothing allocated."""
    model = model_from_config(cfg)
    args, kwargs = model_inputs(task_from_config(cfg), batch_from_config(cfg, dataset))
    return model, as_model(model).abstract(args, kwargs)


# -- training ----------------------------------------------------------------------------------

def trainer_from_config(cfg: Config, mesh: jax.sharding.Mesh, dataset: Any = None) -> Trainer:
    """The :class:`Trainer` for a config on ``mesh`` (its model, optimizer, rules, task, batch shape)."""
    model = model_from_config(cfg)
    t = cfg.train
    if t.steps < 1:
        raise ConfigError(f"{cfg.where('train', 'steps')}: must be >= 1, got {t.steps}")
    try:
        return Trainer(model, optimizer_from_config(cfg), mesh, cfg.rules, batch=batch_from_config(cfg, dataset),
                       task=task_from_config(cfg), rng_streams=t.rngs, seed=t.seed,
                       optimizer_rules=cfg.optimizer_rules, on_indivisible=cfg.on_indivisible, grad_accum=t.grad_accum,
                       microbatches=t.microbatches)
    except (ShardingError, PipelineError) as e:
        raise at_key(cfg, e, {"batch_size": ("train", "batch_size"), "grad_accum": ("train", "grad_accum"),
                              **PIPELINE_KEYS}) from None


def _model_vocab(model: Any) -> Any:
    module = getattr(model, "module", model)
    if getattr(module, "vocab_size", None) is not None:
        return module.vocab_size
    factory = getattr(model, "factory", None)
    return getattr(factory, "kwargs", {}).get("vocab_size")


def _check_vocab(cfg: Config, trainer: Trainer, corpus: Corpus) -> None:
    """Every token below the model's vocab_size (text: vocab_size >= 256), before anything compiles."""
    vocab = _model_vocab(trainer.model)
    if vocab is None:
        return
    here = cfg.where("model", "vocab_size")
    if corpus.vocab is not None:
        if vocab < corpus.vocab:
            raise ConfigError(f"{here}: the data is bytes, so vocab_size must be >= {corpus.vocab}, got {vocab}")
        return
    for split, key in (("train", "path"), ("eval", "eval_path" if cfg.data.eval_path else "path")):
        bad = corpus.tokens(split).out_of_range(int(vocab))
        if bad is not None:
            token, name, index = bad
            raise DataError(f"{cfg.where('data', key)}: {name}: token {token} at index {index:,} is outside the "
                            f"model's vocabulary [0, {vocab}) ({here})")


def _batches_at_key(cfg: Config, split: str, make: Any) -> Any:
    try:
        return make()
    except DataError as e:
        d = cfg.data
        if d.target is not None:
            raise DataError(f"{cfg.where('data')}: {e}") from None
        key = ("data", "eval_path") if split == "eval" and d.eval_path else \
            ("data", "path") if d.path else ("train", "batch_size")
        raise DataError(f"{cfg.where(*key)}: {e}") from None


def data_from_config(cfg: Config, trainer: Trainer, dataset: Any = None) -> tuple[Any, Any, Any]:
    """(dataset, train batches, eval-batches callable or None) for a config's ``data:`` section.

    Every data problem (too few tokens for a batch, a token outside the
    model's vocabulary) is one error at the config key it comes from.
    """
    t = cfg.train
    dataset = dataset if dataset is not None else dataset_from_config(cfg)
    if isinstance(dataset, Corpus):
        _check_vocab(cfg, trainer, dataset)
        train = _batches_at_key(cfg, "train", lambda: dataset.batches(
            "train", t.batch_size, t.seq_len, trainer.batch_sharding, seed=cfg.data.seed))
        ev = _batches_at_key(cfg, "eval", lambda: dataset.batches(
            "eval", t.batch_size, t.seq_len, trainer.batch_sharding, seed=0)) if t.eval_batches > 0 else None
    else:
        train = _batches_at_key(cfg, "train", lambda: dataset.batches(
            "train", t.batch_size, trainer.batch_shardings, seed=cfg.data.seed))
        # A fixed eval order, independent of the train seed, keeps eval losses comparable.
        ev = _batches_at_key(cfg, "eval", lambda: dataset.batches(
            "eval", t.batch_size, trainer.batch_shardings, seed=0)) if t.eval_batches > 0 else None
    if cfg.data.log_batches:
        from partitioning.train.order import LoggedBatches

        train = LoggedBatches(train, Path(cfg.run_dir) / f"batches.{jax.process_index()}.jsonl")
    if ev is None:
        return dataset, train, None
    return dataset, train, lambda: (ev.batch_at(i) for i in range(t.eval_batches))


def data_position(cfg: Config) -> dict[str, Any]:
    """What a checkpoint records of the data: the batch of step ``k`` is a pure function of these and ``k``,
    so the step saved with the checkpoint is the data's position."""
    d, t = cfg.data, cfg.train
    where = {TARGET: d.target.get(TARGET)} if d.target is not None else \
        {"source": d.source, "path": d.path, "eval_path": d.eval_path, "dtype": d.dtype}
    return {"position": "step", **where, "seed": d.seed, "batch_size": t.batch_size, "seq_len": t.seq_len}


def data_resume_note(cfg: Config, saved: dict[str, Any] | None) -> str | None:
    """A line saying how this run's data differs from the checkpoint's (None: the same batches follow)."""
    if not saved:
        return None
    now = data_position(cfg)
    changed = [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(now) | set(saved))
               if saved.get(k) != now.get(k)]
    if not changed:
        return None
    return (f"data: changed since the checkpoint ({'; '.join(changed)}): the steps from here on see other "
            f"batches than the saved run would have")


def jsonable(x: Any) -> Any:
    """Plain JSON data (what a checkpoint's metadata can hold) for a config mapping."""
    return json.loads(json.dumps(x, default=str))


def checkpoint_hook_from_config(cfg: Config, trainer: Trainer, run_dir: Path, resume: bool | None = None,
                                log: Any = None) -> CheckpointHook:
    """The :class:`CheckpointHook` for a run config's ``checkpoint:`` section.

    ``resume``: None resumes when a checkpoint exists, True requires one, False
    starts over (existing checkpoints are moved aside, never deleted).
    """
    c = cfg.checkpoint
    directory = prepare_directory(Path(c.dir) if c.dir else Path(run_dir) / "checkpoints", resume, log)
    extra: dict[str, Any] = {"data": data_position(cfg)}
    if cfg.optimizer_rules is not None:
        extra["optimizer_rules"] = cfg.optimizer_rules.to_list()
    mngr = CheckpointManager(directory, every=c.every, keep=c.keep, keep_best=c.keep_best, async_=c.async_,
                             rules=cfg.rules, config=jsonable(cfg.raw), model_name=cfg.model_name,
                             abstract=trainer.abstract_state, extra=extra)
    target = abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    return CheckpointHook(mngr, target=target, resume=resume is not False, log=log)


def trackers_from_config(cfg: Config, run_dir: Path, config: Any = None) -> tuple[JsonlLogger, list[Any]]:
    """(the metrics logger, the other trackers' hooks) for ``train.tracker``.

    The :class:`JsonlLogger` always keeps the records (the loss plot and the
    summary read them); it writes ``RUN_DIR/metrics.jsonl`` only with ``jsonl``.
    ``config`` (the resolved config) goes to wandb.
    """
    kinds = cfg.train.tracker
    logger = JsonlLogger(Path(run_dir) / "metrics.jsonl" if "jsonl" in kinds else None)
    hooks: list[Any] = []
    if "tensorboard" in kinds:
        hooks.append(TensorBoardLogger(Path(run_dir) / "tensorboard"))
    if "wandb" in kinds:
        hooks.append(WandbLogger(run_dir, config=config))
    return logger, hooks


# -- planning ----------------------------------------------------------------------------------

def plan_from_config(cfg: Config, devices: int) -> tuple[Plan, Any]:
    """(plan, model) for a config on ``devices`` devices, from ``eval_shape`` only."""
    sizes = mesh_sizes(cfg.mesh.shape, devices)
    model = model_from_config(cfg)
    batch, task = batch_from_config(cfg), task_from_config(cfg)
    params, opt_state = abstract_train_state(model, optimizer_from_config(cfg), batch=batch, task=task)
    # What one forward pass sees (grad_accum splits the batch), pipelined as the Trainer would.
    g = max(1, cfg.train.grad_accum)
    forward = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // g, *x.shape[1:]), x.dtype), batch)
    types = (AXIS_TYPES[cfg.mesh.axis_types],) * len(sizes)
    try:
        m, _, _ = check_microbatches(AbstractMesh(tuple(sizes.values()), tuple(sizes), axis_types=types), cfg.rules,
                                     cfg.train.microbatches, cfg.train.batch_size // g,
                                     f"batch_size {cfg.train.batch_size}")
        check_layers(layers_sizes(params), sizes.get(STAGE_AXIS, 1))
    except PipelineError as e:
        raise at_key(cfg, e, PIPELINE_KEYS) from None
    with microbatching(m), recording() as stacks:
        acts = activation_names(model, params, sizes, cfg.rules, batch=forward, task=task)
    plan = build_plan(params, opt_state, sizes, cfg.rules, optimizer_rules=cfg.optimizer_rules,
                      on_indivisible=cfg.on_indivisible, activations=acts,
                      parallel=costs_from_records(stacks, sizes, passes=g))
    return plan, model


def compiled_from_config(cfg: Config, devices: int, plan: Plan | None = None) -> dict[str, Any]:
    """The compiled view of the config's train step on the first ``devices`` devices of this process."""
    if plan is None:
        plan, _ = plan_from_config(cfg, devices)
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=jax.devices()[:devices])
    trainer = trainer_from_config(cfg, mesh)
    view = compiled_view(trainer.lower_train_step, expected=plan.expected_specs(),
                         input_names=("", "batch"), output_names=("", "metrics"))
    if view.get("flops") and trainer.seq_len:
        view["flops"]["six_n_tokens"] = transformer_flops(trainer.num_params, trainer.batch_size * trainer.seq_len)
    return view


__all__ = ["at_key", "model_options_resolved", "model_from_config", "config_devices", "mesh_from_config", "optimizer_from_config", "abstract_model",
           "dataset_from_config", "batch_from_config", "task_from_config", "trainer_from_config", "data_from_config",
           "data_position", "data_resume_note",
           "checkpoint_hook_from_config", "trackers_from_config", "plan_from_config", "compiled_from_config", "jsonable"]
