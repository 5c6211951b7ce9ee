"""Experiment trackers as loop hooks: TensorBoard event files and Weights & Biases.

Both write from process 0 only, on logged steps (see :func:`partitioning.fit`).
Metric names map to tags the way TensorBoard groups them: ``eval_loss`` ->
``eval/loss``; throughput (``tokens_per_s``, ``step_time_s``,
``tflops_per_device``, ``mfu``) -> ``perf/...``; the rest (``loss``, ``lr``,
``grad_norm``, ...) -> ``train/...``.

A resumed run keeps one curve: the TensorBoard writer purges the events a
previous run wrote after the restored step, and W&B resumes the same run id
(kept in ``RUN_DIR/wandb_run_id``).

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> import pathlib, tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=2,
    ...                hooks=[pt.train.TensorBoardLogger(run / "tensorboard")], progress=False)
    >>> any((run / "tensorboard").iterdir())
    True

The viewer is an extra (writing the files needs only tensorboardX):
``pip install 'partitioning[tensorboard]'``, then ``tensorboard --logdir RUN/tensorboard``.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from partitioning.errors import ConfigError
from partitioning.outdir import file_in_the_way
from partitioning.train.state import state_step

PERF = ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu")


def tag(name: str) -> str:
    """The tracker tag of a logged metric name.

    Example::

        >>> from partitioning.train.trackers import tag
        >>> tag("eval_loss"), tag("lr"), tag("tflops_per_device")
        ('eval/loss', 'train/lr', 'perf/tflops_per_device')
    """
    if name.startswith("eval_"):
        return "eval/" + name[len("eval_") :]
    return ("perf/" if name in PERF else "train/") + name


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``{tag: value}`` of the finite numbers among logged metrics (``step`` is the x axis, not a scalar)."""
    out = {}
    for k, v in metrics.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[tag(k)] = float(v)
    return out


def tensorboard_hint(logdir: str | Path) -> str:
    """How to look at the curves: the ``tensorboard`` command, or how to install it when it is not there.

    Example::

        >>> from partitioning.train.trackers import tensorboard_hint
        >>> print(tensorboard_hint("runs/x/tensorboard"))   # without tensorboard on PATH: how to install it first
        view the curves: ...tensorboard --logdir runs/x/tensorboard
    """
    cmd = f"tensorboard --logdir {logdir}"
    if shutil.which("tensorboard") is None:
        return f"view the curves: pip install 'partitioning[tensorboard]', then {cmd}"
    return f"view the curves: {cmd}"


class TensorBoardLogger:
    """Hook writing logged metrics as TensorBoard scalars under ``logdir`` (tensorboardX).

    Events are flushed at every eval and on exit (and by the writer every 30 s).

    Example::

        >>> import pathlib, tempfile
        >>> logger = pt.train.TensorBoardLogger(pathlib.Path(tempfile.mkdtemp()) / "tensorboard")
        >>> logger.on_step_end(1, None, {"loss": 2.5, "eval_loss": 2.7})   # what fit calls on logged steps
        >>> logger.on_exit(None, "done")
    """

    def __init__(self, logdir: str | Path):
        self.logdir = Path(logdir)
        blocker = file_in_the_way(self.logdir)
        if blocker is not None:
            raise ConfigError(f"{self.logdir}: cannot write TensorBoard events: {blocker} is a file", arg="logdir")
        self.writer: Any = None

    def on_start(self, state: Any) -> Any:
        if jax.process_index() == 0:
            from tensorboardX import SummaryWriter  # imported here: only runs that log need it

            start = state_step(state)
            # A resumed run: TensorBoard drops the old events after the restored step. File names
            # carry the second they were made: the suffix keeps a quick restart from overwriting one.
            self.writer = SummaryWriter(
                str(self.logdir),
                purge_step=start + 1 if start > 0 else None,
                flush_secs=30,
                filename_suffix=f".{os.getpid()}.{start}",
            )
        return state

    def on_step_end(self, step: int, state: Any, metrics: Mapping[str, Any] | None) -> None:
        if self.writer is None or metrics is None:
            return
        for name, value in scalars(metrics).items():
            self.writer.add_scalar(name, value, global_step=int(step))
        if any(k.startswith("eval_") for k in metrics):
            self.writer.flush()

    def on_exit(self, state: Any, reason: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbLogger:
    """Hook logging metrics to Weights & Biases (``pip install 'partitioning[wandb]'``).

    ``project`` defaults to ``$WANDB_PROJECT`` or ``partitioning``; the run is
    named after ``run_dir`` and files go under ``run_dir/wandb``. W&B's own
    environment variables apply (``WANDB_MODE=offline`` logs without a server).

    ``pt.fit(trainer, state, batches, steps=100, hooks=[logger])`` logs to the run from the first step.

    Example::

        >>> logger = pt.train.WandbLogger("runs/x", project="my-project", config={"lr": 3e-3})   # nothing sent yet
        >>> logger.project, logger.config
        ('my-project', {'lr': 0.003})
    """

    def __init__(self, run_dir: str | Path, *, project: str | None = None, config: Mapping[str, Any] | None = None):
        self.run_dir, self.project, self.config = Path(run_dir), project, dict(config or {})
        self.run: Any = None

    def on_start(self, state: Any) -> Any:
        if jax.process_index() != 0:
            return state
        import wandb

        id_file = self.run_dir / "wandb_run_id"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run_id = id_file.read_text().strip() if id_file.exists() and state_step(state) > 0 else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=self.project or os.environ.get("WANDB_PROJECT", "partitioning"),
            name=self.run_dir.name,
            dir=str(self.run_dir),
            id=run_id,
            resume="allow",
            config=self.config,
        )
        return state

    def on_step_end(self, step: int, state: Any, metrics: Mapping[str, Any] | None) -> None:
        if self.run is not None and metrics is not None:
            self.run.log(scalars(metrics), step=int(step))

    def on_exit(self, state: Any, reason: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if reason == "done" else 1)
            self.run = None


__all__ = ["TensorBoardLogger", "WandbLogger", "tag", "scalars", "tensorboard_hint"]
