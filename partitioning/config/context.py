"""``model.context_parallel: auto`` (the default): the attention strategy for a split ``length``, resolved at run start.

When the run's rules split the activations' ``length`` over mesh axes of size > 1 (the ``fsdp_cp`` preset's
``context`` axis), ``auto`` becomes the strategy ``tune`` prices faster for this model, layout and
hardware — ``ring`` or ``all_gather`` (:mod:`partitioning.parallel.context`) — among those that fit the
device memory (the smaller peak when neither fits), before the model is built. Without a split it stays
``auto`` (there is nothing to choose). ``train`` and ``check`` print the choice and why in one line; a
strategy written in the config is used as it is.

Example::

    >>> from partitioning.config.context import resolve_context
    >>> cfg = pt.load_config("configs/quickstart.yaml", ["rules=fsdp_cp", "mesh.shape={data: 1, fsdp: 2, context: 4}"])
    >>> resolved, note = resolve_context(cfg, pt.make_mesh({"data": 1, "fsdp": 2, "context": 4}))
    >>> resolved.model_options["context_parallel"] in ("ring", "all_gather"), note
    (True, 'context_parallel: auto -> ...: est. ... per step (...), ...')
    >>> resolve_context(pt.load_config("configs/quickstart.yaml"), pt.make_mesh({"data": 1, "fsdp": -1}))[1] is None
    True
"""

from __future__ import annotations

import copy
import math
from typing import Any

from partitioning.config.planning import tune_inputs
from partitioning.config.schema import Config
from partitioning.errors import PartitioningError
from partitioning.fmt import fmt_bytes
from partitioning.model.registry import constructor_options, model_class
from partitioning.plan.budget import device_memory
from partitioning.plan.plan import build_plan
from partitioning.tune.hardware import hardware
from partitioning.tune.measure import local_profile
from partitioning.tune.price import price
from partitioning.tune.space import CONTEXT_STRATEGIES, Candidate, length_axes

KEY = "context_parallel"
AUTO = "auto"


def takes_context(cfg: Config) -> bool:
    """The config's model has a ``context_parallel`` option (the reference GPT and every Hugging Face family)."""
    if cfg.model_hf is not None:
        return True
    if cfg.model_target:
        return False
    try:
        return KEY in constructor_options(model_class(cfg.model_name))
    except PartitioningError:
        return False


def split_axes(cfg: Config, sizes: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes of size > 1 the config's rules split ``length`` over."""
    return tuple(a for a in length_axes(cfg.rules) if sizes.get(a, 1) > 1)


def with_context(cfg: Config, strategy: str) -> Config:
    """A copy of ``cfg`` whose model has ``context_parallel: strategy``."""
    out = copy.copy(cfg)
    out.model_options = {**cfg.model_options, KEY: strategy}
    return out


def resolve_context(cfg: Config, mesh: Any) -> tuple[Config, str | None]:
    """``(cfg with a concrete strategy, the note saying which and why)``; ``(cfg, None)`` when the config names
    its strategy, its model has none, or its layout does not split ``length``."""
    if not takes_context(cfg) or cfg.model_options.get(KEY, AUTO) != AUTO:
        return cfg, None
    sizes = {a: int(n) for a, n in mesh.shape.items()}
    if not split_axes(cfg, sizes):
        return cfg, None
    hw, source = local_profile(mesh.size)
    if hw is None:
        hw, source = hardware("h100"), f"{source}: priced as an h100"
    budget = cfg.mesh.memory_bytes or device_memory() or hw.memory
    try:
        inputs = tune_inputs(cfg)
        plan = build_plan(
            inputs.params,
            inputs.opt_state,
            sizes,
            cfg.rules,
            optimizer_rules=cfg.optimizer_rules,
            on_indivisible=cfg.on_indivisible,
            frozen=inputs.frozen,
        )
        remat = cfg.model_options.get("remat")
        t = cfg.train
        results = [
            price(
                inputs.params,
                inputs.opt_state,
                Candidate(tuple(sizes.items()), "run", remat, t.grad_accum, context=s),
                cfg.rules,
                inputs.workload,
                hw,
                budget,
                optimizer_rules=cfg.optimizer_rules,
                plan=plan,
                frozen=inputs.frozen,
            )
            for s in CONTEXT_STRATEGIES
        ]
    except PartitioningError:
        return cfg, None  # the layout itself is wrong: the checks that follow say what to change
    priced = [r for r in results if r.analytic is not None]
    if not priced:
        return cfg, None
    fitting = [r for r in priced if r.fits]
    chosen = min(fitting, key=lambda r: r.step_time) if fitting else min(priced, key=lambda r: r.peak)
    why = "fastest that fits" if fitting else "smallest peak (neither fits)"
    others = ", ".join(
        f"{r.candidate.context} {_s(r.step_time)}, peak {fmt_bytes(r.peak)}" for r in priced if r is not chosen
    )
    note = (
        f"context_parallel: auto -> {chosen.candidate.context}: est. {_s(chosen.step_time)} per step "
        f"({why}; peak {fmt_bytes(chosen.peak)}), {others}; {source}"
    )
    return with_context(cfg, str(chosen.candidate.context)), note


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if math.isfinite(seconds) else "?"


__all__ = ["resolve_context", "takes_context", "split_axes", "with_context"]
