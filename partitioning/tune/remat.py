"""``model.remat: auto``: the remat policy for one layout, each policy priced on the hardware; the fastest that fits.

A remat policy trades memory for recomputation: ``none`` keeps every
activation the backward pass needs, ``dots`` / ``dots_no_batch`` keep the
matmul outputs (all of them / those without batch dimensions: the
projections, not the attention products), ``full`` keeps each layer's input
and runs its forward pass again. Which is fastest depends on the hardware:

- on accelerators (memory pooled, collectives beside compute) recomputation
  costs FLOPs and saving costs only memory, so ``none`` wins while it fits and
  the policy with the least recomputation that fits otherwise;
- on the CPU a step pays for every byte of fresh temporary memory (the
  runtime maps it anew each step and the kernel zeroes it:
  ``Hardware.alloc_bandwidth``), so saving many activations can cost more than
  recomputing them.

:func:`choose_remat` prices the run's own layout (mesh, rules, micro-batches:
nothing else changes) once per policy with :func:`partitioning.tune.price.price`
— the same estimate ``tune`` ranks its candidates by, on the same hardware
profile — and takes the fastest that fits the budget; within 0.1% the one
with less recomputation; when none fits, the smallest peak.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> from partitioning.tune.remat import choose_remat
    >>> model = GPT(vocab_size=32000, embed=2048, heads=16, mlp=8192, layers=16, dtype="bfloat16")   # 1.2B
    >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=64, seq_len=2048)
    >>> w = pt.tune.workload(pt.build_plan(params, opt_state, {"data": 8}, "dp").params, batch_size=64, seq_len=2048)
    >>> policies = ("none", "dots", "dots_no_batch", "full")
    >>> choice = choose_remat(params, opt_state, {"data": 1, "fsdp": 8}, pt.Rules.preset("fsdp"), w,
    ...                       pt.tune.hardware("h100"), budget=80 * 2**30, policies=policies)
    >>> choice.policy
    'dots'
    >>> choice.describe()
    'dots: the fastest of 4 policies, est. 578 ms per step on h100 (none 578 ms (does not fit), dots_no_batch 709 ms, \
full 777 ms); peak 78.41 GiB of 80.00 GiB'
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from partitioning.errors import PartitioningError
from partitioning.fmt import fmt_bytes
from partitioning.plan.plan import build_plan
from partitioning.rules import Rules
from partitioning.tune.hardware import Hardware
from partitioning.tune.price import price
from partitioning.tune.search import Search
from partitioning.tune.space import Candidate, Result
from partitioning.tune.workload import Workload

RUN = "run"  # the rules name of the run's own layout


@dataclasses.dataclass
class RematChoice:
    """The policy picked for a layout, and every policy's priced :class:`~partitioning.tune.space.Result`."""

    policy: str
    results: list[Result]
    hardware: Hardware
    budget: float
    why: str  # "fastest" | "smallest peak" | "not priced: ..."
    devices: int = 1  # the mesh's devices: simulated CPU devices share this machine's cores

    def _estimate(self, seconds: float) -> str:
        """An accelerator's estimate is a step's wall time. The measured cpu profile prices device-seconds (CPU time
        per simulated device), which the user would compare with the wall time printed beside it: say so, and
        what it means in wall time on this machine's cores."""
        if self.hardware.name != "cpu":
            return f"est. {_ms(seconds)} per step on {self.hardware.name}"
        cores = max(1, min(self.devices, os.cpu_count() or 1))
        wall = seconds * self.devices / cores
        return (
            f"est. {_ms(seconds)} of CPU time per simulated device per step (~{_ms(wall)} wall: {self.devices} "
            f"devices on {cores} core{'s' if cores > 1 else ''})"
        )

    def describe(self) -> str:
        """One line: the policy, the estimates it beat, the peak and the budget."""
        priced = [r for r in self.results if r.analytic is not None]
        if not priced:
            return f"{self.policy} ({self.why})"
        chosen = next(r for r in priced if r.candidate.remat == self.policy)
        others = ", ".join(
            f"{r.candidate.remat} {_ms(r.step_time)}{'' if r.fits else ' (does not fit)'}"
            for r in sorted(priced, key=lambda r: r.step_time)
            if r is not chosen
        )
        return (
            f"{self.policy}: the {self.why} of {len(priced)} policies, {self._estimate(chosen.step_time)} "
            f"({others}); peak {fmt_bytes(chosen.peak)} of {fmt_bytes(self.budget)}"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def choose_remat(
    params: Any,
    opt_state: Any,
    mesh: Mapping[str, int],
    rules: Rules,
    w: Workload,
    hw: Hardware,
    budget: float,
    *,
    policies: Sequence[str],
    optimizer_rules: Rules | None = None,
    grad_accum: int = 1,
    microbatches: int = 1,
    repeats: int = 1,
    records: Sequence[Mapping[str, Any]] = (),
    activations: Sequence[Any] = (),
    on_indivisible: str = "error",
    frozen: Collection[str] = (),
    offload: Sequence[str] = (),
    offload_update: str = "device",
) -> RematChoice:
    """The fastest of ``policies`` that fits ``budget`` for this layout (see the module docstring).

    ``params`` / ``opt_state``: the boxed abstract state; ``mesh``: ``{axis: size}``; ``records``: one
    traced forward pass (pipeline and expert costs), as for :func:`partitioning.tune.search.search`;
    ``microbatches`` / ``repeats``: the pipeline's ``M`` / ``R``; ``frozen``: paths of params that do not train;
    ``offload`` / ``offload_update``: the run's ``train.offload`` (its state's device bytes are priced as such).
    """
    if not policies:
        raise ValueError("choose_remat: no policies to choose from")
    sizes = {a: int(n) for a, n in mesh.items()}
    try:
        plan: Any = build_plan(
            params,
            opt_state,
            sizes,
            rules,
            optimizer_rules=optimizer_rules,
            on_indivisible=on_indivisible,
            activations=activations,
            frozen=frozen,
        )
    except PartitioningError as e:
        plan = e
    results = [
        price(
            params,
            opt_state,
            Candidate(
                tuple(sizes.items()),
                RUN,
                p,
                grad_accum,
                False,
                microbatches,
                repeats,
                offload=tuple(offload),
                offload_update=offload_update,
            ),
            rules,
            w,
            hw,
            budget,
            optimizer_rules=optimizer_rules,
            plan=plan,
            records=records,
        )
        for p in policies
    ]
    n = math.prod(sizes.values())
    best = Search(results, hw, int(budget), w, n).best
    if best is not None:
        return RematChoice(str(best.candidate.remat), results, hw, budget, "fastest", n)
    priced = [r for r in results if r.peak > 0]
    if priced:
        small = min(priced, key=lambda r: r.peak)
        return RematChoice(str(small.candidate.remat), results, hw, budget, "smallest peak (none fits)", n)
    reason = results[0].reason or "no estimate"
    return RematChoice(str(policies[0]), results, hw, budget, f"not priced: {reason}", n)


__all__ = ["RematChoice", "choose_remat"]
