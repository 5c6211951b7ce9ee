"""LoRA vs full fine-tuning benchmark: per-device state memory and step time, measured in one run.

    python benchmarks/bench_lora.py [--rounds 8] [--rank 2] [--json out.json]

The same GPT (vocab 1024, embed 512, heads 8, mlp 2048, 4 layers: 17.3M params)
fine-tuned two ways on 8 simulated CPU devices, FSDP, adamw, one fixed batch:

- full: every param trains, stored in float32 (the usual mixed-precision master
  weights): params + gradients + two adam moments;
- LoRA: adapters of rank ``--rank`` on attention and MLP (``model.lora``), only
  they train (float32, with gradients and moments); the base is frozen and
  stored in bfloat16;
- nf4: the same LoRA over a base whose attention and MLP kernels are stored
  NF4 (``model.lora.base_dtype: nf4``, QLoRA; embeddings, head and norms stay
  bfloat16), compared with the bfloat16-base LoRA (``nf4_vs_lora``).

Reported, for each side and as LoRA / full ratios:

1. ``state_bytes``: the train state resident on one device after a step (the
   sum of device 0's shards of params and optimizer state), measured; target
   LoRA <= 0.25x of full with adapters < 1% of the params; beside it ``plan``'s
   params + optimizer state per device (``plan_state_bytes``);
2. ``step_peak_bytes``: the compiled step's peak on one device (XLA's memory
   analysis: arguments + outputs + temporaries - aliased; gradients and
   activations included); beside it ``plan``'s analytic figure, params +
   gradients + optimizer state (``plan_with_grads_bytes``: no activations);
3. ``step_s``: median step time (the sides alternate, reversed every other
   round, so both see the same machine load);

``plan``'s figures come from :func:`partitioning.build_plan` with the trainer's
frozen paths; for the time, the compiled step's FLOPs (``plan``'s compiled view).
Prints a table and a JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import report, setup

DEVICES = 8
MODEL = {"vocab_size": 1024, "embed": 512, "heads": 8, "mlp": 2048, "layers": 4}
BATCH, SEQ = 8, 128
TARGETS = ["attn/[qkvo]$", "mlp/w"]


def side(lora: dict | None) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import partitioning as pt
    from partitioning.models import GPT
    from partitioning.plan.compiled import memory_stats

    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    model = GPT(**MODEL, lora=lora, param_dtype=jnp.bfloat16) if lora else GPT(**MODEL)
    tx = pt.make_optimizer("adamw", lr=1e-3, total_steps=100, weight_decay=0.1, clip_norm=1.0)
    trainer = pt.Trainer(model, tx, mesh, "fsdp", batch_size=BATCH, seq_len=SEQ)
    params, opt_state = trainer.abstract_state.params, trainer.abstract_state.opt_state
    plan = pt.build_plan(params, opt_state, dict(mesh.shape), "fsdp", frozen=trainer.frozen)
    compiled = trainer.lower_train_step().compile()
    peak = memory_stats(compiled)
    from partitioning.plan.flops import step_flops

    flops = step_flops(compiled)
    state = trainer.init(jax.random.key(0))
    batch = pt.data.TokenBatches((np.arange(1 << 16) * 7) % MODEL["vocab_size"], BATCH, SEQ, trainer.batch_sharding)
    b = batch.batch_at(0)
    state, m = trainer.train_step(state, b)  # compile + warm up
    jax.block_until_ready(m)
    dev0 = jax.devices()[0]

    def resident(tree) -> int:
        return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == dev0)

    totals = plan.totals
    return {
        "trainer": trainer,
        "state": state,
        "batch": b,
        "wall": [],
        "params": plan.num_params,
        "trainable_params": sum(leaf.size for leaf in plan.trainable_params),
        "state_bytes": resident(state.params) + resident(state.opt_state),
        "plan_state_bytes": int(totals["params"]["per_device"] + totals["optimizer"]["per_device"]),
        "plan_with_grads_bytes": int(totals["total"]["per_device"]),
        "step_peak_bytes": int(peak["peak_estimate"]) if peak else None,
        "step_flops": flops,
    }


def bench(rounds: int, rank: int) -> dict:
    import jax

    lora_opts = {"rank": rank, "alpha": 2 * rank, "targets": TARGETS}
    sides = {"full": side(None), "lora": side(lora_opts), "nf4": side({**lora_opts, "base_dtype": "nf4"})}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            s = sides[name]
            t = time.perf_counter()
            s["state"], m = s["trainer"].train_step(s["state"], s["batch"])
            jax.block_until_ready(m)
            s["wall"].append(time.perf_counter() - t)
    out: dict = {"model": MODEL, "batch": [BATCH, SEQ], "devices": DEVICES, "rank": rank, "targets": TARGETS}
    keys = (
        "params",
        "trainable_params",
        "state_bytes",
        "plan_state_bytes",
        "plan_with_grads_bytes",
        "step_peak_bytes",
        "step_flops",
    )
    for name, s in sides.items():
        out[name] = {k: s[k] for k in keys} | {"step_s": statistics.median(s["wall"])}
    full, lora = out["full"], out["lora"]
    out["adapter_share"] = lora["trainable_params"] / lora["params"]
    out["ratios"] = {
        "state_bytes": lora["state_bytes"] / full["state_bytes"],
        "plan_state_bytes": lora["plan_state_bytes"] / full["plan_state_bytes"],
        "plan_with_grads_bytes": lora["plan_with_grads_bytes"] / full["plan_with_grads_bytes"],
        "step_peak_bytes": (lora["step_peak_bytes"] or 0) / (full["step_peak_bytes"] or 1),
        "step_s": lora["step_s"] / full["step_s"],
        "step_flops": (lora["step_flops"] or 0) / (full["step_flops"] or 1),
    }
    nf4 = out["nf4"]
    out["nf4_vs_lora"] = {
        k: (nf4[k] or 0) / (lora[k] or 1) for k in ("state_bytes", "plan_state_bytes", "step_peak_bytes", "step_s")
    }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="timed steps of each side, alternating")
    p.add_argument("--rank", type=int, default=2, help="LoRA rank")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup(DEVICES)
    res = bench(args.rounds, args.rank)
    mib = 2**20
    print(
        f"{res['full']['params']:,} params; LoRA rank {res['rank']} on {', '.join(TARGETS)}: "
        f"{res['lora']['trainable_params']:,} trainable ({res['adapter_share']:.2%})"
    )
    print(
        f"{'':>6} {'state MiB':>10} {'plan MiB':>9} {'step peak MiB':>14} {'plan+grads MiB':>15} {'step ms':>8} "
        f"{'GFLOP/dev':>10}"
    )
    for name in ("full", "lora", "nf4"):
        s = res[name]
        print(
            f"{name:>6} {s['state_bytes'] / mib:>10.2f} {s['plan_state_bytes'] / mib:>9.2f} "
            f"{(s['step_peak_bytes'] or 0) / mib:>14.2f} {s['plan_with_grads_bytes'] / mib:>15.2f} "
            f"{s['step_s'] * 1e3:>8.1f} "
            f"{(s['step_flops'] or 0) / 1e9:>10.3f}"
        )
    r = res["ratios"]
    print(
        f"LoRA / full: state {r['state_bytes']:.3f} (plan {r['plan_state_bytes']:.3f}; target <= 0.25), "
        f"step peak {r['step_peak_bytes']:.3f} (plan, no activations: {r['plan_with_grads_bytes']:.3f}), "
        f"step time {r['step_s']:.3f} (compiled FLOPs {r['step_flops']:.3f})"
    )
    q = res["nf4_vs_lora"]
    print(
        f"nf4 base / bf16 base LoRA: state {q['state_bytes']:.3f} (plan {q['plan_state_bytes']:.3f}), "
        f"step peak {q['step_peak_bytes']:.3f}, step time {q['step_s']:.3f}"
    )
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
