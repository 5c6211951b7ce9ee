"""What ``partitioning train`` says when a run meets a fault: divergence, and the closing summary.

Example::

    >>> closing_summary("done", [{"step": 10, "loss": 2.5, "eval_loss": None}])
    'done: step 10, loss 2.500, eval_loss nan'
"""

from __future__ import annotations

import os
from typing import Any

from partitioning.checkpoint.disk import list_steps
from partitioning.config.schema import Config
from partitioning.train.nonfinite import NonFiniteError, describe


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
    return out


def last_complete(directory: Any) -> Any:
    """The newest complete checkpoint step under ``directory`` (a StepInfo), or None."""
    try:
        done = [s for s in list_steps(directory) if s.complete]
    except Exception:  # no directory yet: nothing was saved
        return None
    return done[-1] if done else None


def diverged(e: NonFiniteError, cfg: Config, manager: Any) -> NonFiniteError:
    """The one line ``train`` prints when the loss or gradient norm went NaN / inf under ``on_nonfinite: stop``."""
    at = int((e.metrics or {}).get("step", e.step))
    good = last_complete(manager.directory)
    where = (
        f"last good checkpoint: {os.path.relpath(good.path) if not os.path.isabs(str(cfg.run_dir)) else good.path} "
        f"(step {good.step})"
        if good is not None
        else "no checkpoint was saved before it"
    )
    return NonFiniteError(
        f"training diverged at {describe(e.step, at, e.metrics)}: the loss or gradient norm is not finite; "
        f"stopped without saving (train.on_nonfinite: stop); {where}; lower optimizer.lr, or set "
        f"train.on_nonfinite: skip_step to drop such steps",
        step=e.step,
        metrics=e.metrics,
    )


__all__ = ["closing_summary", "diverged", "last_complete"]
