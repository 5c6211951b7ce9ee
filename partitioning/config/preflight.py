"""The pre-flight: every check ``train`` would make, before anything is written.

``partitioning check`` is the pre-flight; ``partitioning train`` runs the same
checks first, so a run that passes ``check`` does not fail on a config
mistake later, and a run that fails changes nothing on disk. In order:

1. the mesh fits the devices (sizes, ``-1``, ``--devices``); every ``auto`` default (``model.remat``, ...)
   becomes a choice, by a cached verdict or tune's estimate (:mod:`partitioning.config.defaults`);
2. the model builds (options checked against its constructor) and every
   parameter divides over the mesh axes its rules give it;
3. the batch (and micro-batch) divides over the batch axes;
4. the data is there, of the right type, holds at least one batch for training and for eval,
   (token arrays) every token is inside the model's vocabulary, and (instruction rows) the loss counts
   some token at ``train.seq_len`` (:func:`~partitioning.config.run.check_loss_tokens`);
5. ``run_dir`` and ``checkpoint.dir`` are folders (or can be made) and writable, ``checkpoint.dir`` holds
   nothing but checkpoints (:mod:`partitioning.config.rundir`), and the trackers' packages are installed;
6. an existing checkpoint fits the model, if the run would resume from it;
7. the model traces: the train step is lowered (a model that fails is one ``ModelError`` line);
8. the per-device peak fits the memory budget (compiled when a budget is set);
9. then, when measuring pays, the ``auto`` defaults' fitting choices are timed on the devices (cached).

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> from partitioning.config.preflight import preflight
    >>> ready = preflight(pt.load_config(path), devices=None, resume=None)
    >>> ready.trainer.num_params, ready.resume_step
    (98304, None)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

import jax

from partitioning.checkpoint.disk import list_steps, resolve_checkpoint
from partitioning.checkpoint.frozen import saved_arrays
from partitioning.checkpoint.integrity import check_parts, refuse
from partitioning.checkpoint.restore import abstract_target, check_fits, checkpoint_metadata
from partitioning.config.axes import check_axes_used
from partitioning.config.build import (
    RULES_KEY,
    at_key,
    batch_from_config,
    dataset_from_config,
    grad_accum,
    mesh_from_config,
    model_from_config,
    task_from_config,
    trainer_from_config,
)
from partitioning.config.defaults import resolve_defaults, time_defaults
from partitioning.config.planning import plan_from_config
from partitioning.config.positions import check_positions
from partitioning.config.resume import compare_run
from partitioning.config.run import data_from_config, data_resume_note
from partitioning.config.rundir import foreign_entries
from partitioning.config.schema import Config
from partitioning.data.batch import batch_specs
from partitioning.errors import CheckpointError, ConfigError, MeshError, PartitioningError, ShardingError
from partitioning.mesh import MeshSpec
from partitioning.outdir import file_in_the_way
from partitioning.plan.budget import Budget, HostBudget, check_budget, device_memory, refuse_host
from partitioning.plan.compiled import memory_stats
from partitioning.plan.plan import Plan, build_plan, mesh_sizes
from partitioning.resolve import REMEDY
from partitioning.train.step import Trainer


@dataclasses.dataclass
class Ready:
    """What the pre-flight built and found; ``train`` goes on from here."""

    cfg: Config
    mesh: Any
    dataset: Any
    trainer: Trainer | None  # None from preflight_abstract (nothing is built on devices)
    train_batches: Any
    eval_batches: Any
    run_dir: Path
    checkpoint_dir: Path
    resume_step: int | None
    budget: Budget | None
    plan: Plan
    data_note: str | None = None  # how the data differs from the checkpoint's, when resuming
    resume_note: str | None = None  # how the config differs from the checkpoint's, when resuming
    default_notes: list[str] = dataclasses.field(default_factory=list)  # what each `auto` became, and why
    host: HostBudget | None = None  # the offloaded state's host memory (train.offload), None without it
    data_warning: str | None = None  # truncation cuts more of the answers than data.max_truncated_answers


def writable_dir(path: Path, where: str) -> None:
    """``path`` is a folder, or can be made one, and can be written; else one ConfigError at ``where``."""
    blocker = file_in_the_way(path)
    if blocker == path:
        raise ConfigError(f"{where}: {path} is a file, not a folder")
    if blocker is not None:
        raise ConfigError(f"{where}: cannot make {path}: {blocker} is a file")
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: cannot write {path}: {existing} is not writable")


def _dirs(cfg: Config) -> tuple[Path, Path]:
    run_dir = Path(cfg.run_dir)
    writable_dir(run_dir, cfg.where("run_dir") if "run_dir" in cfg.raw else f"{cfg.path}: run_dir")
    ckpt = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints"
    where = cfg.where("checkpoint", "dir") if cfg.checkpoint.dir else f"{cfg.path}: run_dir"
    writable_dir(ckpt, where)
    foreign = foreign_entries(ckpt, run_dir)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(
            f"{where}: {ckpt} is not a checkpoints folder: it holds {shown}; a run saves (and prunes) steps "
            f"there: name a new or empty folder, or one with this run's checkpoints"
        )
    check_trackers(cfg)
    return run_dir, ckpt


TRACKER_PACKAGES = {"tensorboard": ("tensorboardX", "tensorboardX"), "wandb": ("wandb", "'partitioning[wandb]'")}


def check_trackers(cfg: Config) -> None:
    """Every tracker in ``train.tracker`` can be imported; else one ConfigError naming the package to install."""
    for kind in cfg.train.tracker:
        module, pip = TRACKER_PACKAGES.get(kind, (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"{cfg.where('train', 'tracker')}: tracker {kind!r} needs the {module} package, "
                f"which is not installed: pip install {pip} (or leave {kind} out of train.tracker)"
            )


def check_resume(
    directory: Path, target: Any, resume: bool | None, partial: bool = False, step: int | None = None
) -> int | None:
    """The step a run would resume from (None: it starts fresh), after checking the checkpoint fits ``target``.

    The latest finished step (or ``step``, ``--resume-from``), never silently an earlier one: a damaged
    one is refused, naming the earlier good step (:func:`~partitioning.checkpoint.disk.resolve_checkpoint`).
    """
    finished = [s for s in list_steps(directory) if s.finalized] if directory.is_dir() else []
    if resume is False or not finished:
        if resume is True:
            raise CheckpointError(f"--resume: no complete checkpoint in {directory}")
        return None
    ref = resolve_checkpoint(directory, step)
    try:
        saved = saved_arrays(ref)  # with the frozen params the step refers to
    except CheckpointError as e:  # unreadable, so damaged: said as damage, naming the latest good step
        check_parts(ref)
        raise refuse(ref, e) from None
    try:
        check_fits(ref, saved, target, partial)
    except CheckpointError as e:
        raise CheckpointError(
            f"{e}; to start over with this model use --no-resume (the old run is moved to RUN_DIR/previous/) "
            f"or another run_dir"
        ) from None
    return ref.step


def verify_resume(directory: Path, step: int | None = None) -> None:
    """``checkpoint.verify``: every part and data file of the checkpoint a run resumes from is there.

    The bytes themselves are checked against their crc32c while the restore reads them.
    """
    check_parts(resolve_checkpoint(directory, step))


class RunComplete(CheckpointError):
    """The run's checkpoint is already at ``train.steps``: ``train`` would do nothing (it refuses, exit 2);
    ``check`` states it as a fact (exit 0). ``ready`` is everything else the pre-flight found fine."""

    def __init__(self, message: str, *, step: int, ready: Any = None):
        super().__init__(message)
        self.step, self.ready = step, ready


def _continuation(
    cfg: Config, ckpt_dir: Path, step: int | None, resume: bool | None, sizes: dict[str, int]
) -> tuple[str | None, str | None, str | None]:
    """(data note, config note, nothing-to-train problem) for a run resuming at ``step``; raises when it is
    no continuation of it. The nothing-to-train problem is raised last, once every other check passed."""
    if step is None:
        return None, None, None
    meta = checkpoint_metadata(ckpt_dir, step)
    problem, changed = compare_run(cfg, meta, step, resume, sizes)
    if problem and "nothing to train" in problem:
        return data_resume_note(cfg, meta.get("data")), changed, problem
    if problem:
        raise CheckpointError(problem)
    return data_resume_note(cfg, meta.get("data")), changed, None


def check_tokenizer_vocab(cfg: Config) -> None:
    """A tokenizer with more tokens than the model's vocabulary, from the files alone: refused before the
    corpus is tokenized, so a failed run leaves no token cache behind."""
    from partitioning.config.hf import hf_model_from_config, tokenizer_from_config
    from partitioning.data.tokenize import load_tokenizer

    try:
        path = tokenizer_from_config(cfg)
    except PartitioningError:
        return  # said by the data's own check, with its key
    if path is None:
        return
    vocab = (
        getattr(hf_model_from_config(cfg), "vocab_size", None)
        if cfg.model_hf is not None
        else cfg.model_options.get("vocab_size")
    )
    try:
        n = load_tokenizer(path).vocab_size
    except PartitioningError:
        return  # an unreadable tokenizer: said by the data's own check, with its key
    if isinstance(vocab, int) and n > vocab:
        here = cfg.where("model", "hf" if cfg.model_hf is not None else "vocab_size")
        raise ConfigError(
            f"{here}: the model's vocab_size is {vocab}, but the tokenizer {path} has {n:,} tokens; "
            f"name the model's own tokenizer with data.tokenizer"
        )


def _mesh(cfg: Config, devices: int | None):
    return mesh_from_config(cfg, devices)  # its errors at mesh.shape's file:line


def _batch_divides(cfg: Config, sizes: dict[str, int]) -> None:
    """The batch (or micro-batch) splits over the batch axes of a mesh of these sizes."""
    t, g = cfg.train, grad_accum(cfg)
    micro = t.batch_size // g if t.batch_size % g == 0 else None
    if micro is None:
        raise ShardingError(
            f"{cfg.where('train', 'grad_accum')}: batch_size {t.batch_size} must be a positive "
            f"multiple of grad_accum {g}"
        )
    what = f"batch_size {t.batch_size}" if g == 1 else f"micro-batch {micro}"
    try:
        batch_specs(batch_from_config(cfg), cfg.rules, sizes, micro_batch=micro, what=what)
    except ShardingError as e:
        raise at_key(cfg, e, {"batch_size": ("train", "batch_size")}) from None


def more_problems(cfg: Config, devices: int | None, first: Exception) -> list[PartitioningError]:
    """The problems besides ``first`` that checks needing nothing the pre-flight builds find (mesh, positions,
    the model's options, the batch, the folders): ``check`` reports them together with the first."""
    found: list[PartitioningError] = []

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except PartitioningError as e:
            if str(e) != str(first) and str(e) not in map(str, found):
                found.append(e)
            return None

    mesh = attempt(lambda: _mesh(cfg, devices))
    attempt(lambda: check_positions(cfg))
    attempt(lambda: model_from_config(cfg))
    if mesh is not None:
        attempt(lambda: _batch_divides(cfg, {str(k): int(v) for k, v in mesh.shape.items()}))
    attempt(lambda: _dirs(cfg))
    return found


def _budget(cfg: Config) -> int | None:
    return cfg.mesh.memory_bytes if cfg.mesh.memory_bytes is not None else device_memory()


def preflight(
    cfg: Config,
    *,
    devices: int | None,
    resume: bool | None,
    compile_memory: bool | None = None,
    resume_from: int | None = None,
    measure: bool = True,
    progress: bool | str = False,
) -> Ready:
    """Runs every check ``train`` needs on this process's devices; raises the first problem as one line.

    ``measure``: False, the ``auto`` defaults are estimated or read from the cache, never timed.

    ``compile_memory``: compile the step for XLA's memory figure (default:
    only when there is a budget to compare it with). ``progress``: how tokenizing data shows progress.
    """
    mesh = _mesh(cfg, devices)
    run_dir, ckpt_dir = _dirs(cfg)  # the folders first: a look at them costs nothing, the model a build
    check_positions(cfg)  # before the model is traced at train.seq_len
    check_tokenizer_vocab(cfg)  # before the corpus is tokenized (and cached)
    decided = resolve_defaults(asked := cfg, mesh)  # estimated or cached: timed below, once every check passed
    cfg = decided.cfg
    dataset = dataset_from_config(cfg, progress)
    trainer = trainer_from_config(cfg, mesh, dataset)
    _, train, evals = data_from_config(cfg, trainer, dataset)
    target = abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    step = check_resume(ckpt_dir, target, resume, step=resume_from)
    if step is not None and cfg.checkpoint.verify:
        verify_resume(ckpt_dir, step)  # before anything is written
    note, changed, complete = _continuation(cfg, ckpt_dir, step, resume, dict(mesh.shape))
    budget = _budget(cfg)
    a = trainer.abstract_state
    opts: dict[str, Any] = {"optimizer_rules": cfg.optimizer_rules, "on_indivisible": cfg.on_indivisible}
    # The frozen params priced as `plan` prices them: stored, no gradient, no optimizer state.
    plan = build_plan(a.params, a.opt_state, mesh, cfg.rules, frozen=trainer.frozen or (), **opts)
    plan.offload, plan.offload_update = tuple(cfg.train.offload), cfg.train.offload_update  # the trainer's
    check_axes_used(cfg, plan.mesh, plan.params + plan.opt_state)
    # The train step is traced (and lowered) here, so a model that fails to trace stops the run before
    # anything is written; the compile for the memory figure reuses it.
    lowered = trainer.lower_train_step()
    compiled = None
    if compile_memory or (compile_memory is None and budget is not None):
        compiled = memory_stats(lowered.compile())
    fit = check_budget(plan, budget, compiled)
    if not fit.fits:
        raise fit.error(
            cfg.where("mesh", "device_memory")
            if cfg.mesh.device_memory is not None
            else f"{cfg.path}: the devices' memory"
        )
    if (
        measure and decided.pending and complete is None
    ):  # the defaults' choices timed: nothing is written but their verdicts
        decided = time_defaults(asked, mesh, decided, trainer, train, dataset, budget)
        if decided.trainer is not trainer:
            cfg, trainer = decided.cfg, decided.trainer or trainer_from_config(decided.cfg, mesh, dataset)
            compiled = memory_stats(trainer.lower_train_step().compile()) if budget is not None else None
            fit = check_budget(plan, budget, compiled)  # a timed choice's compiled peak fits the budget
    host = refuse_host(plan, cfg.mesh.host_memory, len(mesh.local_devices), cfg.where, compiled)
    run = (cfg, mesh, dataset, trainer, train, evals, run_dir, ckpt_dir, step, fit, plan, note, changed)
    ready = Ready(*run, default_notes=decided.notes(), host=host)
    ready.data_warning = getattr(train, "warning", None)
    if complete is not None and step is not None:
        raise RunComplete(complete, step=step, ready=ready)
    return ready


def preflight_abstract(cfg: Config, devices: int, resume: bool | None = None, resume_from: int | None = None) -> Ready:
    """The pre-flight for a mesh larger than this process can hold: from shapes only, nothing simulated."""
    try:
        sizes = mesh_sizes(cfg.mesh.shape, devices)
        MeshSpec.from_mapping(sizes, nodes=cfg.mesh.nodes)  # the nodes split the resolved sizes too
    except MeshError as e:
        key = "nodes" if e.arg == "nodes" else "shape"
        raise MeshError(f"{cfg.where('mesh', key)}: {str(e).removeprefix('nodes: ')}", arg=e.arg) from None
    plan, _ = plan_from_config(cfg, devices)
    if plan.errors:  # every array that does not divide, at the rules (as the trainer's walk says it)
        raise at_key(cfg, ShardingError(f"{'; '.join(plan.errors)}; {REMEDY}", arg="on_indivisible"), RULES_KEY)
    _batch_divides(cfg, sizes)
    task_from_config(cfg)
    run_dir, ckpt_dir = _dirs(cfg)
    # Without a trainer (no devices), an existing checkpoint's params are compared by path and shape.
    step = None
    if resume is not False and ckpt_dir.is_dir() and any(s.finalized for s in list_steps(ckpt_dir)):
        want = {leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in plan.params}
        step = check_resume(ckpt_dir, _nest(want), resume, partial=True, step=resume_from)
    elif resume is True:
        raise CheckpointError(f"--resume: no complete checkpoint in {ckpt_dir}")
    _, _, complete = _continuation(cfg, ckpt_dir, step, resume, sizes)
    fit = check_budget(plan, _budget(cfg))
    if not fit.fits:
        raise fit.error(
            cfg.where("mesh", "device_memory")
            if cfg.mesh.device_memory is not None
            else f"{cfg.path}: the devices' memory"
        )
    host = refuse_host(plan, cfg.mesh.host_memory, min(devices, jax.local_device_count()), cfg.where)
    ready = Ready(cfg, sizes, None, None, None, None, run_dir, ckpt_dir, step, fit, plan, host=host)
    if complete is not None and step is not None:
        raise RunComplete(complete, step=step, ready=ready)
    return ready


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = out
        parts = path.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = leaf
    return out


__all__ = ["Ready", "RunComplete", "preflight", "preflight_abstract", "writable_dir", "check_resume", "check_trackers"]
