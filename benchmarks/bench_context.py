"""Context parallelism benchmark: weak scaling of the ring, and both strategies at 2k-32k tokens.

    python benchmarks/bench_context.py [--tokens 2048] [--lengths 2048 4096 8192 16384 32768]
                                       [--steps 3] [--json out.json] [--smoke]

All on 8 simulated CPU devices, a small Llama-style GPT (float32, grouped-query heads, 2 layers,
``remat: none``) trained under the ``fsdp_cp`` rule table with the toolkit's Trainer:

- **Weak scaling** (``weak``): a device always processes ``--tokens`` S query tokens — context 1 on
  ``{fsdp: 8}`` with sequences of S, context 4 on ``{fsdp: 2, context: 4}`` with 4S, context 8 on
  ``{context: 8}`` with 8S. The compiled train step's per-device peak (XLA's memory analysis: arguments +
  outputs - aliased + temporaries) for ``ring`` and ``all_gather``; ``ratio`` is each peak over context
  1's. Target: the ring within 1.3x at context 4 and 8 (its memory does not grow with the sequence);
  the gather grows with it (it holds all keys and a ``T/C x T`` score block).
- **Lengths** (``lengths``): ``{context: 8}``, one sequence of each length, both strategies: compiled
  peak and the median step time of ``--steps`` steps after the compile (wall seconds on this machine;
  the ratio ring / all_gather is what carries over).

Prints tables and a JSON object (also written to ``--json``); ``--smoke`` runs tiny sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import report, setup

DEVICES = 8
STRATEGIES = ("ring", "all_gather")


def _trainer(mesh_shape: dict, seq: int, batch: int, strategy: str, width: int):
    import optax

    import partitioning as pt
    from partitioning.models import GPT

    model = GPT(
        vocab_size=256,
        embed=width,
        heads=4,
        kv_heads=2,
        mlp=2 * width,
        layers=2,
        context_parallel=strategy,
        remat="none",
    )
    mesh = pt.make_mesh({"data": 1, "fsdp": 1, "context": 1, **mesh_shape})
    return pt.Trainer(model, optax.adamw(1e-3), mesh, "fsdp_cp", batch_size=batch, seq_len=seq)


def _peak(trainer) -> int:
    from partitioning.plan.compiled import memory_stats

    stats = memory_stats(trainer.lower_train_step().compile())
    return int(stats["peak_estimate"]) if stats else -1


def weak(tokens: int, width: int) -> list[dict]:
    rows = []
    for c in (1, 4, 8):
        shape = {"fsdp": DEVICES // c, "context": c}
        for strategy in STRATEGIES:
            t = _trainer(shape, tokens * c, DEVICES // c, strategy, width)
            rows.append({"context": c, "seq_len": tokens * c, "strategy": strategy, "peak": _peak(t)})
    base = {r["strategy"]: r["peak"] for r in rows if r["context"] == 1}
    for r in rows:
        r["ratio"] = round(r["peak"] / base[r["strategy"]], 3)
    return rows


def lengths(seqs: list[int], steps: int, width: int) -> list[dict]:
    import jax
    import numpy as np

    rows = []
    for seq in seqs:
        for strategy in STRATEGIES:
            t = _trainer({"context": DEVICES}, seq, 1, strategy, width)
            peak = _peak(t)
            state = t.init(jax.random.key(0))
            tokens = np.random.default_rng(0).integers(0, 256, (1, seq + 1))
            batch = t.place({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})
            state, m = t.train_step(state, batch)  # compile and warm up
            jax.block_until_ready(m)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                state, m = t.train_step(state, batch)
                jax.block_until_ready(m)
                times.append(time.perf_counter() - t0)
            rows.append(
                {"seq_len": seq, "strategy": strategy, "peak": peak, "step_s": round(statistics.median(times), 4)}
            )
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="query tokens per device (weak scaling)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--width", type=int, default=64, help="the model's embed (heads: 4, kv heads: 2)")
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs")
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.lengths, args.steps = 64, [256, 512], 1
    setup(DEVICES)
    w = weak(args.tokens, args.width)
    print(f"weak scaling: {args.tokens} query tokens per device")
    print(f"{'context':>8} {'seq_len':>8} {'strategy':>11} {'peak':>14} {'vs context 1':>13}")
    for r in w:
        print(f"{r['context']:>8} {r['seq_len']:>8} {r['strategy']:>11} {_mib(r['peak']):>14} {r['ratio']:>13}")
    ls = lengths(args.lengths, args.steps, args.width)
    print(f"\n{{context: 8}}, one sequence: peak and step time ({args.steps} steps, median)")
    print(f"{'seq_len':>8} {'strategy':>11} {'peak':>14} {'step':>9}")
    for r in ls:
        print(f"{r['seq_len']:>8} {r['strategy']:>11} {_mib(r['peak']):>14} {r['step_s']:>8.3f}s")
    ring_ok = all(r["ratio"] <= 1.3 for r in w if r["strategy"] == "ring")
    report(
        {
            "devices": DEVICES,
            "tokens_per_device": args.tokens,
            "width": args.width,
            "weak": w,
            "lengths": ls,
            "ring_weak_scaling_within_1_3x": ring_ok,
            "load_average": os.getloadavg(),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
