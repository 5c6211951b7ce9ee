"""Config -> a plan before running: the per-array table and the compiled view of the train step.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> from partitioning.config.planning import plan_from_config
    >>> plan, model = plan_from_config(pt.load_config(path), devices=2048)   # shapes only: any device count
    >>> plan.totals["params"]["per_device"] > 0
    True

:func:`tune_inputs` is what the tuner prices a config's layouts from (``tune``, ``model.remat: auto``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from partitioning.config.axes import check_axes_used
from partitioning.config.build import (
    PIPELINE_KEYS,
    at_key,
    batch_from_config,
    model_from_config,
    model_options_resolved,
    optimizer_from_config,
    task_from_config,
    trainable_keys,
    trainer_from_config,
)
from partitioning.config.schema import Config
from partitioning.errors import ConfigError, MeshError
from partitioning.finetune.trainable import subset_of
from partitioning.mesh import abstract_mesh, make_mesh
from partitioning.model.interface import as_model
from partitioning.model.task import model_inputs
from partitioning.parallel.pipeline import PipelineError, check_layers, check_microbatches, layers_sizes, microbatching
from partitioning.parallel.schedule import STAGE_AXIS
from partitioning.parallel.trace import recording
from partitioning.plan.compiled import compiled_view
from partitioning.plan.coverage import activation_names
from partitioning.plan.flops import transformer_flops
from partitioning.plan.parallel import costs_from_records, stacked_bytes
from partitioning.plan.plan import Plan, build_plan, mesh_sizes
from partitioning.rules import Rules
from partitioning.train.state import abstract_train_state
from partitioning.tune.space import table_axes
from partitioning.tune.workload import Workload, workload


def _abstract_state(cfg: Config, model: Any, batch: Any, task: Any) -> tuple[Any, Any, frozenset[str]]:
    """(boxed params, boxed optimizer state over the trainable params, the frozen paths) of a config."""
    t = cfg.train.trainable
    try:
        params, opt_state = abstract_train_state(model, optimizer_from_config(cfg), batch=batch, task=task, trainable=t)
        return params, opt_state, subset_of(params, t).frozen
    except ConfigError as e:
        raise at_key(cfg, e, trainable_keys(cfg)) from None


def _collections(model: Any, batch: Any, task: Any) -> dict[str, Any]:
    """The model's variables other than params (BatchNorm's ``batch_stats``): its forward pass reads them."""
    variables = as_model(model).abstract(*model_inputs(task, batch))
    return {k: v for k, v in variables.items() if k != "params"}


def plan_from_config(cfg: Config, devices: int) -> tuple[Plan, Any]:
    """(plan, model) for a config on ``devices`` devices, from ``eval_shape`` only."""
    try:
        sizes = mesh_sizes(cfg.mesh.shape, devices)
    except MeshError as e:  # located as the pre-flight locates it: plan and check say the same line
        raise MeshError(f"{cfg.where('mesh', 'shape')}: {e}") from None
    model = model_from_config(cfg)
    batch, task = batch_from_config(cfg), task_from_config(cfg)
    params, opt_state, frozen = _abstract_state(cfg, model, batch, task)
    # What one forward pass sees (grad_accum splits the batch), pipelined as the Trainer would.
    g = max(1, cfg.train.grad_accum)
    forward = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // g, *x.shape[1:]), x.dtype), batch)
    abstract = abstract_mesh(sizes, cfg.mesh.axis_types)
    try:
        m, _, _ = check_microbatches(
            abstract,
            cfg.rules,
            cfg.train.microbatches,
            cfg.train.batch_size // g,
            f"batch_size {cfg.train.batch_size}",
            cfg.train.pipeline_repeats,
        )
        check_layers(layers_sizes(params), sizes.get(STAGE_AXIS, 1), cfg.train.pipeline_repeats)
    except PipelineError as e:
        raise at_key(cfg, e, PIPELINE_KEYS) from None
    # Outside the recording: this forward pass runs without the rules, and its MoE / pipeline records would not
    # carry their mesh axes.
    collections = _collections(model, forward, task)
    with microbatching(m, cfg.train.pipeline_repeats), recording() as stacks:
        acts = activation_names(model, params, abstract, cfg.rules, batch=forward, task=task, collections=collections)
    plan = build_plan(
        params,
        opt_state,
        sizes,
        cfg.rules,
        optimizer_rules=cfg.optimizer_rules,
        on_indivisible=cfg.on_indivisible,
        activations=acts,
        frozen=frozen,
        offload=cfg.train.offload,
        offload_update=cfg.train.offload_update,
    )
    check_axes_used(cfg, sizes, plan.params + plan.opt_state)
    plan.parallel = costs_from_records(stacks, sizes, passes=g, stage_weight_bytes=stacked_bytes(plan.params))
    return plan, model


def compiled_from_config(cfg: Config, devices: int, plan: Plan | None = None) -> dict[str, Any]:
    """The compiled view of the config's train step on the first ``devices`` devices of this process."""
    if plan is None:
        plan, _ = plan_from_config(cfg, devices)
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=jax.devices()[:devices], nodes=cfg.mesh.nodes)
    trainer = trainer_from_config(cfg, mesh)
    view = compiled_view(
        trainer.lower_train_step,
        expected=plan.expected_specs(),
        input_names=("", "batch"),
        output_names=("", "metrics"),
        nodes=cfg.mesh.nodes,
    )
    if view.get("flops") and trainer.seq_len:
        view["flops"]["six_n_tokens"] = transformer_flops(trainer.num_params, trainer.batch_size * trainer.seq_len)
    return view


@dataclasses.dataclass
class TuneInputs:
    """A config's abstract state, one traced forward pass (its records and activation names), its workload."""

    params: Any
    opt_state: Any
    records: list[dict[str, Any]]
    names: Any
    workload: Workload
    frozen: frozenset[str] = frozenset()  # paths of the params that do not train (train.trainable)


def tune_inputs(cfg: Config) -> TuneInputs:
    """What the tuner needs of a config: ``jax.eval_shape`` of the state and one forward pass, unpipelined,
    at the full batch (the layer stacks and expert layers that add pipeline / expert costs)."""
    model, batch, task = model_from_config(cfg), batch_from_config(cfg), task_from_config(cfg)
    params, opt_state, frozen = _abstract_state(cfg, model, batch, task)
    collections = _collections(model, batch, task)  # a pass without the rules: not among the records
    with microbatching(1), recording() as records:
        # Size-1 axes: the config's (a model may name them directly) and the rules'; traced with the config's
        # axis types (a model using Explicit-only ops traces only so).
        axes = dict.fromkeys([*cfg.mesh.shape, "data", *table_axes(cfg.rules)], 1)
        names = activation_names(
            model,
            params,
            axes,
            cfg.rules,
            batch=batch,
            task=task,
            axis_types=cfg.mesh.axis_types,
            collections=collections,
        )
    p0 = build_plan(params, opt_state, {"data": 1}, Rules([]), on_indivisible="replicate")
    options = model_options_resolved(cfg)
    w = workload(
        p0.params,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.train.seq_len,
        compute_dtype=options.get("dtype"),
        expert_layer=next((r for r in records if r["kind"] == "experts"), None),
        attention=str(options.get("attention") or "xla"),  # xla | cudnn | auto: priced as the model runs it
        frozen=frozen,
    )
    return TuneInputs(params, opt_state, list(records), names, w, frozen)


__all__ = ["plan_from_config", "compiled_from_config", "tune_inputs", "TuneInputs"]
