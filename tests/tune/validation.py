"""``tune`` against the published rows (tests/tune/published.py): each row's exact layout priced as ``tune`` prices
a candidate, a fixed split into a calibration half and a held-out half, and the calibration itself.

A row's model is built from shapes alone (abstract boxed parameters with the logical names the rules read) and
priced as the one layout the source ran (:func:`partitioning.tune.price.price`: a forced candidate, no search)
on its hardware's profile; its nodes (GPUs) or slices (TPUs) are the ones the source ran on. A source's remat
policy that the toolkit has no name for is priced as the toolkit policy keeping no more memory, with the
source's recomputation (its share of the forward matmuls) as the backward pass's FLOPs.

Calibration: per hardware profile, the ``efficiency`` (the share of the priced kernels' speed a step keeps) whose
predictions are right on the profile's calibration rows on average (geometric mean of predicted / published
step time). The split is :data:`HOLDOUT`, written out by row id: nobody tunes to the held-out rows.

    python -m tests.tune.validation [--calibrate | --raw]     # the table of docs/tune.md
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.boxes import LogicallyPartitioned
from partitioning.plan.plan import build_plan
from partitioning.rules import Rules
from partitioning.tune.hardware import PROFILES
from partitioning.tune.price import price
from partitioning.tune.space import Candidate
from partitioning.tune.workload import workload
from tests.tune.published import ROWS, Row

# The held-out half: in each table (source x hardware), every other row in the source's own order. Fixed here by
# id; the calibration is the other half.
HOLDOUT = frozenset(
    {
        "maxtext-v5p-32b-2xv5p-128",
        "maxtext-v5p-64b-2xv5p-128",
        "maxtext-v5p-128b-2xv5p-256",
        "maxtext-v5p-128b-2xv5p-512",
        "maxtext-v5p-256b-2xv5p-1024",
        "maxtext-v5p-512b-2xv5p-1024",
        "maxtext-v5p-1024b-2xv5p-2048",
        "maxtext-v5p-1024b-2xv5p-4096",
        "maxtext-v5e-16b-2xv5e-256",
        "maxtext-v5e-16b-8xv5e-256",
        "maxtext-v5e-16b-32xv5e-256",
        "maxtext-v5e-32b-2xv5e-256",
        "maxtext-v5e-32b-8xv5e-256",
        "maxtext-v5e-32b-32xv5e-256",
        "maxtext-v5e-64b-2xv5e-256",
        "maxtext-v5e-64b-8xv5e-256",
        "maxtext-v5e-64b-32xv5e-256",
        "maxtext-v5e-128b-2xv5e-256",
        "maxtext-v5e-128b-8xv5e-256",
        "maxtext-v5e-128b-32xv5e-256",
        "maxtext-v4-22b-2xv4-128",
        "maxtext-v4-22b-8xv4-128",
        "maxtext-v4-52b-2xv4-384",
        "maxtext-a3-llama2-7b-2vm",
        "maxtext-a3-llama2-7b-8vm",
        "nvidia-maxtext-llama2-70b-128",
        "nvidia-maxtext-llama2-70b-512",
        "nvidia-maxtext-llama2-70b-2048",
        "nvidia-maxtext-llama3-70b-256",
        "nvidia-maxtext-llama3-70b-1024",
        "megatron-3.6b-64",
        "megatron-18.4b-256",
        "megatron-76.1b-1024",
        "megatron-310.1b-1920",
        "megatron-1008.0b-3072",
    }
)


def _box(shape: tuple[int, ...], names: tuple[str | None, ...]) -> Any:
    return LogicallyPartitioned(jax.ShapeDtypeStruct(shape, jnp.float32), names)


def abstract_params(row: Row) -> dict[str, Any]:
    """The row's decoder as boxed abstract params: scanned blocks with a ``layers`` axis."""
    e, h, g, k, f, n = row.embed, row.heads, row.groups, row.head_dim, row.mlp, row.layers
    block = {
        "q": _box((n, e, h, k), ("layers", "embed", "heads", "kv")),
        "k": _box((n, e, g, k), ("layers", "embed", "kv_heads", "kv")),
        "v": _box((n, e, g, k), ("layers", "embed", "kv_heads", "kv")),
        "o": _box((n, h, k, e), ("layers", "heads", "kv", "embed")),
        "wo": _box((n, f, e), ("layers", "mlp", "embed")),
        "norms": _box((n, 2, e), ("layers", None, "embed")),
    }
    for i in range(row.mlp_inputs):
        block[f"wi_{i}"] = _box((n, e, f), ("layers", "embed", "mlp"))
    out = {"blocks": block, "final_norm": _box((e,), ("embed",))}
    if row.tied:  # the table is also the output projection: a matmul (embed, vocab)
        out["embedding"] = _box((e, row.vocab), ("embed", "vocab"))
    else:
        out["embedding"] = _box((row.vocab, e), ("vocab", "embed"))
        out["unembed"] = _box((e, row.vocab), ("embed", "vocab"))
    return out


def rules_of(row: Row) -> Rules:
    if row.rules == "megatron":
        return Rules([["layers", "stage"]]) + Rules.preset("tp")
    if row.source == "maxtext":  # MaxText splits the residual stream's embed over tensor (activation_embed)
        return Rules.preset(row.rules) + Rules([["embed", "tensor"]])
    return Rules.preset(row.rules)


def hardware_of(row: Row, efficiency: float | None = None) -> Any:
    """The row's profile: its chips per slice (TPUs), its network where the source's differs, and an efficiency
    (with no contention) if given."""
    hw = PROFILES[row.hardware]
    if row.slice_chips:
        hw = dataclasses.replace(hw, node_size=row.slice_chips)
    if row.network:  # the source's own network: the same NICs' share of their rate, at its rate
        across = dataclasses.replace(hw.links[1], bandwidth=row.network, name="network")
        hw = dataclasses.replace(hw, network_bandwidth=row.network, links=(hw.links[0], across))
    return hw if efficiency is None else dataclasses.replace(hw, efficiency=efficiency, contention=0.0)


def inputs(row: Row) -> tuple[Any, Any, Any]:
    """(params, opt_state, workload) of the row's model."""
    params = abstract_params(row)
    plan = build_plan(params, None, {"data": 1}, Rules([]), on_indivisible="replicate")
    w = workload(plan.params, batch_size=row.batch, seq_len=row.seq, compute_dtype="bfloat16", attention=row.attention)
    return params, {"mu": params, "nu": params}, w


def predict(row: Row, efficiency: float | None = None, budget: float = float("inf"), grad_accum: int = 1) -> Any:
    """The priced :class:`~partitioning.tune.space.Result` of the row's layout (with ``grad_accum``
    micro-batches)."""
    params, opt_state, w = inputs(row)
    records = []
    stages = dict(row.mesh).get("stage", 1)
    if stages > 1:
        shape = (row.batch, row.seq, row.embed)
        records = [{"kind": "pipeline", "layers": row.layers, "stages": 1, "microbatches": 1, "repeats": 1,
                    "shape": shape, "dtype": "bfloat16", "batch_axes": ("data",)}]  # fmt: skip
    c = Candidate(row.mesh, row.rules, row.remat, grad_accum, False, row.microbatches, nodes=row.nodes or None)
    return price(
        params,
        opt_state,
        c,
        rules_of(row),
        w,
        hardware_of(row, efficiency),
        budget,
        records=records,
        recompute=row.recompute,
        on_indivisible="replicate",
    )


def published_step_time(row: Row) -> float:
    return row.source_flops() / (row.chips * PROFILES[row.hardware].peak_flops * row.mfu)


def predicted_mfu(row: Row, efficiency: float | None = None) -> float:
    """The row's MFU under its source's FLOP count, from the predicted step time."""
    r = predict(row, efficiency)
    return row.source_flops() / (r.step_time * row.chips * PROFILES[row.hardware].peak_flops)


def _step_at(estimate: Any, efficiency: float, contention: float = 0.0) -> float:
    """The estimate's step time with its forward and backward compute (and the bubble, a share of it) at
    ``efficiency`` instead of 1, and ``contention``."""
    other = {k: v / efficiency if k == "pipeline bubble" else v for k, v in estimate.other.items()}
    compute = {p: c / efficiency if p != "update" else c for p, c in estimate.compute.items()}
    return dataclasses.replace(estimate, compute=compute, other=other, contention=contention).step_time


# Contention (the share of a hidden collective's time the compute beside it loses) is fitted where collectives
# share the compute units (GPUs: NCCL's kernels on the SMs), on this grid; TPUs move data with DMA engines: 0.
CONTENTION = [i / 20 for i in range(11)]


def _fit(priced: list[tuple[Row, Any]], contention: float) -> tuple[float, float]:
    """(efficiency at most 1 making the rows' mean log error zero, then their mean squared log error)."""
    lo, hi = 0.05, 1.0
    for _ in range(50):
        k = (lo + hi) / 2
        mean = sum(math.log(published_step_time(r) / _step_at(e, k, contention)) for r, e in priced) / len(priced)
        lo, hi = (lo, k) if mean > 0 else (k, hi)  # published slower: lower the efficiency
    k = round(k, 3)
    return k, sum(math.log(published_step_time(r) / _step_at(e, k, contention)) ** 2 for r, e in priced)


def calibrate(rows: list[Row] | None = None) -> dict[str, tuple[float, float]]:
    """Per profile, ``(efficiency, contention)`` fitted on its calibration rows (least squares of the log error;
    the efficiency to 3 decimals, at most 1; the contention on :data:`CONTENTION`, GPUs only)."""
    rows = [r for r in (ROWS if rows is None else rows) if r.id not in HOLDOUT]
    out = {}
    for name in sorted({r.hardware for r in rows}):
        priced = [(r, predict(r, 1.0).analytic) for r in rows if r.hardware == name]
        grid = CONTENTION if PROFILES[name].topology == "nodes" else [0.0]
        fits = {c: _fit(priced, c) for c in grid}
        best = min(grid, key=lambda c: (round(fits[c][1], 6), c))
        out[name] = (fits[best][0], best)
    return out


def table(efficiency: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Every row: published and predicted MFU (the profiles' efficiency unless ``efficiency`` per hardware)."""
    out = []
    for row in ROWS:
        pred = predicted_mfu(row, (efficiency or {}).get(row.hardware))
        out.append({"row": row, "published": row.mfu, "predicted": pred, "error": pred / row.mfu - 1,
                    "holdout": row.id in HOLDOUT})  # fmt: skip
    return out


def main(argv: list[str]) -> None:
    if "--calibrate" in argv:
        print(calibrate())
        return
    eff = {name: 1.0 for name in PROFILES} if "--raw" in argv else None
    rows = table(eff)
    print("| row | chips | layout | remat | published MFU | predicted MFU | error | half |")
    print("|---|---:|---|---|---:|---:|---:|---|")
    for t in rows:
        r = t["row"]
        shape = ", ".join(f"{a} {n}" for a, n in r.mesh if n > 1) + (
            f", M={r.microbatches}" if r.microbatches > 1 else ""
        )
        print(f"| {r.id} | {r.chips} {r.hardware} | {shape} | {r.remat} | {t['published']:.1%} | {t['predicted']:.1%} "
              f"| {t['error']:+.1%} | {'held out' if t['holdout'] else 'calibration'} |")  # fmt: skip
    for half in (False, True):
        errs = sorted(abs(t["error"]) for t in rows if t["holdout"] == half)
        print(f"{'held out' if half else 'calibration'}: {len(errs)} rows, median |error| {errs[len(errs) // 2]:.1%},"
              f" max {errs[-1]:.1%}, within 15%: {sum(e <= 0.15 for e in errs)}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
