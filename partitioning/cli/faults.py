"""``partitioning train`` meeting a fault: the run directory's lock, divergence, the closing summary.

Example::

    >>> from partitioning.cli.faults import closing_summary
    >>> closing_summary("done", [{"step": 10, "loss": 2.5, "eval_loss": None}])
    'done: step 10, loss 2.500, eval_loss nan'
    >>> closing_summary("interrupted", [{"step": 50, "eval_loss": 1.75}, {"step": 60, "loss": 1.5, "skipped_steps": 2}])
    'interrupted: step 60, loss 1.500, eval_loss 1.750 (step 50), 2 non-finite steps skipped'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from partitioning.checkpoint.disk import list_steps
from partitioning.config.schema import Config
from partitioning.train.lock import RunLock, RunLockedError
from partitioning.train.nonfinite import NonFiniteError, describe


class RunLocks:
    """The locks of a run: ``run_dir`` and, when it lies elsewhere, ``checkpoint.dir``.

    Process 0 holds them for every process of a multi-host run; the others
    learn whether it could (a one-integer broadcast), so all stop together.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.cli.faults import RunLocks
        >>> run_dir = pathlib.Path(tempfile.mkdtemp()) / "run"
        >>> cfg = pt.load_config("configs/quickstart.yaml", [f"run_dir={run_dir}", f"checkpoint.dir={run_dir}-ckpt"])
        >>> locks = RunLocks()
        >>> locks.check(cfg)      # before the pre-flight: reads only
        >>> run_dir.exists()
        False
        >>> locks.acquire()       # after it: creates RUN_DIR/.lock, and one beside a checkpoint.dir outside it
        >>> sorted(str(lock.path.relative_to(run_dir.parent)) for lock in locks.locks)
        ['run-ckpt.lock', 'run/.lock']
        >>> RunLocks().check(cfg)  # a second job on the same run
        Traceback (most recent call last):
        partitioning.train.lock.RunLockedError: .../run: run directory in use by pid ... on host ...
        >>> locks.release()
        >>> RunLocks().check(cfg)
    """

    def __init__(self) -> None:
        self.locks: list[RunLock] = []

    def _agree(self, action: Any) -> None:
        error: Exception | None = None
        if jax.process_index() == 0:
            try:
                action()
            except RunLockedError as e:
                error = e
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            failed = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
            if failed and error is None:
                where = self.locks[0].directory if self.locks else "the run directory"
                error = RunLockedError(f"{where}: process 0 found it in use by another job (see its error)")
        if error is not None:
            raise error

    def check(self, cfg: Config) -> None:
        """Refuses (RunLockedError) if another live job holds the run's directories; writes nothing."""
        run_dir = Path(cfg.run_dir)
        self.locks = [RunLock(run_dir)]
        if cfg.checkpoint.dir:
            ckpt = Path(cfg.checkpoint.dir)
            if not _inside(ckpt, run_dir):
                # Beside it, not inside: --no-resume moves the directory aside whole.
                self.locks.append(RunLock(ckpt, "checkpoint directory", ckpt.with_name(ckpt.name + ".lock")))

        def look() -> None:
            for lock in self.locks:
                lock.check()

        self._agree(look)

    def acquire(self) -> None:
        def take() -> None:
            for lock in self.locks:
                lock.acquire()

        self._agree(take)

    def release(self, undo: bool = False) -> None:
        """Frees the locks; ``undo``: a refused run also removes the lock files and folders it made."""
        for lock in self.locks:
            lock.release(undo=undo)


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def _num(v: Any) -> str:
    return "nan" if v is None else f"{v:.3f}"


def closing_summary(reason: str, records: list[dict[str, Any]]) -> str:
    """``done: step 200, loss 1.234, eval_loss 1.456``: the numbers of the last logged step.

    A NaN the log recorded (as null) is ``nan`` here too, never an older finite value.
    """
    last = records[-1] if records else {}
    out = f"{reason}: step {last.get('step', 0)}"
    if "loss" in last:
        out += f", loss {_num(last['loss'])}"
    evals = [r for r in records if "eval_loss" in r]
    if evals:
        out += f", eval_loss {_num(evals[-1]['eval_loss'])}"
        if evals[-1].get("step") != last.get("step"):
            out += f" (step {evals[-1].get('step')})"
    if last.get("skipped_steps"):
        out += f", {int(last['skipped_steps'])} non-finite steps skipped"
    return out


def last_complete(directory: Any) -> Any:
    """The newest complete checkpoint step under ``directory`` (a StepInfo), or None."""
    try:
        done = [s for s in list_steps(directory) if s.complete]
    except Exception:  # no directory yet: nothing was saved
        return None
    return done[-1] if done else None


def checkpoint_note(directory: Any) -> str | None:
    """``the last complete checkpoint is DIR/40``, for the line a dead peer prints."""
    good = last_complete(directory)
    return f"the last complete checkpoint is {good.path}" if good is not None else "no checkpoint was completed"


def diverged(e: NonFiniteError, cfg: Config, manager: Any) -> NonFiniteError:
    """The one line ``train`` prints when the loss or gradient norm went NaN / inf under ``on_nonfinite: stop``."""
    at = int((e.metrics or {}).get("step", e.step))
    good = last_complete(manager.shown)
    where = (
        f"last good checkpoint: {os.path.relpath(good.path) if not os.path.isabs(str(cfg.run_dir)) else good.path} "
        f"(step {good.step})"
        if good is not None
        else "no checkpoint was saved before it"
    )
    if e.skipped:
        return NonFiniteError(
            f"training diverged: {e.skipped} consecutive steps skipped up to step {at} (more than "
            f"{cfg.where('train', 'max_skipped_steps')} {cfg.train.max_skipped_steps}): their loss or gradient norm "
            f"is not finite; stopped without saving; "
            f"{where}; lower optimizer.lr, or raise train.max_skipped_steps",
            step=e.step,
            metrics=e.metrics,
            skipped=e.skipped,
        )
    return NonFiniteError(
        f"training diverged at {describe(e.step, at, e.metrics)}: the loss or gradient norm is not finite; "
        f"stopped without saving (train.on_nonfinite: stop); {where}; lower optimizer.lr, or set "
        f"train.on_nonfinite: skip_step to drop such steps",
        step=e.step,
        metrics=e.metrics,
    )


__all__ = ["RunLocks", "closing_summary", "diverged", "last_complete", "checkpoint_note"]
