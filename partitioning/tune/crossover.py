"""Crossovers: the per-device batch below which a layout becomes communication-bound.

The cost model's own terms (:func:`partitioning.tune.cost.analytic_comm`,
:meth:`Workload.flops_per_step`, :func:`partitioning.tune.cost.compute_parallelism`)
for the transformer of "How to Scale Your Model" (Part 5): ``L`` MLP blocks
``W_in[D, F]``, ``W_out[F, D]`` in bfloat16, named ``(layers, embed, mlp)`` and
``(layers, mlp, embed)`` and laid out by the rules like any model. Per phase
(forward, backward) FLOPs time ``C_p(b)`` and communication time ``X_p(b)``
are linear in ``b``, the tokens per device (the global batch in tokens over
all devices); the phase is compute-bound when ``C_p(b) >= X_p(b)``, so

    b* = max over phases of X_p(0) / (c_p - x_p)       (C_p = c_p b, X_p = X_p(0) + x_p b)

and never, when activation traffic alone outruns the FLOPs (``c_p <= x_p``:
a tensor axis too wide for ``F``). As in the published analyses this is a
bandwidth roofline: latency 0, FLOPs time alone (no HBM term).

:func:`crossover` gives ``b*`` for the whole layout (all communication of a
phase against its FLOPs) and per mesh axis (that axis's communication
alone); :func:`tensor_limit` the widest tensor axis whose activation traffic
the FLOPs still hide.

Example::

    >>> v5p = pt.tune.hardware("v5p")
    >>> pt.tune.crossover(v5p, {"data": 2048}, "dp", embed=8192, mlp=28672)["layout"]   # 2550 / 3 axes
    850.0...
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.boxes import LogicallyPartitioned
from partitioning.layout import tree_layouts
from partitioning.rules import as_rules
from partitioning.tune.cost import PHASES, analytic_comm, compute_parallelism
from partitioning.tune.hardware import Hardware
from partitioning.tune.workload import Workload


def mlp_stack(embed: int, mlp: int, layers: int = 1, dtype: Any = jnp.bfloat16) -> dict[str, Any]:
    """The abstract, named parameters of ``layers`` MLP blocks (the published analyses' transformer)."""

    def box(shape, names):
        return LogicallyPartitioned(jax.ShapeDtypeStruct(shape, dtype), names)

    return {
        "params": {
            "wi": box((layers, embed, mlp), ("layers", "embed", "mlp")),
            "wo": box((layers, mlp, embed), ("layers", "mlp", "embed")),
        }
    }


def _terms(
    hw: Hardware, mesh: Mapping[str, int], rules: Any, embed: int, mlp: int, layers: int, tokens_per_device: int
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(FLOPs seconds per phase, communication seconds per phase and axis) at ``tokens_per_device``."""
    rules = as_rules(rules)
    devices = math.prod(mesh.values())
    params = tree_layouts(
        mlp_stack(embed, mlp, layers), dict(mesh), rules, on_indivisible="replicate", warn_replicated=False
    )
    w = Workload(
        params=2 * layers * embed * mlp,
        matmul_params=2 * layers * embed * mlp,
        batch=tokens_per_device * devices,
        seq_len=1,
        layers=layers,
        embed=embed,
        mlp=mlp,
        compute_bytes=2,
    )
    par = compute_parallelism(params, mesh, rules, w)
    f = w.flops_per_step("none")
    flops = {"fwd": f["fwd"] / par / hw.peak_flops, "bwd": f["bwd"] / par / hw.peak_flops}
    comm: dict[str, dict[str, float]] = {p: {} for p in PHASES}
    for c in analytic_comm(params, mesh, rules, w, hw, micro_batch=w.batch):
        comm[c.phase][c.label] = comm[c.phase].get(c.label, 0.0) + c.seconds
    return flops, comm


def _solve(c1: float, c2: float, x1: float, x2: float) -> float:
    """Tokens per device where a phase's FLOPs time meets its communication (both linear; at b = 1 and 2)."""
    slope_c, slope_x = c2 - c1, x2 - x1
    fixed = x1 - slope_x
    if fixed <= 0 and slope_x <= slope_c:
        return 0.0
    if slope_c <= slope_x:
        return math.inf
    return fixed / (slope_c - slope_x)


def crossover(
    hw: Hardware, mesh: Mapping[str, int], rules: Any, *, embed: int, mlp: int, layers: int = 1
) -> dict[str, Any]:
    """``{"layout": b*, "axes": {axis: b*}, "phase": binding phase}`` (tokens per device; see the module docstring).

    Example::

        >>> h100 = pt.tune.hardware("h100")
        >>> pt.tune.crossover(h100, {"data": 1, "fsdp": 2048}, "fsdp", embed=8192, mlp=28672)["layout"]
        2472.5
    """
    hw = dataclasses.replace(hw, latency=0.0, links=())  # the published analyses: peak bandwidths, no latency
    f1, x1 = _terms(hw, mesh, rules, embed, mlp, layers, 1)
    f2, x2 = _terms(hw, mesh, rules, embed, mlp, layers, 2)
    per_phase = {p: _solve(f1[p], f2[p], sum(x1[p].values()), sum(x2[p].values())) for p in ("fwd", "bwd")}
    axes: dict[str, float] = {}
    for p in ("fwd", "bwd"):
        for a in x1[p]:
            axes[a] = max(axes.get(a, 0.0), _solve(f1[p], f2[p], x1[p][a], x2[p].get(a, 0.0)))
    phase = max(per_phase, key=lambda p: per_phase[p])
    return {"layout": per_phase[phase], "phase": phase, "axes": axes}


def tensor_limit(
    hw: Hardware, mesh: Mapping[str, int], rules: Any, axis: str = "tensor", *, embed: int, mlp: int
) -> float:
    """The widest ``axis`` whose activation all-reduces the FLOPs still hide: ``size / (comm / FLOPs)``.

    Tensor-parallel traffic and FLOPs per device both scale with the batch, so
    their ratio grows linearly with the axis size and does not depend on the batch.
    """
    hw = dataclasses.replace(hw, latency=0.0, links=())  # the published analyses: peak bandwidths, no latency
    flops, comm = _terms(hw, mesh, rules, embed, mlp, 1, 1)
    ratio = max(comm[p].get(axis, 0.0) / flops[p] for p in ("fwd", "bwd"))
    return mesh[axis] / ratio if ratio else math.inf


__all__ = ["crossover", "tensor_limit", "mlp_stack"]
