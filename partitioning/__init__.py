"""partitioning: logical-axis sharding for JAX/Flax.

Annotate parameters with logical axis names once; choose data parallel, FSDP,
tensor parallel or 2D layouts with a YAML rule table.

Example::

    >>> import partitioning as pt
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> rules = pt.Rules.preset("fsdp")
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), tokens)
    >>> shardings = pt.tree_shardings(abstract, mesh, rules)
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
    Fallback, LogicallyPartitioned, is_box, unbox, with_logical_constraint, with_logical_partitioning,
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

__version__ = "0.1.0"

__all__ = [
    "PartitioningError", "RuleError", "MeshError", "ShardingError", "ConfigError", "CheckpointError",
    "DataError", "Rules", "DimExplanation", "IndivisibleWarning", "axis_rules", "get_logical_axis_rules",
    "set_logical_axis_rules", "logical_to_mesh_axes", "logical_to_mesh", "logical_to_mesh_sharding",
    "preset_names", "LogicallyPartitioned", "with_logical_partitioning", "with_logical_constraint",
    "Fallback", "is_box", "unbox", "MeshSpec", "make_mesh", "sharding_context", "LeafLayout",
    "tree_layouts", "tree_specs", "tree_shardings", "logical_names", "per_device_bytes",
    "register_model", "build_model", "model_names", "Config", "load_config",
    "Plan", "build_plan", "abstract_train_state", "activation_names", "compiled_view",
    "CheckpointManager", "CheckpointHook", "abstract_target", "restore_checkpoint", "save_checkpoint",
    "checkpoint_metadata",
]
