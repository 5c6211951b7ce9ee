"""The one pre-flight of ``train`` and ``check``: the same checks in the same order, so they agree by construction.

``train`` runs :func:`pre_flight` and stops at its first problem; ``check`` runs the
same function with ``every=True`` and reports every problem at once (the first of them
is the line ``train`` would print; after it, what the checks that need nothing built find:
:func:`~partitioning.config.preflight.more_problems`). The checks, in order:

1. the run's lock: another job holding ``run_dir`` (or ``checkpoint.dir``) refuses;
2. the Hugging Face weights a fresh run starts from (``model.hf``): safetensors there, whole
   headers, every tensor with the shape ``config.json`` implies (no weight is read);
3. :func:`partitioning.config.preflight.preflight` (mesh, model, batch, data, dirs, the checkpoint
   a resume reads, tracing, memory); meshes larger than this process are checked from shapes.

A run already at ``train.steps`` is :class:`~partitioning.config.preflight.RunComplete`: ``train``
refuses it (nothing to train), ``check`` states it (exit 0).
"""

from __future__ import annotations

from typing import Any

from partitioning.config.hf import check_hf_weights, has_checkpoint
from partitioning.config.preflight import Ready, RunComplete, more_problems, preflight, preflight_abstract
from partitioning.config.schema import Config
from partitioning.errors import PartitioningError


def pre_flight(
    cfg: Config,
    locks: Any,
    *,
    devices: int | None,
    resume: bool | None,
    resume_from: int | None = None,
    abstract_devices: int | None = None,
    every: bool = False,
    measure: bool = True,
    progress: bool | str = True,
) -> tuple[Ready | None, list[PartitioningError]]:
    """(what the pre-flight built, the problems found). Without ``every`` the first problem is raised.

    ``measure``: False, the ``auto`` defaults are estimated (or read from the cache), never timed (``check``).

    ``abstract_devices``: check a mesh of that many devices from shapes alone (``check`` of a large mesh).
    ``progress``: how tokenizing the data shows progress (``train --no-progress``: quiet).
    """
    problems: list[PartitioningError] = []

    def step(fn: Any) -> Any:
        try:
            return fn()
        except PartitioningError as e:
            if not every:
                raise
            problems.append(e)
            return None

    step(lambda: locks.check(cfg))
    if cfg.model_hf is not None and (resume is False or not has_checkpoint(cfg)):
        step(lambda: check_hf_weights(cfg))  # a fresh run starts from them
    if abstract_devices is not None:
        ready = step(lambda: preflight_abstract(cfg, abstract_devices, resume=resume, resume_from=resume_from))
    else:
        ready = step(
            lambda: preflight(
                cfg, devices=devices, resume=resume, resume_from=resume_from, measure=measure, progress=progress
            )
        )
        if every and problems and not isinstance(problems[-1], RunComplete):
            problems += more_problems(cfg, devices, problems[-1])  # after the first: train's line stays first
    return ready, problems


__all__ = ["pre_flight"]
