"""Which steps ``keep`` keeps: damaged steps never count, and the healthiest step is never pruned.

Orbax's ``LatestN`` counts every step directory it knows. Two faults made that prune the wrong step:

- a damaged step (a part deleted, its checksums missing) counted toward ``keep``, so a good step was
  pruned in its favour. Here only complete steps are counted; a damaged one is kept where it is (it is
  the evidence) and never restored (:mod:`partitioning.checkpoint.integrity`);
- a run that diverges slowly saves finite but ruined states, which rotated the healthy ones out. Here a
  run is diverging when the newest step's recorded loss (``eval_loss`` when steps have one, else the
  training ``loss``) is above ``DIVERGED`` (1.5) times the lowest; the step with the lowest is then kept as
  well, whatever ``keep`` is, so the last healthy checkpoint of a diverging run survives (docs/faults.md).

Example::

    >>> import datetime, pathlib, tempfile, types
    >>> from partitioning.checkpoint.keep import KeepGood
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> info = lambda step: types.SimpleNamespace(step=step, metrics=None, time=datetime.datetime.now())
    >>> KeepGood(d, keep=2).should_preserve([info(s) for s in (1, 2, 3)], context=None)   # steps not on disk yet
    [False, True, True]
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partitioning.checkpoint.disk import META_FILE, META_ITEM, TMP_SUFFIX, step_damage


def saved_metrics(step_dir: Path) -> dict[str, float]:
    """The finite metrics a step was saved with (``{}``: none recorded)."""
    try:
        metrics = json.loads((step_dir / META_ITEM / META_FILE).read_text()).get("metrics") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}


DIVERGED = 1.5  # the newest step's loss above this many times the lowest one: the run is diverging


def healthiest(steps: dict[int, dict[str, float]]) -> int | None:
    """The step to keep for a diverging run: the lowest eval_loss (if any step has one, else training loss),
    when the newest step with that metric is above DIVERGED times it; None when the run is not diverging."""
    key = "eval_loss" if any("eval_loss" in m for m in steps.values()) else "loss"
    scores = sorted((step, m[key]) for step, m in steps.items() if key in m)
    if not scores:
        return None
    best_loss, best = min((loss, step) for step, loss in scores)
    newest = scores[-1][1]
    return best if newest > DIVERGED * best_loss and newest > best_loss else None


class KeepGood:
    """An orbax preservation policy: the last ``keep`` complete steps, the healthiest one, and damaged ones.

    ``inner`` (e.g. orbax's ``BestN`` for ``keep_best``) preserves more, never less. ``keep <= 0`` keeps all.
    """

    def __init__(self, directory: Path, keep: int, inner: Sequence[Any] = ()):
        self.directory, self.keep, self.inner = Path(directory), int(keep), list(inner)

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
        n = len(checkpoints)
        if self.keep <= 0:
            return [True] * n
        damaged = []
        for info in checkpoints:
            d = self.directory / str(info.step)
            # A step still being written (only its tmp directory exists) is not damaged.
            damaged.append(d.is_dir() and TMP_SUFFIX not in d.name and step_damage(d) is not None)
        good = [i for i in range(n) if not damaged[i]]
        out = [damaged[i] for i in range(n)]
        for i in good[-self.keep :]:
            out[i] = True
        best = healthiest({checkpoints[i].step: saved_metrics(self.directory / str(checkpoints[i].step)) for i in good})
        for i in good:
            out[i] = out[i] or checkpoints[i].step == best
        for policy in self.inner:
            for i, keep in enumerate(policy.should_preserve(checkpoints, context=context)):
                out[i] = out[i] or bool(keep)
        return out


__all__ = ["KeepGood", "healthiest", "saved_metrics", "DIVERGED"]
