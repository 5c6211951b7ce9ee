"""Expert-parallel benchmark: the MoE train step with `ep` against the same model with replicated experts, in one run.

    python benchmarks/bench_experts.py [--rounds 10] [--json out.json]

All on 8 simulated CPU devices: the quickstart's GPT (4 layers, 128 wide) with
a mixture of 8 SwiGLU experts (256 wide, top-2, capacity factor 1.25) in every
block, batch 32 x 128, adamw. The baseline is the same model with replicated
experts: pure data parallelism over the 8 devices (``dp``), every device holding
every expert and computing all of them for its own tokens. Against it:

- ``ep`` (expert 4 x fsdp 2): 2 experts per device, tokens sent to their
  experts with all-to-all over ``expert``, the rest FSDP;
- ``ep`` (expert 8): one expert per device;
- ``fsdp`` (fsdp 8): experts split along ``embed``, all-gathered before use.

Per layout: step time / baseline (median of alternating rounds, and the median
of per-round ratios); the per-device state (params + optimizer state, from
the plan) and the collective bytes per step and device of the compiled step;
the all-to-all bytes over ``expert`` from the compiled HLO against the analytic
figure (:func:`partitioning.plan.parallel_costs`: the dispatched tokens, ``(groups,
experts, capacity, embed)`` per device, twice forward and twice backward per
layer); the first loss against the baseline's. Simulated devices share the
host's cores: the step time follows the total compute, which the layouts share,
plus what moving data costs on one host; on accelerators ``ep`` also saves the
expert weights' all-reduce (``dp``) or all-gathers (``fsdp``).

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
MOE = {"experts": 8, "top_k": 2, "capacity_factor": 1.25}
MODEL = dict(vocab_size=256, embed=128, heads=4, mlp=256, layers=4, scan_layers=True, moe=MOE)
BASELINE = ("replicated (dp 8)", {"data": DEVICES}, "dp")
LAYOUTS = [
    ("ep (expert 4 x fsdp 2)", {"data": 1, "fsdp": 2, "expert": 4}, "ep"),
    ("ep (expert 8)", {"data": 1, "fsdp": 1, "expert": 8}, "ep"),
    ("fsdp 8", {"data": 1, "fsdp": DEVICES}, "fsdp"),
]


class Side:
    """One layout: its trainer, state, compiled step and a timed step."""

    def __init__(self, name, mesh_shape, rules):
        import jax

        import partitioning as pt
        from partitioning.models import GPT
        from partitioning.plan.axes import collectives_by_axis
        from partitioning.plan.hlo import collectives
        from partitioning.train.state import host_scalar

        self.name, self.mesh_shape, self.rules = name, mesh_shape, rules
        model = GPT(**MODEL)
        tx = pt.make_optimizer("adamw", lr=3e-3, total_steps=1000, warmup_steps=20)
        self.trainer = pt.Trainer(model, tx, pt.make_mesh(mesh_shape), rules, batch_size=BATCH, seq_len=SEQ)
        data = pt.data.load_corpus().batches("train", BATCH, SEQ, self.trainer.batch_sharding, seed=0)
        self.batch = data.batch_at(0)
        self.state = self.trainer.init(jax.random.key(0))
        _, m = self.trainer.train_step(self.trainer.init(jax.random.key(0)), self.batch)
        self.first_loss, self.aux = host_scalar(m["loss"]), host_scalar(m["moe_aux_loss"])
        ops = collectives(self.trainer.lower_train_step().compile().as_text())
        sizes = dict(self.trainer.mesh.shape)
        self.by_axis = collectives_by_axis(ops, sizes)
        self.collective_bytes = sum(c.bytes * c.executions for c in ops)
        a = self.trainer.abstract_state
        plan = pt.build_plan(a.params, a.opt_state, sizes, rules)
        self.state_bytes = plan.totals["params"]["per_device"] + plan.totals["optimizer"]["per_device"]
        expert = [leaf for leaf in plan.params if leaf.path.endswith("mlp/wi_0")][0]
        self.expert_weight_bytes = 3 * expert.per_device_bytes
        costs = pt.plan.parallel_costs(model, a.params, sizes, rules, batch_size=BATCH, seq_len=SEQ)["experts"]
        self.a2a_analytic = costs["all_to_all_bytes"]
        self.a2a_hlo = sum(v["all-to-all"]["bytes"] for v in self.by_axis.values())
        self.a2a_hlo_expert = self.by_axis.get("expert", {}).get("all-to-all", {}).get("bytes", 0)

    def time_step(self) -> float:
        import jax

        t = time.perf_counter()
        self.state, m = self.trainer.train_step(self.state, self.batch)
        jax.block_until_ready(m)
        return time.perf_counter() - t


def bench(rounds: int) -> dict:
    base = Side(*BASELINE)
    sides = [Side(*layout) for layout in LAYOUTS]
    for side in [base, *sides]:
        side.time_step()  # warm up
    times: dict = {s.name: [] for s in [base, *sides]}
    for r in range(rounds):
        order = [base, *sides]
        for side in order if r % 2 == 0 else order[::-1]:
            times[side.name].append(side.time_step())
    base_s = statistics.median(times[base.name])
    out = {"baseline": base.name, "baseline_s": base_s, "layouts": []}
    for side in [base, *sides]:
        t = times[side.name]
        out["layouts"].append(
            {
                "layout": side.name,
                "mesh": side.mesh_shape,
                "rules": side.rules,
                "step_s": statistics.median(t),
                "vs_replicated": statistics.median(t) / base_s,
                "paired_vs_replicated": statistics.median([a / b for a, b in zip(t, times[base.name], strict=True)]),
                "state_bytes_per_device": side.state_bytes,
                "expert_weight_bytes_per_device_per_layer": side.expert_weight_bytes // MODEL["layers"],
                "collective_bytes_per_step": side.collective_bytes,
                "all_to_all_bytes_hlo": side.a2a_hlo,
                "all_to_all_bytes_hlo_over_expert": side.a2a_hlo_expert,
                "all_to_all_bytes_analytic": side.a2a_analytic,
                "a2a_hlo_over_analytic": (side.a2a_hlo / side.a2a_analytic) if side.a2a_analytic else None,
                "first_loss": side.first_loss,
                "first_loss_rel_diff": abs(side.first_loss - base.first_loss) / base.first_loss,
                "moe_aux_loss": side.aux,
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
    print(f"replicated experts ({res['baseline']}): {res['baseline_s'] * 1e3:.1f} ms/step")
    print(
        f"{'layout':24} {'step':>7} {'paired':>7} {'state/dev':>10} {'experts/dev/layer':>17} "
        f"{'collectives/step':>16} {'a2a B hlo':>11} {'analytic':>11} {'ratio':>6} {'loss diff':>9}"
    )
    for r in res["layouts"]:
        ratio = f"{r['a2a_hlo_over_analytic']:.3f}" if r["a2a_hlo_over_analytic"] is not None else "-"
        print(
            f"{r['layout']:24} {r['vs_replicated']:>7.3f} {r['paired_vs_replicated']:>7.3f} "
            f"{r['state_bytes_per_device']:>10,} {r['expert_weight_bytes_per_device_per_layer']:>17,} "
            f"{r['collective_bytes_per_step']:>16,} {r['all_to_all_bytes_hlo']:>11,} "
            f"{r['all_to_all_bytes_analytic']:>11,} {ratio:>6} {r['first_loss_rel_diff']:>9.1e}"
        )
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
