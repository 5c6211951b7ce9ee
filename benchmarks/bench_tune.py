"""Tune benchmark: the cost model's predicted step times against measured ones, on 8 simulated CPU devices.

    python benchmarks/bench_tune.py [--rounds 6] [--json out.json]

1. The ``cpu`` profile is measured on the spot (:func:`partitioning.tune.measure.measure_cpu`).
2. Twelve layouts of a small GPT (vocab 256, embed 128, 8 heads, mlp 512,
   4 scanned layers; batch 32 x 128; adamw) — every preset on the 8-device
   meshes it fits, plus remat and micro-batch variants — are compiled, and each
   step time is predicted from the compiled step: a roofline per op, the
   collectives on their mesh axes and the step's fresh temporaries
   (:func:`partitioning.tune.cost.compiled_estimate`), with the analytic
   estimate beside it.
3. Each layout's step is measured in device-seconds (process CPU time / 8:
   the machine is shared, and CPU time is what the profile is measured in),
   rounds alternating the layouts so that drifts of the machine hit all alike;
   the median per layout.

Prints both columns, the Spearman rank correlation (target >= 0.8) and how
far the predicted best layout's measured time is from the measured best
(target <= 10%); JSON to ``--json`` (with each layout's compiled view, so the
predictions can be recomputed from it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

DEVICES = 8
REPO = Path(__file__).resolve().parent.parent
BATCH, SEQ = 32, 128
MODEL = dict(vocab_size=256, embed=128, heads=8, mlp=512, layers=4, scan_layers=True)
# (rules, mesh, remat, micro-batches): every preset on the meshes of 8 devices it fits, and variants.
LAYOUTS = [
    ("dp", {"data": 8}, "none", 1),
    ("dp", {"data": 8}, "full", 2),
    ("fsdp", {"data": 1, "fsdp": 8}, "none", 1),
    ("fsdp", {"data": 1, "fsdp": 8}, "full", 1),
    ("fsdp", {"data": 1, "fsdp": 8}, "none", 4),
    ("fsdp", {"data": 2, "fsdp": 4}, "none", 1),
    ("tp", {"data": 2, "tensor": 4}, "none", 1),
    ("tp", {"data": 4, "tensor": 2}, "full", 1),
    ("tp", {"data": 1, "tensor": 8}, "none", 1),
    ("fsdp_tp", {"data": 1, "fsdp": 4, "tensor": 2}, "none", 1),
    ("fsdp_tp", {"data": 1, "fsdp": 2, "tensor": 4}, "none", 1),
    ("seq", {"data": 1, "fsdp": 4, "tensor": 2}, "none", 1),
]


def _setup_env() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    sys.path.insert(0, str(REPO))


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def build(layout, hw):
    import jax
    import numpy as np

    import partitioning as pt
    from partitioning.models import GPT
    from partitioning.plan import build_plan, compiled_view
    from partitioning.tune.compiled import compiled_estimate
    from partitioning.tune.cost import analytic_estimate, token_axes
    from partitioning.tune.price import _gathered_layer_bytes
    from partitioning.tune.workload import activation_bytes, workload

    rules, mesh, remat, accum = layout
    tx = pt.make_optimizer("adamw", lr=1e-3, total_steps=1000, warmup_steps=10)
    model = GPT(**MODEL, remat=remat)
    trainer = pt.Trainer(model, tx, pt.make_mesh(mesh), rules, batch_size=BATCH, seq_len=SEQ, grad_accum=accum)
    view = compiled_view(trainer.lower_train_step)
    params, opt = pt.abstract_train_state(model, tx, batch_size=BATCH, seq_len=SEQ)
    plan = build_plan(params, opt, mesh, rules)
    w = workload(plan.params, batch_size=BATCH, seq_len=SEQ)
    state = {k: float(plan.totals[k]["per_device"]) for k in ("params", "optimizer", "gradients")}
    table = pt.Rules.preset(rules)
    acts = activation_bytes(
        w,
        table,
        mesh,
        remat=remat,
        micro_batch=BATCH // accum,
        grad_accum=accum,
        gathered_layer_bytes=_gathered_layer_bytes(plan, token_axes(table, mesh, w), w.layers),
        grad_bytes=state["gradients"],
    )
    analytic = analytic_estimate(
        plan.params, state, mesh, table, w, hw, remat=remat, grad_accum=accum, temp_bytes=acts["total"]
    )
    compiled = compiled_estimate(
        view["cost_ops"],
        view["collective_ops"],
        mesh,
        hw,
        model_flops=w.flops_per_step("none")["model"],
        temp_bytes=view["memory"]["temp"],
    )
    rng = np.random.default_rng(0)
    batch = trainer.place({k: rng.integers(0, 256, (BATCH, SEQ)).astype(np.int32) for k in ("inputs", "targets")})
    st = trainer.init(jax.random.key(0))
    for _ in range(2):
        st, m = trainer.train_step(st, batch)
        jax.block_until_ready(m)
    return {
        "name": "",
        "trainer": trainer,
        "state": st,
        "batch": batch,
        "analytic": analytic.step_time,
        "predicted": compiled.step_time,
        "estimate": compiled.to_json(),
        "mesh": mesh,
        "times": [],
        "walls": [],
        "view": {k: view[k] for k in ("memory", "cost", "cost_ops", "collective_ops")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    _setup_env()
    import jax

    from partitioning.fmt import fmt_mesh
    from partitioning.tune.measure import measure_cpu

    t0 = time.perf_counter()
    hw = measure_cpu(DEVICES)
    print(
        f"cpu profile: {hw.peak_flops:.3g} FLOP/s, memory {hw.memory_bandwidth:.3g} B/s, "
        + ", ".join(f"{k} {v:.3g} B/s" for k, v in hw.collective_bandwidth.items())
        + f", latency {hw.latency:.2g} s (per device-second)",
        flush=True,
    )
    rows = []
    for layout in LAYOUTS:
        row = build(layout, hw)
        row["name"] = f"{layout[0]} {fmt_mesh(layout[1])} remat {layout[2]} x{layout[3]}"
        rows.append(row)
        print(f"compiled {row['name']}", flush=True)
    for _ in range(args.rounds):
        for row in rows:
            c0, w0 = time.process_time(), time.perf_counter()
            row["state"], m = row["trainer"].train_step(row["state"], row["batch"])
            jax.block_until_ready(m)
            row["times"].append((time.process_time() - c0) / DEVICES)
            row["walls"].append(time.perf_counter() - w0)
    for row in rows:
        row["measured"] = statistics.median(row["times"])
    measured = [r["measured"] for r in rows]
    predicted = [r["predicted"] for r in rows]
    rho = spearman(predicted, measured)
    rho_analytic = spearman([r["analytic"] for r in rows], measured)
    best_pred = min(rows, key=lambda r: r["predicted"])
    best_meas = min(rows, key=lambda r: r["measured"])
    gap = best_pred["measured"] / best_meas["measured"] - 1
    w = max(len(r["name"]) for r in rows)
    print(f"\n{'layout':{w}s}  {'measured':>9s}  {'predicted':>9s}  {'analytic':>9s}  (device-seconds per step)")
    for r in sorted(rows, key=lambda r: r["measured"]):
        print(f"{r['name']:{w}s}  {r['measured']:9.4f}  {r['predicted']:9.4f}  {r['analytic']:9.4f}")
    print(f"\nSpearman(predicted, measured) = {rho:.3f} (target >= 0.8; analytic alone: {rho_analytic:.3f})")
    print(
        f"predicted best: {best_pred['name']}, measured {best_pred['measured']:.4f}; measured best: "
        f"{best_meas['name']}, {best_meas['measured']:.4f}; gap {gap:.1%} (target <= 10%)"
    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    out = {
        "spearman": rho,
        "spearman_analytic": rho_analytic,
        "best_gap": gap,
        "predicted_best": best_pred["name"],
        "measured_best": best_meas["name"],
        "profile": hw.to_json(),
        "layouts": [
            {
                k: r[k]
                for k in ("name", "mesh", "measured", "predicted", "analytic", "times", "walls", "estimate", "view")
            }
            for r in rows
        ],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if rho >= 0.8 and gap <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
