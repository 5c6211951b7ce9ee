"""Loop hooks that record a run: metrics as JSON lines.

A hook is any object with some of ``on_start(state)``, ``on_step_end(step,
state, metrics)`` and ``on_exit(state, reason)`` (see :func:`partitioning.fit`).

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> import pathlib, tempfile
    >>> logger = pt.train.JsonlLogger(pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl")
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, hooks=[logger], progress=False)
    >>> logger.records[-1]["step"], "loss" in logger.records[-1], logger.path.exists()
    (4, True, True)
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import jax

from partitioning.errors import ConfigError
from partitioning.outdir import file_in_the_way
from partitioning.train.state import state_step


class JsonlLogger:
    """Hook writing one JSON object per logged step to ``path`` (process 0 only; ``None``: keep them in memory).

    On start it keeps only the records of steps up to the (possibly restored)
    start step, so a resumed run's file reads like an uninterrupted one.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
        >>> logger = pt.train.JsonlLogger(None)   # in memory only; a path writes metrics.jsonl too
        >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=3, log_every=1,
        ...                hooks=[logger], progress=False)
        >>> [r["step"] for r in logger.records], logger.reason
        ([1, 2, 3], 'done')
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        if self.path is not None:  # refused here, not at the first logged step after a compilation
            blocker = self.path if self.path.is_dir() else file_in_the_way(self.path.parent)
            if blocker is not None:
                what = "a folder; name a file (metrics.jsonl)" if blocker == self.path else f"{blocker} is a file"
                raise ConfigError(f"{self.path}: cannot write the metrics: {what}", arg="path")
        self.records: list[dict[str, float | None]] = []  # None: a NaN or infinite value
        self.reason: str | None = None

    def on_start(self, state: Any) -> Any:
        start = state_step(state)
        if jax.process_index() == 0 and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if start > 0 and self.path.exists():
                for line in self.path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        rec = json.loads(line)
                        if rec.get("step", math.inf) <= start:
                            kept.append(rec)
            self.records = kept
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return state

    def on_step_end(self, step: int, state: Any, metrics: dict[str, float] | None) -> None:
        if metrics is None or jax.process_index() != 0:
            return
        # Strict JSON has no NaN / Infinity: a diverged loss is written as null.
        rec = {"step": int(step), **{k: (v if math.isfinite(v) else None) for k, v in metrics.items() if k != "step"}}
        self.records.append(rec)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    def on_exit(self, state: Any, reason: str) -> None:
        self.reason = reason


__all__ = ["JsonlLogger"]
