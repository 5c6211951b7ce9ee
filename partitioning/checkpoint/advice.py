"""What a refused step's message advises: the latest good step, and how the running command picks one.

``train`` resumes from a step with ``--resume-from``; ``generate``, ``ckpt export-hf`` and ``ckpt inspect``
read one with ``--step``. A command sets its flag (:func:`step_flag`) and every damaged step it meets is
refused with advice that works there.

Example::

    >>> import pathlib
    >>> from partitioning.checkpoint.advice import damaged_error, step_flag
    >>> from partitioning.checkpoint.disk import StepInfo
    >>> good = StepInfo(1, pathlib.Path("ck/1"), True, 0, 0.0)
    >>> bad = StepInfo(2, pathlib.Path("ck/2"), False, 0, 0.0, "x")
    >>> print(damaged_error(bad, [good, bad]))
    checkpoint step 2 (ck/2) is damaged: x; not restored; the latest good step is 1: choose it explicitly \
(train --resume-from 1; step=1 from Python), or start over with --no-resume
    >>> with step_flag("--step"):
    ...     print(damaged_error(bad, [good, bad]))
    checkpoint step 2 (ck/2) is damaged: x; not restored; the latest good step is 1: choose it with --step 1
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from partitioning.checkpoint.base import BASE_DAMAGE
from partitioning.errors import CheckpointError


def good_steps_before(steps: list[Any], step: int) -> list[int]:
    return [s.step for s in steps if s.complete and s.step < step]


# How the running command picks a step (``--step`` for generate, export-hf, inspect): said in the advice.
STEP_FLAG: contextvars.ContextVar[str | None] = contextvars.ContextVar("step_flag", default=None)


@contextlib.contextmanager
def step_flag(flag: str) -> Iterator[None]:
    """Within it, a damaged step's advice names ``flag`` (``--step``), not train's ``--resume-from``."""
    token = STEP_FLAG.set(flag)
    try:
        yield
    finally:
        STEP_FLAG.reset(token)


def damaged_error(s: Any, steps: list[Any], what: str = "not restored") -> CheckpointError:
    """One line: the damaged step, its file, and the earlier good step to choose explicitly."""
    good, flag = good_steps_before(steps, s.step), STEP_FLAG.get()
    hint = (
        f"the latest good step is {good[-1]}: choose it explicitly (train --resume-from {good[-1]}; "
        f"step={good[-1]} from Python), or start over with --no-resume"
        if good and flag is None
        else f"the latest good step is {good[-1]}: choose it with {flag} {good[-1]}"
        if good
        else "no earlier good step: start over with --no-resume"
        if flag is None
        else "no earlier good step to read"
    )
    if not good and flag is not None and str(s.damage).startswith(BASE_DAMAGE):
        # Every step of the run refers to the same base: no other step helps, the right base or the adapters do.
        hint += (
            ": put back the run's own frozen params, or export the adapters, which need no base "
            "(ckpt export-hf without --merge)"
        )
    return CheckpointError(f"checkpoint step {s.step} ({s.path}) is damaged: {s.damage}; {what}; {hint}")


__all__ = ["STEP_FLAG", "step_flag", "good_steps_before", "damaged_error"]
