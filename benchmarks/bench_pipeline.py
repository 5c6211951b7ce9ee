"""Pipeline benchmark: the pipelined train step against the same model unpipelined, measured in one run.

    python benchmarks/bench_pipeline.py [--rounds 10] [--json out.json]

All on 8 simulated CPU devices: a GPT of the quickstart's width with 8 layers,
batch 32 x 128, adamw. The unpipelined baseline is pure data parallelism over
the 8 devices (``dp``); each pipelined layout is ``pp`` with ``S`` stages x
``8 / S``-way data parallelism and ``M`` micro-batches.

1. Step time, pipelined / unpipelined (median of alternating rounds, and the
   median of per-round ratios), beside what the schedule predicts. On real
   accelerators a stage idles during the bubble, so a step takes
   ``1 / (1 - bubble) = (M+S-1)/M`` times the unpipelined one (communication
   aside). Simulated CPU devices share the host's cores, so idling is not
   free time: the bubble iterations run (on zeros) and cost what they compute,
   and so do the embedding and head that every stage computes for its own
   copy of the batch, and the pipeline's bookkeeping (buffers, selects, the
   per-iteration gradient reductions). (XLA's ``cost_analysis`` counts a while
   loop's body once, so compiled flops cannot tell the two apart here.)
2. Collective-permute bytes per step and device: from the compiled HLO
   (``partitioning.plan.hlo``) against the analytic ``2 (M+S-1)`` shifts of one
   micro-batch's activations (``partitioning.plan.parallel``); losses equal
   the unpipelined ones (first step, relative difference).

Prints a table and a JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
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

        from partitioning.train.data import load_corpus
        from partitioning.train.state import host_scalar

        self.trainer = trainer
        data = load_corpus().batches("train", BATCH, SEQ, trainer.batch_sharding, seed=0)
        self.batch = data.batch_at(0)
        self.state = trainer.init(jax.random.key(0))
        _, m = trainer.train_step(trainer.init(jax.random.key(0)), self.batch)
        self.first_loss = host_scalar(m["loss"])
        compiled = trainer.lower_train_step().compile()
        self.text = compiled.as_text()

    def time_step(self) -> float:
        import jax

        t = time.perf_counter()
        self.state, m = self.trainer.train_step(self.state, self.batch)
        jax.block_until_ready(m)
        return time.perf_counter() - t


def bench(rounds: int) -> dict:
    from partitioning.parallel import bubble_fraction
    from partitioning.plan.hlo import collectives
    from partitioning.plan.parallel import pipeline_cost

    base = Side(_trainer({"data": DEVICES}, "dp"))
    sides = {(s, m): Side(_trainer({"stage": s, "data": DEVICES // s}, "pp", microbatches=m)) for s, m in LAYOUTS}
    for side in [base, *sides.values()]:
        side.time_step()  # warm up
    times: dict = {k: [] for k in ["dp", *sides]}
    for r in range(rounds):
        order = [("dp", base), *sides.items()]
        for key, side in order if r % 2 == 0 else order[::-1]:
            times[key].append(side.time_step())
    out = {"baseline_s": statistics.median(times["dp"]), "layouts": []}
    for (s, m), side in sides.items():
        bubble = bubble_fraction(s, m)
        shifted = sum(c.bytes * c.executions for c in collectives(side.text) if c.kind == "collective-permute")
        rec = {
            "stages": s,
            "microbatches": m,
            "layers": MODEL["layers"],
            "shape": (BATCH, SEQ, MODEL["embed"]),
            "dtype": "float32",
            "batch_axes": ("data",),
        }
        analytic = pipeline_cost(rec, {"stage": s, "data": DEVICES // s})["collective_permute_bytes"]
        out["layouts"].append(
            {
                "stages": s,
                "microbatches": m,
                "bubble": bubble,
                "predicted_slowdown": 1 / (1 - bubble),
                "step_s": statistics.median(times[(s, m)]),
                "slowdown": statistics.median(times[(s, m)]) / statistics.median(times["dp"]),
                "paired_slowdown": statistics.median([a / b for a, b in zip(times[(s, m)], times["dp"], strict=True)]),
                "collective_permute_bytes_hlo": shifted,
                "collective_permute_bytes_analytic": analytic,
                "first_loss_rel_diff": abs(side.first_loss - base.first_loss) / base.first_loss,
            }
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="alternating timed steps of each layout")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup(DEVICES)
    import jax

    assert jax.device_count() == DEVICES, jax.devices()
    res = bench(args.rounds)
    print(f"unpipelined (dp over 8): {res['baseline_s'] * 1e3:.1f} ms/step")
    print(
        f"{'S':>2} {'M':>3} {'bubble':>7} {'predicted 1/(1-b)':>18} {'measured':>9} {'paired':>7} "
        f"{'permute B hlo':>14} {'analytic':>10} {'loss diff':>10}"
    )
    for r in res["layouts"]:
        print(
            f"{r['stages']:>2} {r['microbatches']:>3} {r['bubble']:>7.1%} {r['predicted_slowdown']:>18.3f} "
            f"{r['slowdown']:>9.3f} {r['paired_slowdown']:>7.3f} "
            f"{r['collective_permute_bytes_hlo']:>14,} {r['collective_permute_bytes_analytic']:>10,} "
            f"{r['first_loss_rel_diff']:>10.1e}"
        )
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
