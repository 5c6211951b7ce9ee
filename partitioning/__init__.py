"""partitioning: logical-axis sharding for JAX/Flax.

Annotate parameters with logical axis names once; choose data parallel, FSDP,
tensor parallel or 2D layouts with a YAML rule table; plan, train and
checkpoint under it.

The package is a pipeline, one folder per stage::

    rules, boxes, mesh, layout      names -> PartitionSpec -> NamedSharding (the core; replication warns)
    annotations, propose            names by parameter path for models without them; a proposed table
    train/                          sharded state, jitted step, data, loop
    checkpoint/                     orbax save / restore onto any mesh and rules; Hugging Face safetensors in / out
    plan/                           memory, collectives and warnings before running
    parallel/                       pipeline stages (the `layers` axis over `stage`) and experts
    tune/                           the best layout for a device count and a budget: priced, ranked, explained
    config/, cli/                   YAML run configs and the command line

This module re-exports what a user needs; everything else stays importable
from its module.

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
    >>> batches = pt.load_corpus().batches("train", 8, 32, trainer.batch_sharding)
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, progress=False)
    >>> int(state.step)
    4
"""

from partitioning.annotations import AnnotationError, Annotations, AnnotationWarning
from partitioning.boxes import (
    Fallback,
    LogicallyPartitioned,
    RulesFallback,
    compute_spec,
    get_partition_spec,
    is_box,
    logical_spec,
    param_for_compute,
    unbox,
    with_logical_constraint,
    with_logical_partitioning,
)
from partitioning.checkpoint import (
    CheckpointHook,
    CheckpointManager,
    abstract_target,
    checkpoint_metadata,
    reshard_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from partitioning.config import Config, load_config
from partitioning.context import axis_rules, get_logical_axis_rules, logical_to_mesh_axes, set_logical_axis_rules
from partitioning.data import Corpus, TokenBatches, load_corpus, place
from partitioning.data.chat import ChatTemplate
from partitioning.data.corpus import ArrayDataset
from partitioning.data.instruct import load_instructions
from partitioning.data.tokenize import TextTokenizer, load_tokenizer
from partitioning.decode.generate import generate
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
from partitioning.finetune.lora import LoRA
from partitioning.finetune.lora_model import LoRAModel
from partitioning.finetune.merge import merge_lora
from partitioning.finetune.trainable import trainable_paths
from partitioning.hf import hf_family, hf_model, load_hf, save_hf
from partitioning.hf.peft import save_peft
from partitioning.layout import (
    LeafLayout,
    logical_names,
    logical_to_mesh,
    logical_to_mesh_sharding,
    per_device_bytes,
    tree_layouts,
    tree_shardings,
    tree_specs,
)
from partitioning.mesh import MeshSpec, make_mesh, sharding_context
from partitioning.model import FunctionModel, LinenModel, NNXModel, Task, as_model, lm_loss
from partitioning.model.registry import build_model, model_names, register_model
from partitioning.parallel import (
    LayerStack,
    PipelineError,
    bubble_fraction,
    expert_capacity,
    microbatching,
    moe_ffn,
    scan_layers,
)
from partitioning.plan import (
    Plan,
    activation_names,
    build_plan,
    compiled_view,
    parallel_costs,
    peak_tflops,
    plot_plan,
    step_flops,
    transformer_flops,
)
from partitioning.replication import ReplicationWarning
from partitioning.resolve import DimExplanation, IndivisibleWarning
from partitioning.rules import Rules, preset_names, table_mesh
from partitioning.show import describe_sharding, show_sharding
from partitioning.train import (
    JsonlLogger,
    LossPlot,
    TensorBoardLogger,
    Trainer,
    TrainState,
    WandbLogger,
    abstract_train_state,
    evaluate,
    fit,
    lr_schedule,
    make_optimizer,
    plot_loss,
)
from partitioning.tune import Hardware, Workload, hardware, load_hardware, workload
from partitioning.tune import search as search_layouts
from partitioning.tune.compiled import compiled_estimate
from partitioning.tune.crossover import crossover
from partitioning.tune.measure import measure_cpu
from partitioning.tune.plot import plot_search
from partitioning.tune.price import price as price_layout

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (see CHANGELOG.md)

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
    "DimExplanation",
    "IndivisibleWarning",
    "ReplicationWarning",
    "Annotations",
    "AnnotationError",
    "AnnotationWarning",
    "axis_rules",
    "get_logical_axis_rules",
    "set_logical_axis_rules",
    "logical_to_mesh_axes",
    "preset_names",
    # boxes
    "LogicallyPartitioned",
    "with_logical_partitioning",
    "with_logical_constraint",
    "Fallback",
    "RulesFallback",
    "get_partition_spec",
    "is_box",
    "unbox",
    "compute_spec",
    "logical_spec",
    "param_for_compute",
    # mesh and devices
    "MeshSpec",
    "make_mesh",
    "sharding_context",
    "simulate_devices",
    "show_sharding",
    "describe_sharding",
    "table_mesh",
    "initialize_distributed",
    # layout
    "LeafLayout",
    "tree_layouts",
    "tree_specs",
    "tree_shardings",
    "logical_names",
    "per_device_bytes",
    "logical_to_mesh",
    "logical_to_mesh_sharding",
    # models and configs
    "register_model",
    "build_model",
    "model_names",
    "Config",
    "load_config",
    # train
    "Trainer",
    "TrainState",
    "abstract_train_state",
    "trainable_paths",
    "lm_loss",
    "Task",
    "LinenModel",
    "NNXModel",
    "LoRA",
    "LoRAModel",
    "FunctionModel",
    "as_model",
    "place",
    "make_optimizer",
    "lr_schedule",
    "Corpus",
    "TokenBatches",
    "ArrayDataset",
    "load_corpus",
    "load_instructions",
    "ChatTemplate",
    "load_tokenizer",
    "TextTokenizer",
    "generate",
    "fit",
    "evaluate",
    "JsonlLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "LossPlot",
    "plot_loss",
    # pipeline and experts
    "LayerStack",
    "scan_layers",
    "microbatching",
    "bubble_fraction",
    "PipelineError",
    "moe_ffn",
    "expert_capacity",
    # checkpoint
    "CheckpointManager",
    "CheckpointHook",
    "abstract_target",
    "restore_checkpoint",
    "save_checkpoint",
    "checkpoint_metadata",
    "reshard_checkpoint",
    # pretrained weights (Hugging Face)
    "load_hf",
    "save_hf",
    "hf_model",
    "hf_family",
    "save_peft",
    "merge_lora",
    # plan
    "Plan",
    "build_plan",
    "activation_names",
    "compiled_view",
    "plot_plan",
    "parallel_costs",
    "step_flops",
    "transformer_flops",
    "peak_tflops",
    # tune
    "Hardware",
    "hardware",
    "load_hardware",
    "measure_cpu",
    "Workload",
    "workload",
    "search_layouts",
    "price_layout",
    "crossover",
    "compiled_estimate",
    "plot_search",
]
