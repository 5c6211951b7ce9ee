"""The training-loop hook: resume on start, save every K steps, save on exit.

Example::

    >>> import optax, pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> run_dir = pathlib.Path(tempfile.mkdtemp())
    >>> hook = pt.checkpoint.CheckpointHook(pt.CheckpointManager(run_dir / "checkpoints", every=2, rules=trainer.rules))
    >>> state = hook.initial_state(trainer, jax.random.key(0))   # restore or init
    >>> state = pt.fit(trainer, state, batches, steps=4, hooks=[hook], progress=False)
    >>> sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    [2, 4]
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from partitioning.checkpoint.disk import list_steps
from partitioning.checkpoint.manager import CheckpointManager
from partitioning.checkpoint.restore import abstract_target, target_like
from partitioning.errors import CheckpointError
from partitioning.train.state import state_step


class CheckpointHook:
    """Loop hook: resume on start, save every K steps, save on exit (done / Ctrl-C / SIGTERM).

    ``target`` is the restore target (:func:`abstract_target` of the trainer's
    abstract state); without it, the state given to ``on_start`` provides the
    shapes and shardings and its buffers are freed before reading (as donation
    would), so a resume never holds two states.

    Example::

        >>> import optax, pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
        >>> run_dir = pathlib.Path(tempfile.mkdtemp())
        >>> manager = pt.CheckpointManager(run_dir / "checkpoints", every=2, rules=trainer.rules)
        >>> hook = pt.checkpoint.CheckpointHook(manager)
        >>> state = hook.initial_state(trainer, jax.random.key(0))   # restore or init
        >>> state = pt.fit(trainer, state, batches, steps=4, hooks=[hook], progress=False)
        >>> sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
        [2, 4]
        >>> hook = pt.checkpoint.CheckpointHook(pt.CheckpointManager(run_dir / "checkpoints", every=2))
        >>> int(hook.initial_state(trainer, jax.random.key(0)).step)   # a second run resumes
        4
    """

    def __init__(
        self,
        manager: CheckpointManager,
        *,
        target: Any = None,
        resume: bool = True,
        save_on_exit: bool = True,
        free_init: bool = True,
        log: Any = None,
        on_error: str = "stop",
        verify: bool = True,
        step: int | None = None,
        warn: Any = None,
    ):
        self.manager, self.target, self.resume = manager, target, resume
        self.save_on_exit, self.free_init = save_on_exit, free_init
        self.log = log or (lambda msg: None)
        if on_error not in ("stop", "continue"):
            raise ValueError(f"on_error must be 'stop' or 'continue', got {on_error!r}")
        self.on_error, self.verify = on_error, verify
        self.step = step  # resume from this step, not the latest (the later ones are set aside)
        # A failed save under on_error="continue" goes to stderr (process 0): it is a problem, not progress.
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True) if jax.process_index() == 0 else None)
        self.unsaved: str | None = None  # why the final state is not on disk (on_error="continue"), or None
        self.restored_step: int | None = None
        self._started = False
        self._last_metrics: tuple[int, Mapping[str, Any]] | None = None
        self._tried: int | None = None

    def initial_state(self, trainer: Any, rng: Any, init: Any = None) -> Any:
        """Restores the latest checkpoint onto the trainer's layout if resuming, else ``trainer.init(rng)``
        (or ``init()``: e.g. ``lambda: trainer.init_from(pretrained_params)``, never called on a resume)."""
        if self.manager.frozen is None:  # the trainer's frozen params are written once per run
            self.manager.frozen = getattr(trainer, "frozen", None)
        if self.resume and self.manager.latest_step() is not None:
            target = self.target or abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
            return self._restore(target)
        self._started = True
        return init() if init is not None else trainer.init(rng)

    def _restore(self, target: Any) -> Any:
        state = self.manager.restore(target, self.step, verify=self.verify)
        self.restored_step = state_step(state)
        if self.step is not None:
            for moved in self.manager.set_aside_after(self.step):
                self.log(f"checkpoint: resuming from step {self.step}: moved the later {moved}")
        self._started = True
        self.log(f"checkpoint: resumed from step {self.restored_step} ({self.manager.shown})")
        return state

    def on_start(self, state: Any) -> Any:
        if self._started or not self.resume or self.manager.latest_step() is None:
            self._started = True
            return state
        target = self.target or target_like(state)
        if self.free_init:
            for x in jax.tree.leaves(state):
                if isinstance(x, jax.Array) and not x.is_deleted():
                    x.delete()
        return self._restore(target)

    def wants_state(self, step: int) -> bool:
        """True when this step saves: the loop checks the state is finite first (see :func:`fit`)."""
        return self.manager.should_save(int(step))

    def on_step_end(self, step: int, state: Any, metrics: Mapping[str, Any] | None = None) -> None:
        if metrics is not None:
            self._last_metrics = (int(step), metrics)  # for a save on exit at this step
        with self._failures():
            self.manager.check()  # a failed asynchronous save stops the run now if orbax knows it already
        if self.manager.should_save(int(step)):
            with self._failures():
                self.manager.wait()  # the previous save's failure, under its own step
            self._tried = int(step)  # saved, or failed: not tried again on exit
            with self._failures():
                self.manager.save(int(step), state, metrics=metrics, force=True)
                self.unsaved = None

    @contextlib.contextmanager
    def _failures(self):
        """A checkpoint that cannot be written stops the run (CheckpointError), or with
        ``on_error="continue"`` is reported on one line and training goes on."""
        try:
            yield
        except CheckpointError as e:
            if self.on_error != "continue":
                raise
            self.unsaved = str(e)
            self.warn(f"checkpoint: not saved: {e}; training goes on (checkpoint.on_error: continue)")

    def on_exit(self, state: Any, reason: str = "done") -> None:
        try:
            leaves = jax.tree.leaves(state) if state is not None else []
            # A step interrupted after donating its input leaves nothing to save.
            alive = leaves and not any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves)
            # A diverged state ("nonfinite") or a run that failed is never saved.
            step = state_step(state) if alive else None
            good = step is not None and reason not in ("nonfinite", "failed")
            if self.save_on_exit and step is not None and good and step != self._tried:
                last = self._last_metrics
                metrics = last[1] if last is not None and last[0] == step else None
                with self._failures():
                    if self.manager.save(step, state, metrics=metrics, force=True):
                        self.manager.wait()
                        self.unsaved = None
                        self.log(f"checkpoint: saved step {step} to {self.manager.shown} ({reason})")
            elif good and step == self._tried and self.unsaved is None:
                # The last step was a save step: its save is the final state's, said once it is on disk.
                with self._failures():
                    self.manager.wait()
                    if self.unsaved is None:
                        self.log(f"checkpoint: saved step {step} to {self.manager.shown} ({reason})")
        finally:
            with self._failures():
                self.manager.close()


def prepare_directory(directory: str | os.PathLike, resume: bool | None, log: Any = None) -> Path:
    """Gets a checkpoint directory ready for a run that resumes (``None``: if it can; ``True``: must)
    or starts over (``False``: existing checkpoints are moved aside to ``DIR.prev-TIME``, never deleted).
    """
    directory = Path(directory)
    say = log or (lambda msg: None)
    if resume is False and directory.exists() and any(directory.iterdir()):
        aside = directory.with_name(f"{directory.name}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
        if jax.process_index() == 0:
            directory.rename(aside)
        say(f"checkpoint: --no-resume: moved existing checkpoints to {aside}")
    if resume is True and not any(s.finalized for s in (list_steps(directory) if directory.is_dir() else [])):
        raise CheckpointError(f"--resume: no complete checkpoint in {directory}")
    return directory


__all__ = ["CheckpointHook", "prepare_directory"]
