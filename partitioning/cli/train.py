"""``partitioning train CONFIG``: the main job of the tool.

Builds the model, optimizer, mesh and rules from the config, trains with
:func:`partitioning.fit` and writes into ``run_dir``:

- ``config.yaml``   the resolved config (overrides applied);
- ``metrics.jsonl`` one JSON object per logged step;
- ``loss.png``      the loss curve, at the end (also after Ctrl-C);
- ``checkpoints/``  per the config's ``checkpoint:`` section; a run resumes
  from the latest one (``--resume`` / ``--no-resume``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

from partitioning.cli.args import config_args, distributed_args, load_with_devices
from partitioning.config.build import checkpoint_hook_from_config, model_options_resolved
from partitioning.config.preflight import preflight
from partitioning.train.data import Corpus
from partitioning.train.hooks import JsonlLogger
from partitioning.train.loop import fit
from partitioning.train.plots import plot_loss
from partitioning.train.state import state_step

HELP = "train the config's model with its mesh and rules; writes RUN_DIR/metrics.jsonl, config.yaml, loss.png"
EXAMPLES = """examples:
  partitioning train configs/quickstart.yaml
  partitioning train configs/quickstart.yaml --no-resume --set rules=fsdp_tp --set mesh.shape.tensor=2"""
EXIT_CODES = {"done": 0, "interrupted": 130, "preempted": 143}


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    distributed_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", dest="resume", action="store_true", default=None,
                   help="continue from the latest checkpoint (the default when one exists; error if none)")
    g.add_argument("--no-resume", dest="resume", action="store_false",
                   help="start over (existing checkpoints are moved aside, never deleted)")


def _describe(dataset) -> str:
    if isinstance(dataset, Corpus):
        return dataset.describe()
    size = f": {len(dataset):,} train examples" if hasattr(dataset, "__len__") else ""
    return f"{getattr(dataset, 'source', type(dataset).__name__)}{size}"


def run(args: argparse.Namespace) -> int:
    cfg = load_with_devices(args)  # sets up (simulated) devices before any jax computation
    # Every check first: a run that fails here has written nothing.
    ready = preflight(cfg, devices=args.devices, resume=args.resume)
    trainer, mesh, run_dir = ready.trainer, ready.mesh, ready.run_dir
    train_batches, eval_batches = ready.train_batches, ready.eval_batches
    main = jax.process_index() == 0
    log = (lambda m: print(m, flush=True)) if main else (lambda m: None)
    # The checkpoint hook goes first: it restores before the log is trimmed to that step.
    ckpt = checkpoint_hook_from_config(cfg, trainer, run_dir, resume=args.resume, log=log)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(cfg.to_yaml(dict(mesh.shape), model_options_resolved(cfg)))
        opt = " (optimizer state: its own rules)" if cfg.optimizer_rules is not None else ""
        print(f"train: {cfg.model_name} ({trainer.num_params:,} params) on mesh {dict(mesh.shape)} "
              f"with {len(cfg.rules)} rules{opt}; task {trainer.task.name}; data {_describe(ready.dataset)}; "
              f"run_dir {run_dir}", flush=True)
        if ready.budget is not None and ready.budget.budget is not None:
            print(f"memory: {ready.budget.describe()}", flush=True)
        if ready.data_note:
            print(ready.data_note, flush=True)
    logger = JsonlLogger(run_dir / "metrics.jsonl")
    # Restore (or init) directly, so a resumed run never holds a fresh init and
    # the restored state at once.
    state = ckpt.initial_state(trainer, jax.random.key(cfg.train.seed))
    start = state_step(state)
    if start >= cfg.train.steps and main:
        print(f"train: the checkpoint is already at step {start} (train.steps is {cfg.train.steps}); "
              f"raise train.steps to continue, or --no-resume to start over", flush=True)
    state = fit(trainer, state, train_batches, steps=cfg.train.steps, eval_batches=eval_batches,
                eval_every=cfg.train.eval_every, log_every=cfg.train.log_every, hooks=[ckpt, logger],
                progress=not args.no_progress)
    reason = logger.reason or "done"
    if main:
        if logger.records:
            plot_loss(logger.records, run_dir / "loss.png", title=f"{Path(cfg.path).stem}: {cfg.model_name}")
        last = logger.records[-1] if logger.records else {}
        evals = [r["eval_loss"] for r in logger.records if r.get("eval_loss") is not None]
        summary = f"{reason}: step {last.get('step', 0)}"
        if last.get("loss") is not None:
            summary += f", loss {last['loss']:.3f}"
        if evals:
            summary += f", eval_loss {evals[-1]:.3f}"
        print(f"{summary}; wrote {run_dir / 'metrics.jsonl'}, {run_dir / 'loss.png'}", flush=True)
    return EXIT_CODES[reason]
