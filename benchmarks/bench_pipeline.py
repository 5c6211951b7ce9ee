"""Pipeline benchmark: the pipelined train step against the same model unpipelined, measured in one run.

    python benchmarks/bench_pipeline.py [--rounds 10] [--repeats 1 2] [--json out.json]
    python benchmarks/bench_pipeline.py --smoke      # 2 rounds, S=2 M=8 GPipe only: proves it runs

All on 8 simulated CPU devices: a GPT of the quickstart's width with 8 layers,
batch 32 x 128, adamw. The unpipelined baseline is pure data parallelism over
the 8 devices (``dp``); each pipelined layout is ``pp`` with ``S`` stages x
``8 / S``-way data parallelism, ``M`` micro-batches and ``R`` repeats
(``--repeats``: 1 is GPipe, 2 the circular schedule; a layout runs where the
8 layers split into ``S R`` chunks and ``M >= S``).

1. Step time, pipelined / unpipelined (median of alternating rounds, and the
   median of per-round ratios; wall time and device-seconds, the process's CPU
   time / 8, which a shared machine's other load disturbs less), beside what the
   schedule predicts: on real accelerators a stage idles during the bubble, so
   a step takes ``1 / (1 - bubble) = (R M+S-1)/(R M)`` times the unpipelined
   one (communication aside). Simulated CPU devices share the host's cores, so
   idling is not free time, but the bubble iterations run (on zeros) and cost
   what they compute: the same ratio. Beyond it: the embedding and head, which
   every stage computes for its own copy of its rows (the batch is split
   ``8 / S`` ways, not 8), the schedule's bookkeeping (one micro-batch read and
   written per iteration) and its collectives. ``excess`` is measured /
   predicted - 1 (target <= 0.10).
2. Bytes over ``stage`` per step and device: from the compiled HLO
   (``partitioning.plan.hlo``: collective-permutes, and the circular schedule's
   all-to-alls) against the analytic ``2 (R M+S-1)`` shifts of one micro-batch's
   activations plus the regrouping of the stored layers
   (``partitioning.plan.parallel``); losses equal the unpipelined ones (first
   step, relative difference).

Prints a table and a JSON object (also written to ``--json``): per layout
``measured_slowdown`` (wall), ``measured_slowdown_device_s`` and
``predicted_slowdown``, and per ``R`` the same lists under ``repeats``; ``load_average`` (the machine's
1/5/15-minute load before and after the timed rounds: an idle machine reads near 0, and only such a run is
a result).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from common import report, setup

DEVICES = 8
BATCH, SEQ = 32, 128
MODEL = dict(vocab_size=256, embed=128, heads=4, mlp=512, layers=8, scan_layers=True)
LAYOUTS = [(2, 8), (4, 4), (4, 8), (4, 16)]  # (stages, micro-batches)


def _trainer(mesh_shape, rules, **kw):
    import partitioning as pt
    from partitioning.models import GPT

    tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=1000, warmup_steps=20)
    return pt.Trainer(GPT(**MODEL), tx, pt.make_mesh(mesh_shape), rules, batch_size=BATCH, seq_len=SEQ, **kw)


class Side:
    """One layout: its trainer, state and a timed step."""

    def __init__(self, trainer):
        import jax

        from partitioning.data.corpus import load_corpus
        from partitioning.train.state import host_scalar

        self.trainer = trainer
        data = load_corpus().batches("train", BATCH, SEQ, trainer.batch_sharding, seed=0)
        self.batch = data.batch_at(0)
        self.state = trainer.init(jax.random.key(0))
        _, m = trainer.train_step(trainer.init(jax.random.key(0)), self.batch)
        self.first_loss = host_scalar(m["loss"])
        compiled = trainer.lower_train_step().compile()
        self.text = compiled.as_text()

    def time_step(self) -> tuple[float, float]:
        """(wall seconds, device-seconds) of one step."""
        import jax

        t, c = time.perf_counter(), time.process_time()
        self.state, m = self.trainer.train_step(self.state, self.batch)
        jax.block_until_ready(m)
        return time.perf_counter() - t, (time.process_time() - c) / DEVICES


def layouts(repeats: list[int]) -> list[tuple[int, int, int]]:
    """(S, M, R) of LAYOUTS for each R where the layers split into S R chunks and M >= S."""
    return [(s, m, r) for r in repeats for s, m in LAYOUTS if MODEL["layers"] % (s * r) == 0 and (r == 1 or m >= s)]


def bench(rounds: int, repeats: list[int], smoke: bool = False) -> dict:
    from partitioning.parallel import bubble_fraction
    from partitioning.plan.hlo import collectives
    from partitioning.plan.parallel import pipeline_cost

    base = Side(_trainer({"data": DEVICES}, "dp"))
    sides = {
        (s, m, r): Side(_trainer({"stage": s, "data": DEVICES // s}, "pp", microbatches=m, pipeline_repeats=r))
        for s, m, r in layouts(repeats)[: 1 if smoke else None]
    }
    for side in [base, *sides.values()]:
        side.time_step()  # warm up
    load_before = [round(x, 2) for x in os.getloadavg()]
    times: dict = {k: [] for k in ["dp", *sides]}
    for r in range(rounds):
        order = [("dp", base), *sides.items()]
        for key, side in order if r % 2 == 0 else order[::-1]:
            times[key].append(side.time_step())
    wall = {k: [t[0] for t in v] for k, v in times.items()}
    cpu = {k: [t[1] for t in v] for k, v in times.items()}
    load = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    out: dict = {"baseline_s": statistics.median(wall["dp"]), "load_average": load, "layouts": [], "repeats": {}}
    for (s, m, r), side in sides.items():
        bubble = bubble_fraction(s, m, r)
        # Over `stage`: the shifts (collective-permutes) and, circular, the regrouped layers (XLA moves them
        # with collective-permutes or all-to-alls).
        shifted = sum(
            c.bytes * c.executions
            for c in collectives(side.text)
            if c.kind == "collective-permute" or (c.kind == "all-to-all" and r > 1)
        )
        rec = {
            "stages": s,
            "microbatches": m,
            "repeats": r,
            "layers": MODEL["layers"],
            "shape": (BATCH, SEQ, MODEL["embed"]),
            "dtype": "float32",
            "batch_axes": ("data",),
        }
        stacked = (
            sum(leaf.size * leaf.dtype.itemsize for leaf in _stacked_leaves(side.trainer)) / s
        )  # the stage's layers on each device (pp splits them over `stage` only)
        cost = pipeline_cost(rec, {"stage": s, "data": DEVICES // s}, stage_weight_bytes=stacked)
        predicted = 1 / (1 - bubble)
        measured = statistics.median(wall[(s, m, r)]) / statistics.median(wall["dp"])
        measured_cpu = statistics.median(cpu[(s, m, r)]) / statistics.median(cpu["dp"])
        row = {
            "stages": s,
            "microbatches": m,
            "repeats": r,
            "bubble": bubble,
            "predicted_slowdown": predicted,
            "step_s": statistics.median(wall[(s, m, r)]),
            "measured_slowdown": measured,
            "measured_slowdown_device_s": measured_cpu,
            "paired_slowdown": statistics.median([a / b for a, b in zip(wall[(s, m, r)], wall["dp"], strict=True)]),
            "excess": measured / predicted - 1,
            "excess_device_s": measured_cpu / predicted - 1,
            "stage_bytes_hlo": shifted,
            "stage_bytes_analytic": cost["collective_permute_bytes"] + cost["regroup_bytes"],
            "first_loss_rel_diff": abs(side.first_loss - base.first_loss) / base.first_loss,
        }
        out["layouts"].append(row)
        per_r = out["repeats"].setdefault(
            str(r), {"measured_slowdown": [], "measured_slowdown_device_s": [], "predicted_slowdown": []}
        )
        for k in per_r:
            per_r[k].append(row[k])
    return out


def _stacked_leaves(trainer):
    import jax

    from partitioning.boxes import is_logical_box

    return [
        leaf.value
        for leaf in jax.tree.leaves(trainer.abstract_state.params, is_leaf=is_logical_box)
        if is_logical_box(leaf) and "layers" in tuple(leaf.names)
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="alternating timed steps of each layout")
    p.add_argument("--repeats", type=int, nargs="+", default=[1, 2], help="pipeline repeats R to run (1: GPipe)")
    p.add_argument("--smoke", action="store_true", help="2 rounds of the first layout (S=2, M=8, GPipe)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.repeats = 2, [1]
    setup(DEVICES)
    import jax

    assert jax.device_count() == DEVICES, jax.devices()
    res = bench(args.rounds, args.repeats, args.smoke)
    load = "/".join(f"{x:.2f}" for x in res["load_average"]["before"])
    print(f"unpipelined (dp over 8): {res['baseline_s'] * 1e3:.1f} ms/step; load average before (1/5/15 min) {load}")
    print(
        f"{'S':>2} {'M':>3} {'R':>2} {'bubble':>7} {'predicted 1/(1-b)':>18} {'measured':>9} {'device-s':>9} "
        f"{'excess':>7} {'stage B hlo':>14} {'analytic':>10} {'loss diff':>10}"
    )
    for r in res["layouts"]:
        print(
            f"{r['stages']:>2} {r['microbatches']:>3} {r['repeats']:>2} {r['bubble']:>7.1%} "
            f"{r['predicted_slowdown']:>18.3f} {r['measured_slowdown']:>9.3f} {r['measured_slowdown_device_s']:>9.3f} "
            f"{r['excess']:>7.1%} {r['stage_bytes_hlo']:>14,} "
            f"{r['stage_bytes_analytic']:>10,.0f} {r['first_loss_rel_diff']:>10.1e}"
        )
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
