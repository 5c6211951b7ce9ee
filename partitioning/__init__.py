"""partitioning: logical-axis sharding for JAX/Flax.

Annotate parameters with logical axis names once; choose data parallel, FSDP,
tensor parallel or 2D layouts with a YAML rule table; plan, train and
checkpoint under it.

The package is a pipeline, one folder per stage (each imports only the stages above it in this list)::

    rules, boxes, mesh, layout      names -> PartitionSpec -> NamedSharding (the core; replication warns)
    annotations, propose            names by parameter path for models without them; a proposed table
    model/                          any Linen / NNX / function model behind one interface; its task (loss)
    parallel/                       pipeline stages (the `layers` axis over `stage`) and experts
    data/                           tokens, tokenizers, chat rows, packing, seeded per-process batches
    decode/                         generation with a KV cache, sampling
    finetune/                       trainable subsets, LoRA on any model, merging
    plan/                           memory, collectives and FLOPs before running
    train/                          sharded state, jitted step, the loop and its guards
    checkpoint/                     orbax save / restore onto any mesh and rules
    hf/                             Hugging Face checkpoints and PEFT adapters, in and out
    tune/                           the best layout for a device count and a budget: priced, ranked, explained
    config/, cli/                   YAML run configs and the command line

This module holds the core vocabulary (rules, boxes, meshes, layouts, the model interface, the plan, the
Trainer, configs and checkpoints); the rest is in the namespaces ``pt.model``, ``pt.data``, ``pt.decode``,
``pt.finetune``, ``pt.parallel``, ``pt.plan``, ``pt.train``, ``pt.checkpoint``, ``pt.hf`` and ``pt.tune``.

Example (8 devices: ``pt.simulate_devices(8)`` on a CPU)::

    >>> import partitioning as pt
    >>> from partitioning.models import MLP
    >>> model, tokens = MLP(), jnp.zeros((8, 32), jnp.int32)
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> rules = pt.Rules.preset("fsdp")
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), tokens)
    >>> shardings = pt.tree_shardings(abstract, mesh, rules)
    >>> shardings["params"]["embedding"].spec
    P(None, 'fsdp')

Training (state born sharded, jitted step with donation)::

    >>> tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=4, warmup_steps=1)
    >>> trainer = pt.Trainer(model, tx, mesh, rules, batch_size=8, seq_len=32)
    >>> batches = pt.data.load_corpus().batches("train", 8, 32, trainer.batch_sharding)
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, progress=False)
    >>> int(state.step)
    4
"""

# The namespaces (pt.data, pt.hf, ...): imported here so `import partitioning as pt` is enough.
from partitioning import annotations as annotations
from partitioning import boxes as boxes
from partitioning import checkpoint as checkpoint
from partitioning import config as config
from partitioning import data as data
from partitioning import decode as decode
from partitioning import finetune as finetune
from partitioning import hf as hf
from partitioning import layout as layout
from partitioning import model as model
from partitioning import parallel as parallel
from partitioning import plan as plan
from partitioning import resolve as resolve
from partitioning import rules as rules
from partitioning import show as show
from partitioning import train as train
from partitioning import tune as tune
from partitioning.annotations import Annotations
from partitioning.boxes import (
    LogicallyPartitioned,
    RulesFallback,
    get_partition_spec,
    logical_spec,
    unbox,
    with_logical_constraint,
    with_logical_partitioning,
)
from partitioning.checkpoint import (
    CheckpointManager,
    abstract_target,
    reshard_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from partitioning.config import Config, load_config
from partitioning.context import axis_rules, get_logical_axis_rules, logical_to_mesh_axes, set_logical_axis_rules
from partitioning.devices import initialize_distributed, simulate_devices
from partitioning.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    MeshError,
    ModelError,
    PartitioningError,
    RuleError,
    ShardingError,
)
from partitioning.layout import (
    LeafLayout,
    logical_names,
    logical_to_mesh,
    logical_to_mesh_sharding,
    tree_layouts,
    tree_shardings,
    tree_specs,
)
from partitioning.mesh import MeshSpec, make_mesh, sharding_context
from partitioning.model import FunctionModel, LinenModel, NNXModel, Task, as_model, register_model
from partitioning.plan import Plan, build_plan
from partitioning.replication import ReplicationWarning
from partitioning.resolve import IndivisibleWarning
from partitioning.rules import Rules, preset_names
from partitioning.show import show_sharding
from partitioning.train import Trainer, TrainState, abstract_train_state, fit, make_optimizer

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (see CHANGELOG.md)

# The core vocabulary (at most 60 names; tests/test_package.py holds the bound). The rest is in namespaces.
__all__ = [
    # errors
    "PartitioningError",
    "RuleError",
    "MeshError",
    "ShardingError",
    "ConfigError",
    "CheckpointError",
    "DataError",
    "ModelError",
    # rules
    "Rules",
    "preset_names",
    "Annotations",
    "IndivisibleWarning",
    "ReplicationWarning",
    # the rule context, with Flax's names
    "axis_rules",
    "get_logical_axis_rules",
    "set_logical_axis_rules",
    "logical_to_mesh_axes",
    # boxes
    "LogicallyPartitioned",
    "with_logical_partitioning",
    "with_logical_constraint",
    "RulesFallback",
    "get_partition_spec",
    "logical_spec",
    "unbox",
    # meshes and devices
    "MeshSpec",
    "make_mesh",
    "sharding_context",
    "simulate_devices",
    "initialize_distributed",
    # layouts
    "LeafLayout",
    "tree_layouts",
    "tree_specs",
    "tree_shardings",
    "logical_names",
    "logical_to_mesh",
    "logical_to_mesh_sharding",
    "show_sharding",
    # models
    "as_model",
    "LinenModel",
    "NNXModel",
    "FunctionModel",
    "Task",
    "register_model",
    # plan
    "Plan",
    "build_plan",
    # train
    "Trainer",
    "TrainState",
    "abstract_train_state",
    "make_optimizer",
    "fit",
    # configs
    "Config",
    "load_config",
    # checkpoints
    "CheckpointManager",
    "save_checkpoint",
    "restore_checkpoint",
    "abstract_target",
    "reshard_checkpoint",
]
