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

import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import partitioning.models  # noqa: F401  (registers the reference models: gpt, mlp)
from partitioning.checkpoint.hook import CheckpointHook, prepare_directory
from partitioning.checkpoint.manager import CheckpointManager
from partitioning.checkpoint.restore import abstract_target
from partitioning.config.schema import Config
from partitioning.errors import ConfigError, DataError, PartitioningError, ShardingError
from partitioning.mesh import make_mesh
from partitioning.plan.compiled import compiled_view
from partitioning.plan.coverage import activation_names
from partitioning.plan.plan import Plan, build_plan, mesh_sizes
from partitioning.registry import check_options, model_class
from partitioning.train.data import VOCAB_SIZE, load_corpus
from partitioning.train.optimizer import make_optimizer
from partitioning.train.state import abstract_train_state
from partitioning.train.step import Trainer


def _at(cfg: Config, error: PartitioningError, keys: dict[str, tuple[str, ...]]) -> PartitioningError:
    """``error`` re-raised at the config key its ``arg`` names (``keys``: arg -> config key)."""
    key = keys.get(error.arg) if error.arg is not None else None
    if key is None:
        return error
    return type(error)(f"{cfg.where(*key)}: {error}", arg=error.arg)


# -- model, mesh, optimizer --------------------------------------------------------------------

def model_from_config(cfg: Config) -> Any:
    """The config's model, its name and options checked against the registered class."""
    try:
        cls = model_class(cfg.model_name)
        check_options(f"model {cfg.model_name!r}", cls, cfg.model_options)
    except ConfigError as e:
        raise _at(cfg, e, {"name": ("model", "name"), **{k: ("model", k) for k in cfg.model_options}}) from None
    return cls(**cfg.model_options)


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


def abstract_model(cfg: Config) -> tuple[Any, Any]:
    """(model, ``eval_shape`` of its init on the config's batch shape), nothing allocated."""
    model = model_from_config(cfg)
    tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.train.seq_len), jnp.int32)
    return model, jax.eval_shape(model.init, jax.random.key(0), tokens)


# -- training ----------------------------------------------------------------------------------

def trainer_from_config(cfg: Config, mesh: jax.sharding.Mesh) -> Trainer:
    """The :class:`Trainer` for a config on ``mesh`` (its model, optimizer, rules, batch shape)."""
    model = model_from_config(cfg)
    t = cfg.train
    if t.steps < 1:
        raise ConfigError(f"{cfg.where('train', 'steps')}: must be >= 1, got {t.steps}")
    try:
        return Trainer(model, optimizer_from_config(cfg), mesh, cfg.rules, batch_size=t.batch_size,
                       seq_len=t.seq_len, optimizer_rules=cfg.optimizer_rules, on_indivisible=cfg.on_indivisible,
                       grad_accum=t.grad_accum)
    except ShardingError as e:
        raise _at(cfg, e, {"batch_size": ("train", "batch_size"), "grad_accum": ("train", "grad_accum")}) from None


def data_from_config(cfg: Config, trainer: Trainer) -> tuple[Any, Any, Any]:
    """(corpus, train batches, eval-batches callable or None) for a config's ``data:`` section."""
    vocab = getattr(getattr(trainer.model, "module", None), "vocab_size", None)
    if vocab is not None and vocab < VOCAB_SIZE:
        raise ConfigError(f"{cfg.where('model', 'vocab_size')}: the data is bytes, so vocab_size must be "
                          f">= {VOCAB_SIZE}, got {vocab}")
    t = cfg.train
    try:
        corpus = load_corpus(cfg.data.path, eval_fraction=cfg.data.eval_fraction)
    except DataError as e:
        raise _at(cfg, e, {"path": ("data", "path"), "eval_fraction": ("data", "eval_fraction")}) from None
    train = corpus.batches("train", t.batch_size, t.seq_len, trainer.batch_sharding, seed=cfg.data.seed)
    if t.eval_batches <= 0:
        return corpus, train, None
    # A fixed eval order, independent of the train seed, keeps eval losses comparable.
    ev = corpus.batches("eval", t.batch_size, t.seq_len, trainer.batch_sharding, seed=0)
    return corpus, train, lambda: (ev.batch_at(i) for i in range(t.eval_batches))


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
    extra = {"optimizer_rules": cfg.optimizer_rules.to_list()} if cfg.optimizer_rules is not None else None
    mngr = CheckpointManager(directory, every=c.every, keep=c.keep, keep_best=c.keep_best, async_=c.async_,
                             rules=cfg.rules, config=jsonable(cfg.raw), model_name=cfg.model_name,
                             abstract=trainer.abstract_state, extra=extra)
    target = abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    return CheckpointHook(mngr, target=target, resume=resume is not False, log=log)


# -- planning ----------------------------------------------------------------------------------

def plan_from_config(cfg: Config, devices: int) -> tuple[Plan, Any]:
    """(plan, model) for a config on ``devices`` devices, from ``eval_shape`` only."""
    sizes = mesh_sizes(cfg.mesh.shape, devices)
    model = model_from_config(cfg)
    b, t = cfg.train.batch_size, cfg.train.seq_len
    params, opt_state = abstract_train_state(model, optimizer_from_config(cfg), batch_size=b, seq_len=t)
    acts = activation_names(model, params, sizes, cfg.rules, batch_size=b, seq_len=t)
    plan = build_plan(params, opt_state, sizes, cfg.rules, optimizer_rules=cfg.optimizer_rules,
                      on_indivisible=cfg.on_indivisible, activations=acts)
    return plan, model


def compiled_from_config(cfg: Config, devices: int, plan: Plan | None = None) -> dict[str, Any]:
    """The compiled view of the config's train step on the first ``devices`` devices of this process."""
    if plan is None:
        plan, _ = plan_from_config(cfg, devices)
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=jax.devices()[:devices])
    trainer = trainer_from_config(cfg, mesh)
    return compiled_view(trainer.lower_train_step, expected=plan.expected_specs(),
                         input_names=("", "batch"), output_names=("", "metrics"))


__all__ = ["model_from_config", "config_devices", "mesh_from_config", "optimizer_from_config", "abstract_model",
           "trainer_from_config", "data_from_config", "checkpoint_hook_from_config", "plan_from_config",
           "compiled_from_config", "jsonable"]
