"""partitioning: logical-axis sharding for JAX/Flax.

Annotate parameters with logical axis names once; choose data parallel, FSDP,
tensor parallel or 2D layouts with a YAML rule table.

Example::

    >>> import partitioning as pt
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> rules = pt.Rules.preset("fsdp")
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), tokens)
    >>> shardings = pt.tree_shardings(abstract, mesh, rules)

Training (state born sharded, jitted step with donation)::

    >>> tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=200, warmup_steps=20)
    >>> trainer = pt.Trainer(model, tx, mesh, rules, batch_size=32, seq_len=128)
    >>> batches = pt.load_corpus().batches("train", 32, 128, trainer.batch_sharding)
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=200)
"""

from partitioning.errors import (
    CheckpointError, ConfigError, DataError, MeshError, PartitioningError, RuleError, ShardingError,
)
from partitioning.rules import (
    DimExplanation, IndivisibleWarning, Rules, axis_rules, get_logical_axis_rules,
    logical_to_mesh, logical_to_mesh_axes, logical_to_mesh_sharding, preset_names,
    set_logical_axis_rules,
)
from partitioning.boxes import (
    Fallback, LogicallyPartitioned, compute_spec, is_box, logical_spec, param_for_compute, unbox,
    with_logical_constraint, with_logical_partitioning,
)
from partitioning.mesh import MeshSpec, make_mesh, sharding_context
from partitioning.shardings import (
    LeafLayout, logical_names, per_device_bytes, tree_layouts, tree_shardings, tree_specs,
)
from partitioning.registry import build_model, model_names, register_model
from partitioning.config import Config, load_config
from partitioning.report import Plan, abstract_train_state, activation_names, build_plan
from partitioning.compiled import compiled_view
from partitioning.checkpoint import (
    CheckpointHook, CheckpointManager, abstract_target, checkpoint_metadata, restore_checkpoint, save_checkpoint,
)
from partitioning.train import TrainState, Trainer, lm_loss
from partitioning.optimizer import lr_schedule, make_optimizer
from partitioning.data import Corpus, TokenBatches, load_corpus
from partitioning.loop import JsonlLogger, evaluate, fit
from partitioning.plots import plot_loss

__version__ = "0.1.0"

__all__ = [
    "PartitioningError", "RuleError", "MeshError", "ShardingError", "ConfigError", "CheckpointError",
    "DataError", "Rules", "DimExplanation", "IndivisibleWarning", "axis_rules", "get_logical_axis_rules",
    "set_logical_axis_rules", "logical_to_mesh_axes", "logical_to_mesh", "logical_to_mesh_sharding",
    "preset_names", "LogicallyPartitioned", "with_logical_partitioning", "with_logical_constraint",
    "Fallback", "is_box", "unbox", "compute_spec", "logical_spec", "param_for_compute", "MeshSpec", "make_mesh", "sharding_context", "LeafLayout",
    "tree_layouts", "tree_specs", "tree_shardings", "logical_names", "per_device_bytes",
    "register_model", "build_model", "model_names", "Config", "load_config",
    "Plan", "build_plan", "abstract_train_state", "activation_names", "compiled_view",
    "CheckpointManager", "CheckpointHook", "abstract_target", "restore_checkpoint", "save_checkpoint",
    "checkpoint_metadata",
    "Trainer", "TrainState", "lm_loss", "make_optimizer", "lr_schedule", "Corpus", "TokenBatches",
    "load_corpus", "fit", "evaluate", "JsonlLogger", "plot_loss",
]
