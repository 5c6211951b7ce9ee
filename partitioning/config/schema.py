"""The run config's typed sections, their defaults and the choices a key allows.

Example::

    >>> TrainConfig().steps, OptimizerConfig().name
    (200, 'adamw')
"""

from __future__ import annotations

import dataclasses
from typing import Any

from partitioning.rules import Rules
from partitioning.yamlfile import Key, dump_yaml, where

@dataclasses.dataclass(frozen=True)
class MeshConfig:
    shape: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": 1, "fsdp": -1})
    axis_types: str = "auto"
    devices: int | None = None   # None: all visible devices


@dataclasses.dataclass(frozen=True)
class DataConfig:
    path: str | None = None       # None: the embedded standard-library corpus
    eval_fraction: float = 0.05
    seed: int = 0
    target: dict[str, Any] | None = None   # {_target_: module.fn, ...}: a dataset object instead of text


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 20
    schedule: str = "cosine"       # cosine | constant | linear
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9          # sgd only
    clip_norm: float | None = 1.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 32
    seq_len: int = 128
    grad_accum: int = 1
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 4
    seed: int = 0
    loss: Any = "next_token"       # next_token | same_token | classification | {_target_: module.fn}
    step: Any = None               # {_target_: module.fn}: a whole custom step(forward, batch)
    inputs: Any = None             # {_target_: module.fn}: batch -> the model's args (tuple) or kwargs (dict)
    rngs: list[str] = dataclasses.field(default_factory=lambda: ["dropout"])   # RNG streams for the model


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None         # None: RUN_DIR/checkpoints
    every: int = 0                 # 0: only at the end (and on Ctrl-C / SIGTERM)
    keep: int = 3
    keep_best: bool = False
    async_: bool = True


SECTIONS = {
    "mesh": MeshConfig, "data": DataConfig, "optimizer": OptimizerConfig,
    "train": TrainConfig, "checkpoint": CheckpointConfig,
}
TOP_KEYS = ["model", "mesh", "rules", "optimizer_rules", "on_indivisible", "data",
            "optimizer", "train", "checkpoint", "run_dir"]
REQUIRED = ["model", "mesh", "rules"]
CHOICES = {
    ("mesh", "axis_types"): ("auto", "explicit"),
    ("optimizer", "name"): ("adamw", "adafactor", "sgd"),
    ("optimizer", "schedule"): ("cosine", "constant", "linear"),
}


def field_key(name: str) -> str:
    """The YAML key of a dataclass field (``async_`` is ``async``)."""
    return "async" if name == "async_" else name


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated run config. ``raw`` is the resolved mapping (overrides applied).

    Example::

        >>> cfg = load_config("configs/quickstart.yaml")
        >>> cfg.model_name, cfg.train.batch_size, cfg.where("train", "steps")
        ('gpt', 32, 'configs/quickstart.yaml:42: train.steps')
    """

    path: str
    raw: dict[str, Any]
    lines: dict[Key, int]
    model_name: str                # a registered name, or the `_target_` (module.attr)
    model_options: dict[str, Any]
    model_target: bool
    mesh: MeshConfig
    rules: Rules
    optimizer_rules: Rules | None
    on_indivisible: str
    data: DataConfig
    optimizer: OptimizerConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    run_dir: str

    def where(self, *key: Any) -> str:
        """``file:line: dotted.key`` of a key of this config (or the ``--set`` flag that set it)."""
        return where(self.path, self.lines, key)

    def to_yaml(self) -> str:
        return dump_yaml(self.raw)


__all__ = ["Config", "MeshConfig", "DataConfig", "OptimizerConfig", "TrainConfig", "CheckpointConfig",
           "SECTIONS", "TOP_KEYS", "REQUIRED", "CHOICES", "field_key"]
