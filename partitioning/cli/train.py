"""``partitioning train CONFIG``: the main job of the tool.

Builds the model, optimizer, mesh and rules from the config, trains with
:func:`partitioning.fit` and writes into ``run_dir``:

- ``config.yaml``   the resolved config (overrides applied);
- ``metrics.jsonl`` one JSON object per logged step (tracker ``jsonl``);
- ``tensorboard/``  TensorBoard event files (tracker ``tensorboard``);
- ``loss.png``      the loss curve, redrawn at every eval and at the end (also after Ctrl-C);
- ``checkpoints/``  per the config's ``checkpoint:`` section; a run resumes
  from the latest one (``--resume`` / ``--no-resume``).

On a terminal, progress is a bar; otherwise (or with ``--no-progress``) one
line per logged step. Both show TFLOP/s per device (the compiled step's FLOPs)
and MFU where the device's peak is known (``--peak-tflops`` sets it).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import jax

from partitioning import peers
from partitioning.cli.args import config_args, distributed_args, load_with_devices, resume_args, resume_of, say
from partitioning.cli.faults import RunLocks, checkpoint_note, closing_summary, diverged
from partitioning.cli.preflight import pre_flight
from partitioning.cli.render import nodes_line
from partitioning.config.build import model_options_resolved
from partitioning.config.hf import hf_params_from_config
from partitioning.config.run import checkpoint_hook_from_config, trackers_from_config
from partitioning.config.rundir import move_previous_run, write_file
from partitioning.config.schema import Config
from partitioning.data.corpus import Corpus
from partitioning.errors import ConfigError
from partitioning.mesh import mesh_node_ids
from partitioning.plan.axes import node_layout
from partitioning.plan.flops import peak_tflops, transformer_flops
from partitioning.train.loop import fit
from partitioning.train.nonfinite import NonFiniteError
from partitioning.train.plots import LossPlot
from partitioning.train.state import state_step
from partitioning.train.trackers import TensorBoardLogger, tensorboard_hint

HELP = "train the config's model with its mesh and rules; writes RUN_DIR/metrics.jsonl, config.yaml, loss.png"
EXAMPLES = """examples:
  partitioning train configs/quickstart.yaml
  partitioning train configs/quickstart.yaml --no-resume --set rules=fsdp_tp --set mesh.shape.tensor=2"""
EXIT_CODES = {"done": 0, "interrupted": 130, "preempted": 143}


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    distributed_args(p)
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar: one plain line per logged step (the default when not on a terminal); "
        "tokenizing data says nothing until it is done",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        metavar="T",
        default=None,
        help="the device's peak TFLOP/s, for MFU (default: known GPUs/TPUs; none on CPUs)",
    )
    resume_args(p)


def _describe(dataset) -> str:
    if isinstance(dataset, Corpus):
        return dataset.describe()
    size = f": {len(dataset):,} train examples" if hasattr(dataset, "__len__") else ""
    return f"{getattr(dataset, 'source', type(dataset).__name__)}{size}"


def _flops_line(trainer, flops: float | None, peak: float | None) -> str:
    """What the compiled step costs: FLOPs per device and in all, 6·N·tokens for language models, the peak."""
    if flops is None:
        return "flops: the backend gives no cost analysis; no TFLOP/s or MFU"
    n = trainer.mesh.size
    out = f"flops: {flops / 1e12:.4g} TFLOP per step per device ({flops * n / 1e12:.4g} on {n} devices, compiled step)"
    if trainer.seq_len:
        out += f"; 6·N·tokens {transformer_flops(trainer.num_params, trainer.batch_size * trainer.seq_len) / 1e12:.4g}"
    return out + (f"; peak {peak:g} TFLOP/s per device" if peak else "; no peak known for this device: no MFU")


def plot_title(cfg: Config) -> str:
    """``hf_tiny: llama + LoRA``: the config's name and the model's (a checkpoint by its folder's name, not its
    whole path, which would not fit a plot's title)."""
    name = cfg.model_name
    if cfg.model_hf is not None:
        source = Path(cfg.model_hf)
        name = (source.parent if source.suffix == ".json" else source).resolve().name
    lora = "lora" in cfg.model_options or "adapter" in cfg.model_options
    return f"{Path(cfg.path).stem}: {name}{' + LoRA' if lora else ''}"


def run(args: argparse.Namespace) -> int:
    locks = RunLocks()  # one writer per run directory
    done = False
    try:
        code = _train(args, locks)
        done = True
        return code
    finally:
        # A run refused before it wrote anything leaves no lock file behind (nor the run dir it made for it).
        locks.release(undo=not done and not _wrote(locks))


def _wrote(locks: RunLocks) -> bool:
    """Whether the run wrote anything beside its lock files (then they stay, naming their last holder)."""
    for lock in locks.locks:
        folder = lock.directory
        if folder.is_dir() and any(p != lock.path for p in folder.iterdir()):
            return True
    return False


def _train(args: argparse.Namespace, locks: RunLocks) -> int:
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ConfigError(
            f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops:g}", arg="--peak-tflops"
        )
    cfg = load_with_devices(args)  # sets up (simulated) devices before any jax computation
    resume = resume_of(args)
    # Every check first, the same as `check` makes (cli/preflight.py): a run that fails here has written nothing.
    ready, _ = pre_flight(
        cfg, locks, devices=args.devices, resume=resume, resume_from=args.resume_from, progress=not args.no_progress
    )
    assert ready is not None  # without every=True the first problem was raised
    locks.acquire()
    cfg = ready.cfg  # with every `auto` default decided
    trainer, mesh, run_dir = ready.trainer, ready.mesh, ready.run_dir
    assert trainer is not None  # preflight (unlike preflight_abstract) builds the trainer
    train_batches, eval_batches = ready.train_batches, ready.eval_batches
    main = jax.process_index() == 0
    log = (lambda m: print(m, flush=True)) if main else (lambda m: None)
    # Pretrained weights are read before anything is written (a bad checkpoint fails the run cleanly),
    # and only when there is no checkpoint of the run's own to resume from.
    pretrained = None
    if cfg.model_hf is not None and ready.resume_step is None:
        pretrained = hf_params_from_config(cfg, mesh)
    if ready.resume_step is None:  # starting over: the previous run's history goes with its checkpoints
        move_previous_run(run_dir, ready.checkpoint_dir, log)
    # The checkpoint hook goes first: it restores before the log is trimmed to that step.
    ckpt = checkpoint_hook_from_config(cfg, trainer, run_dir, resume=resume, log=log, step=args.resume_from)
    peers.set_note(lambda: checkpoint_note(ckpt.manager.shown))  # said if another process dies
    resolved = cfg.resolved(dict(mesh.shape), model_options_resolved(cfg))
    if main:
        opt = " (optimizer state: its own rules)" if cfg.optimizer_rules is not None else ""
        print(
            f"train: {cfg.model_name} ({trainer.num_params:,} params) on mesh {dict(mesh.shape)} "
            f"with {len(cfg.rules)} rules{opt}; task {trainer.task.name}; data {_describe(ready.dataset)}; "
            f"run_dir {run_dir}",
            flush=True,
        )
        ids = mesh_node_ids(mesh)  # several processes: where the axes landed, from each device's process
        if ids is not None:
            print(nodes_line(node_layout(dict(mesh.shape), ids=ids), configured=False), flush=True)
        for line in ready.default_notes:
            print(line, flush=True)
        if ready.budget is not None and ready.budget.budget is not None:
            print(f"memory: {ready.budget.describe()}", flush=True)
        if ready.host is not None:  # train.offload: the state in host memory, against the host's budget
            print(f"memory: {ready.host.describe()}", flush=True)
        for note in (ready.resume_note, ready.data_note, getattr(train_batches, "note", None)):
            if note:
                print(note, flush=True)
        if ready.data_warning:
            say(f"warning: {ready.data_warning}")
    logger, trackers = trackers_from_config(cfg, run_dir, resolved)
    plot = LossPlot(logger, run_dir / "loss.png", title=plot_title(cfg))
    # Restore (or init) directly, so a resumed run never holds a fresh init and
    # the restored state at once.
    init = None
    if pretrained is not None:
        log(f"train: starting from the Hugging Face weights in {cfg.model_hf}")
        init = functools.partial(trainer.init_from, pretrained)
    state = ckpt.initial_state(trainer, jax.random.key(cfg.train.seed), init=init)
    init = pretrained = None  # the state holds the params now
    if main:  # the run record, once the state is restored: a failed resume leaves the old one as it was
        write_file(run_dir / "config.yaml", cfg.to_yaml(dict(mesh.shape), model_options_resolved(cfg)))
    start = state_step(state)  # below train.steps: the pre-flight refused a run with nothing to train
    flops = peak = None
    if start < cfg.train.steps:
        flops = trainer.step_flops()  # compiles the step (the loop then reuses it)
        peak = args.peak_tflops if args.peak_tflops is not None else peak_tflops(jax.devices()[0])
        log(_flops_line(trainer, flops, peak))
    try:
        state = fit(
            trainer,
            state,
            train_batches,
            steps=cfg.train.steps,
            eval_batches=eval_batches,
            eval_every=cfg.train.eval_every,
            log_every=cfg.train.log_every,
            hooks=[ckpt, logger, *trackers, plot],
            progress="lines" if args.no_progress else True,
            flops_per_step=flops,
            peak_tflops=peak,
            max_skipped=cfg.train.max_skipped_steps,
        )
    except NonFiniteError as e:
        raise diverged(e, cfg, ckpt.manager) from None
    reason = logger.reason or "done"
    if main:
        summary = closing_summary(reason, logger.records)
        if ckpt.unsaved is not None:
            summary += "; final state NOT saved (see the error below)"
        wrote = [run_dir / "metrics.jsonl"] if logger.path is not None else []
        wrote += [t.logdir for t in trackers if hasattr(t, "logdir")]
        wrote += [run_dir / "loss.png"] if logger.records else []
        for t in trackers:  # before the summary, which stays the last line
            if isinstance(t, TensorBoardLogger):
                print(tensorboard_hint(t.logdir), flush=True)
        print(f"{summary}; wrote {', '.join(str(w) for w in wrote) or 'nothing'}", flush=True)
    if ckpt.unsaved is not None:
        # on_error: continue trained on past a failed save, but the run's last state is not on disk: not a success.
        say(
            f"error: the final state (step {state_step(state)}) is not saved: {ckpt.unsaved} "
            f"(checkpoint.on_error: continue); exit status 2"
        )
        return 2
    return EXIT_CODES[reason]
