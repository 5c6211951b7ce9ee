"""Plan: what a layout costs before anything is allocated.

Modules:

- :mod:`~partitioning.plan.plan` — ``build_plan``: every array's layout, per-device totals, warnings.
- :mod:`~partitioning.plan.coverage` — which logical names are used, which rules fire (params and activations).
- :mod:`~partitioning.plan.compiled` — ``compiled_view``: XLA's memory, collectives and a sharding self-check.
- :mod:`~partitioning.plan.hlo` — collectives (kind, bytes, executions) read from optimized HLO text.
- :mod:`~partitioning.plan.flops` — FLOPs of a compiled step (loops counted), 6·N·tokens, device peaks, MFU.
- :mod:`~partitioning.plan.hlo_cost` — FLOPs and bytes of every op of a compiled step, loops counted, by phase.
- :mod:`~partitioning.plan.budget` — the memory budget: does the per-device peak fit, and what takes the room.
- :mod:`~partitioning.plan.memory_kinds` — device and host bytes: offloaded state, a compiled step's host buffers.
- :mod:`~partitioning.plan.plot` — the plan PNG: per-device memory and the mesh.
- :mod:`~partitioning.plan.axes` — per mesh axis: what it splits, and the compiled collectives that run over it.
- :mod:`~partitioning.plan.parallel` — analytic pipeline (bubble, collective-permute) and expert (all-to-all) costs.
- :mod:`~partitioning.plan.waste` — parameters left whole on every device, mesh axes that split no parameter.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> model = GPT(embed=4096, heads=32, mlp=14336, layers=32, vocab_size=128_256)   # Llama-3-8B-shaped
    >>> params, opt_state = pt.abstract_train_state(model, optax.adamw(1e-4), batch_size=256, seq_len=2048)
    >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 256, "tensor": 8}, "fsdp_tp")
    >>> round(plan.totals["total"]["per_device"] / 2**30, 2), plan.devices   # GiB of state per device
    (0.06, 2048)
"""

from partitioning.plan.compiled import compiled_view
from partitioning.plan.coverage import activation_names, rule_coverage
from partitioning.plan.flops import mfu, peak_tflops, step_flops, transformer_flops
from partitioning.plan.parallel import parallel_costs
from partitioning.plan.plan import Plan, build_plan
from partitioning.plan.plot import plot_plan

__all__ = [
    "Plan",
    "build_plan",
    "activation_names",
    "rule_coverage",
    "compiled_view",
    "plot_plan",
    "parallel_costs",
    "step_flops",
    "transformer_flops",
    "peak_tflops",
    "mfu",
]
