"""The :class:`~partitioning.tune.cost.Estimate` of a compiled step: XLA's ops and collectives priced on a profile.

The compiled view (:func:`partitioning.plan.compiled_view`) lists every op of
the step with its FLOPs, bytes and executions (loops counted,
:mod:`partitioning.plan.hlo_cost`) and every collective with its group size;
here each op is a roofline term of its phase and each collective is put on the
mesh axes whose sizes make its group (:func:`axes_of_group`).

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": -1}), "dp", batch_size=8, seq_len=16)
    >>> view = pt.plan.compiled_view(trainer.lower_train_step)
    >>> est = pt.tune.compiled_estimate(view["cost_ops"], view["collective_ops"], {"data": 8}, pt.tune.hardware("h100"),
    ...                            model_flops=1.0)
    >>> est.source, est.step_time > 0
    ('compiled', True)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

from partitioning.plan.hlo_cost import phase_of
from partitioning.tune.comm import priced_comm
from partitioning.tune.cost import PHASES, Estimate, temporaries_time
from partitioning.tune.hardware import Hardware


def axes_of_group(
    mesh: Mapping[str, int], group: int | None, hw: Hardware, nodes: Mapping[str, int] | None = None
) -> tuple[str, ...]:
    """The mesh axes whose sizes multiply to a collective's group size (the slowest such set when several do)."""
    names = [a for a, s in mesh.items() if s > 1]
    if not group or group <= 1:
        return ()
    found = [
        c for r in range(1, len(names) + 1) for c in combinations(names, r) if math.prod(mesh[a] for a in c) == group
    ]
    if not found:
        return tuple(names)
    return min(found, key=lambda c: hw.bandwidth(mesh, c, nodes=nodes))


def compiled_estimate(
    ops: Sequence[Sequence[Any]],
    collective_ops: Sequence[Mapping[str, Any]],
    mesh: Mapping[str, int],
    hw: Hardware,
    *,
    model_flops: float,
    temp_bytes: float = 0.0,
    analytic: Estimate | None = None,
    nodes: Mapping[str, int] | None = None,
) -> Estimate:
    """The :class:`Estimate` of a compiled step.

    ``ops``: ``[name, op, phase, flops, bytes, executions]`` rows
    (:func:`partitioning.plan.hlo_cost.op_costs`); ``collective_ops``: the
    compiled view's collectives (kind, bytes, executions, group_size, source);
    ``temp_bytes``: XLA's temporaries per device (``memory_analysis().temp_size_in_bytes``).

    On the machine that compiled the step (``hw.measured``: the cpu profile)
    every term is the compiled one: a roofline per op and the collectives priced
    on their mesh axes. For other hardware the program is XLA:CPU's, which
    computes bfloat16 in float32 (more bytes, wider collectives, copies a
    bfloat16 scan's stacked outputs): the compiled FLOPs per phase are used (loops
    counted), memory traffic and collectives stay those of ``analytic``.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": -1}), "dp", batch_size=8, seq_len=16)
        >>> view = pt.plan.compiled_view(trainer.lower_train_step)
        >>> h100 = pt.tune.hardware("h100")
        >>> est = pt.tune.compiled_estimate(view["cost_ops"], view["collective_ops"], {"data": 8}, h100,
        ...                            model_flops=1.0, temp_bytes=view["memory"]["temp"])
        >>> est.step_time > 0, est.bottleneck
        (True, '...')
    """
    flops = {p: 0.0 for p in PHASES}
    hbm = {p: 0.0 for p in PHASES}
    compute = {p: 0.0 for p in PHASES}
    for _, _, phase, fl, nbytes, _ in ops:
        flops[phase] += fl
        hbm[phase] += nbytes
        compute[phase] += max(fl / hw.matmul_flops, nbytes / hw.memory_bandwidth)
    if not hw.measured and analytic is not None:
        # The compiled FLOPs at the rate the analytic estimate's matmuls run (their shapes' efficiency), beside
        # its memory-bound work.
        hbm = dict(analytic.hbm_bytes)
        rate = analytic.matmul_flops or hw.matmul_flops
        compute = {
            p: flops[p] / rate + analytic.memory.get(p, 0.0)
            if analytic.memory
            else max(flops[p] / hw.matmul_flops, hbm[p] / hw.memory_bandwidth)
            for p in PHASES
        }
        # The compiled loop runs every stage in every iteration: its FLOPs hold the bubble already.
        other = {k: v for k, v in analytic.other.items() if k != "pipeline bubble"}
        return Estimate(
            "compiled",
            flops,
            hbm,
            compute,
            list(analytic.comm),
            hw.overlap,
            model_flops,
            math.prod(mesh.values()),
            hw.peak_flops,
            other,
            rate,
            dict(analytic.memory),
            analytic.contention,
        )
    buckets: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for c in collective_ops:
        axes = axes_of_group(mesh, c.get("group_size"), hw, nodes)
        key = (axes, c["kind"], phase_of(c.get("source", "")))
        buckets[key][0] += c["bytes"] * c["executions"]
        buckets[key][1] += c["executions"]
    comm = [
        priced_comm(hw, mesh, nodes, axes, kind, phase, nbytes, count, "compiled")
        for (axes, kind, phase), (nbytes, count) in buckets.items()
    ]
    return Estimate(
        "compiled",
        flops,
        hbm,
        compute,
        comm,
        hw.overlap,
        model_flops,
        math.prod(mesh.values()),
        hw.peak_flops,
        temporaries_time(hw, temp_bytes),
        hw.matmul_flops,
    )


__all__ = ["compiled_estimate", "axes_of_group"]
