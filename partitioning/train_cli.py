"""``partitioning train CONFIG [--set k=v ...]``: the main job of the tool.

Builds the model, optimizer, mesh and rules from the config, trains with
:func:`partitioning.loop.fit` and writes into ``run_dir``:

- ``config.yaml``   the resolved config (overrides applied);
- ``metrics.jsonl`` one JSON object per logged step;
- ``loss.png``      the loss curve, at the end (also after Ctrl-C).

Every run checkpoints per the config's ``checkpoint:`` section and resumes
from the latest checkpoint in the run dir (``--resume`` / ``--no-resume``).
Extra hooks can be added to every run with :func:`hook_factory`: a function
``(cfg, trainer, run_dir) -> hook | None``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from partitioning import cli

HOOK_FACTORIES: list[Callable[[Any, Any, Path], Any]] = []
EXIT_CODES = {"done": 0, "interrupted": 130, "preempted": 143}


def hook_factory(fn: Callable[[Any, Any, Path], Any]) -> Callable[[Any, Any, Path], Any]:
    """Registers ``fn(cfg, trainer, run_dir) -> hook | None``, called by every ``train`` run.

    Hooks from factories run before the metrics logger, so one that restores
    a checkpoint in ``on_start`` does so before the log is trimmed to that step.
    """
    HOOK_FACTORIES.append(fn)
    return fn


def optimizer_from_config(opt: Any, total_steps: int):
    """The optax transformation for an ``optimizer:`` config section."""
    from partitioning.optimizer import make_optimizer

    return make_optimizer(
        opt.name, lr=opt.lr, total_steps=total_steps, warmup_steps=opt.warmup_steps,
        schedule=opt.schedule, min_lr_ratio=opt.min_lr_ratio, weight_decay=opt.weight_decay,
        b1=opt.b1, b2=opt.b2, eps=opt.eps, momentum=opt.momentum, clip_norm=opt.clip_norm)


def trainer_from_config(cfg: Any, mesh: Any):
    """The :class:`Trainer` for a config on ``mesh`` (its model, optimizer, rules, batch shape)."""
    from partitioning.data import VOCAB_SIZE
    from partitioning.errors import ConfigError
    from partitioning.registry import build_model
    from partitioning.train import Trainer

    model = build_model(cfg.model_name, **cfg.model_options)
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None and vocab < VOCAB_SIZE:
        raise ConfigError(f"{cfg.where('model', 'vocab_size')}: the data is bytes, so vocab_size must be "
                          f">= {VOCAB_SIZE}, got {vocab}")
    t = cfg.train
    if t.steps < 1:
        raise ConfigError(f"{cfg.where('train', 'steps')}: must be >= 1, got {t.steps}")
    from partitioning.errors import ShardingError

    try:
        return Trainer(
            model, optimizer_from_config(cfg.optimizer, t.steps), mesh, cfg.rules,
            batch_size=t.batch_size, seq_len=t.seq_len, optimizer_rules=cfg.optimizer_rules,
            on_indivisible=cfg.on_indivisible, grad_accum=t.grad_accum)
    except ShardingError as e:
        if e.arg in ("batch_size", "grad_accum"):  # Trainer arguments that are train.* keys
            raise ShardingError(f"{cfg.where('train', e.arg)}: {e}") from None
        raise


def data_from_config(cfg: Any, trainer: Any):
    """(train batches, eval-batches callable or None) for a config's ``data:`` section."""
    from partitioning.data import load_corpus

    t = cfg.train
    from partitioning.errors import DataError

    try:
        corpus = load_corpus(cfg.data.path, eval_fraction=cfg.data.eval_fraction)
    except DataError as e:
        if e.arg is None:
            raise
        raise DataError(f"{cfg.where('data', e.arg)}: {e}") from None
    train = corpus.batches("train", t.batch_size, t.seq_len, trainer.batch_sharding, seed=cfg.data.seed)
    if t.eval_batches <= 0:
        return corpus, train, None
    # A fixed eval order, independent of the train seed, keeps eval losses comparable.
    ev = corpus.batches("eval", t.batch_size, t.seq_len, trainer.batch_sharding, seed=0)
    return corpus, train, lambda: (ev.batch_at(i) for i in range(t.eval_batches))


def _train_args(p: argparse.ArgumentParser) -> None:
    cli.config_args(p)
    cli.distributed_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", dest="resume", action="store_true", default=None,
                   help="continue from the latest checkpoint (the default when one exists; error if none)")
    g.add_argument("--no-resume", dest="resume", action="store_false",
                   help="start over (existing checkpoints are moved aside, never deleted)")


@cli.command("train", _train_args)
def cmd_train(args: argparse.Namespace) -> int:
    """Train the config's model with its mesh and rules; writes RUN_DIR/metrics.jsonl, config.yaml, loss.png."""
    cfg = cli.load(args)  # sets up (simulated) devices before any jax computation
    import jax

    from partitioning.checkpoint_cli import checkpoint_hook, quiet_orbax
    from partitioning.loop import JsonlLogger, fit
    from partitioning.plots import plot_loss

    quiet_orbax()
    mesh = cli.mesh_for(cfg, args.devices)
    trainer = trainer_from_config(cfg, mesh)
    corpus, train_batches, eval_batches = data_from_config(cfg, trainer)
    run_dir = Path(cfg.run_dir)
    main = jax.process_index() == 0
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(cfg.to_yaml())
        opt = " (optimizer state: its own rules)" if cfg.optimizer_rules is not None else ""
        print(f"train: {cfg.model_name} ({trainer.num_params:,} params) on mesh {dict(mesh.shape)} "
              f"with {len(cfg.rules)} rules{opt}; data {corpus.source}: {len(corpus.train):,} train / "
              f"{len(corpus.eval):,} eval bytes; run_dir {run_dir}", flush=True)
    # The checkpoint hook goes first: it restores before the log is trimmed to that step.
    ckpt = checkpoint_hook(cfg, trainer, run_dir, resume=args.resume)
    hooks = [ckpt] + [h for f in HOOK_FACTORIES if (h := f(cfg, trainer, run_dir)) is not None]
    logger = JsonlLogger(run_dir / "metrics.jsonl")
    hooks.append(logger)
    # Restore (or init) directly, so a resumed run never holds a fresh init and
    # the restored state at once.
    state = ckpt.initial_state(trainer, jax.random.key(cfg.train.seed))
    from partitioning.loop import host_scalar

    start = int(host_scalar(state.step))
    if start >= cfg.train.steps and main:
        print(f"train: the checkpoint is already at step {start} (train.steps is {cfg.train.steps}); "
              f"raise train.steps to continue, or --no-resume to start over", flush=True)
    state = fit(trainer, state, train_batches, steps=cfg.train.steps, eval_batches=eval_batches,
                eval_every=cfg.train.eval_every, log_every=cfg.train.log_every, hooks=hooks,
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
