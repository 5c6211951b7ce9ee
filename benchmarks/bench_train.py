"""Train-step benchmark: the toolkit's Trainer against hand-written JAX, measured in one run.

    python benchmarks/bench_train.py [--rounds 40] [--steps 1] [--json out.json]

All on 8 simulated CPU devices, the quickstart GPT (0.9M params, batch 32 x 128)
laid out with the ``fsdp`` rules unless said otherwise.

1. Step time: ``Trainer.train_step`` against a hand-written ``jax.jit`` step
   (same model, optax transformation, loss, shardings and donation, traced
   under the same mesh and rules). Rounds alternate the two; each round times
   ``--steps`` steps (default 1: runs alternate step by step, so slow drifts
   of a shared machine's load hit both sides alike); the ratio is of the medians
   (target <= 1.02); the median of per-round ratios is printed too, as the
   machine's load drifts less between neighbouring runs, and the ratio of the
   two compiled programs' flops (``cost_analysis``), which no load disturbs.
2. Per-device bytes of params + optimizer state under fsdp, read from the
   arrays' shards: the most loaded device against (total bytes / 8)
   (target <= 1.02).
3. Peak per-device memory of the compiled init (``memory_analysis``:
   arguments + outputs + temporaries - aliased) against the final per-device
   state, for the quickstart GPT and a 100M-parameter GPT (compiled only,
   never allocated) (target <= 1.1): the init never materialises the model.
4. Compile time (trace + lower + compile) of the train step with
   ``scan_layers`` at 48 layers against 4 layers, median of 3 alternating
   (target <= 1.5).

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
QUICKSTART = dict(vocab_size=256, embed=128, heads=4, mlp=384, layers=4, scan_layers=True)


def _tx():
    from partitioning.train.optimizer import make_optimizer

    return make_optimizer("adamw", lr=3e-3, total_steps=1000, warmup_steps=20, weight_decay=0.1, clip_norm=1.0)


def _trainer(rules="fsdp", mesh_shape=None, **model_kw):
    import partitioning as pt
    from partitioning.models import GPT

    mesh = pt.make_mesh(mesh_shape or {"data": 1, "fsdp": -1, "tensor": 1})
    return pt.Trainer(GPT(**{**QUICKSTART, **model_kw}), _tx(), mesh, rules, batch_size=BATCH, seq_len=SEQ)


def hand_written_step(trainer):
    """What a user would write with plain JAX: same model, tx, loss, shardings, donation."""
    import jax
    import optax

    model, tx = trainer.model.module, trainer.tx  # the user's Flax module (the Trainer wraps it)

    def step(state, batch):
        count, params, opt_state = state

        def loss_fn(p):
            logits = model.apply({"params": p}, batch["inputs"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (count + 1, params, opt_state), {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    sh = trainer.state_shardings
    state_sh = (sh.step, sh.params, sh.opt_state)
    batch_sh = {"inputs": trainer.batch_sharding, "targets": trainer.batch_sharding}
    return jax.jit(
        step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, trainer.replicated), donate_argnums=0
    )


def bench_step_time(rounds: int, steps: int) -> dict:
    import jax

    from partitioning.data.corpus import load_corpus
    from partitioning.mesh import sharding_context

    trainer = _trainer()
    data = load_corpus().batches("train", BATCH, SEQ, trainer.batch_sharding, seed=0)
    batches = [data.batch_at(k) for k in range(steps)]
    hand = hand_written_step(trainer)
    tk_state = trainer.init(jax.random.key(0))
    s = trainer.init(jax.random.key(0))
    hw_state = (s.step, s.params, s.opt_state)

    def run_toolkit():
        nonlocal tk_state
        t = time.perf_counter()
        for b in batches:
            tk_state, m = trainer.train_step(tk_state, b)
        jax.block_until_ready(m)
        return (time.perf_counter() - t) / len(batches)

    def run_hand():
        nonlocal hw_state
        # A hand-written loop sets the mesh and rules once, around the whole loop.
        with sharding_context(trainer.mesh, trainer.rules):
            t = time.perf_counter()
            for b in batches:
                hw_state, m = hand(hw_state, b)
            jax.block_until_ready(m)
        return (time.perf_counter() - t) / len(batches)

    # The compiled programs themselves, independent of the machine's load.
    state_in, batch_in = trainer.abstract_inputs()
    tk_cost = trainer.lower_train_step().compile().cost_analysis()
    with sharding_context(trainer.mesh, trainer.rules):
        hw_cost = hand.lower((state_in.step, state_in.params, state_in.opt_state), batch_in).compile().cost_analysis()
    run_toolkit(), run_hand()  # compile + warm up
    tk, hw = [], []
    for r in range(rounds):
        order = (run_toolkit, run_hand) if r % 2 == 0 else (run_hand, run_toolkit)
        for fn in order:
            (tk if fn is run_toolkit else hw).append(fn())
    paired = [a / b for a, b in zip(tk, hw, strict=True)]  # neighbours in time share the machine's load
    return {
        "toolkit_s": statistics.median(tk),
        "hand_written_s": statistics.median(hw),
        "ratio": statistics.median(tk) / statistics.median(hw),
        "paired_ratio_median": statistics.median(paired),
        "flops_ratio": tk_cost["flops"] / hw_cost["flops"],
        "bytes_accessed_ratio": tk_cost["bytes accessed"] / hw_cost["bytes accessed"],
        "toolkit_runs": tk,
        "hand_runs": hw,
    }


def bench_fsdp_bytes() -> dict:
    import collections

    import jax

    trainer = _trainer()
    state = trainer.init(jax.random.key(0))
    per_device: dict = collections.Counter()
    total = 0
    for arr in jax.tree.leaves((state.params, state.opt_state)):
        total += arr.nbytes
        for shard in arr.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
    worst = max(per_device.values())
    return {
        "total_bytes": total,
        "max_per_device_bytes": worst,
        "ideal_per_device_bytes": total / DEVICES,
        "ratio": worst / (total / DEVICES),
    }


def _init_peak(trainer) -> dict:
    import partitioning as pt

    peak = trainer.init_peak_bytes()
    state = pt.layout.per_device_bytes(trainer.state_layouts()) + 4  # + the step counter
    total = sum(leaf.nbytes for leaf in trainer.state_layouts())
    return {
        "params": trainer.num_params,
        "init_peak_bytes": peak,
        "state_per_device_bytes": state,
        "whole_state_bytes": total,
        "ratio": peak / state,
    }


def bench_init_memory() -> dict:
    return {
        "quickstart": _init_peak(_trainer()),
        "gpt_100m": _init_peak(_trainer(embed=1024, heads=16, mlp=4096, layers=8)),
    }


def bench_compile_time(repeats: int = 3) -> dict:
    times: dict = {4: [], 48: []}
    for _ in range(repeats):
        for layers in (4, 48):
            trainer = _trainer(layers=layers)  # fresh jit objects: nothing cached
            t = time.perf_counter()
            trainer.lower_train_step().compile()
            times[layers].append(time.perf_counter() - t)
    m4, m48 = statistics.median(times[4]), statistics.median(times[48])
    return {"layers_4_s": m4, "layers_48_s": m48, "ratio": m48 / m4, "runs": {str(k): v for k, v in times.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=40, help="alternating runs of each side")
    p.add_argument("--steps", type=int, default=1, help="steps per run")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup(DEVICES)
    import jax

    assert jax.device_count() == DEVICES, jax.devices()
    results = {
        "step_time": bench_step_time(args.rounds, args.steps),
        "fsdp_bytes": bench_fsdp_bytes(),
        "init_memory": bench_init_memory(),
        "compile_time": bench_compile_time(),
    }
    st, fb, im, ct = (results[k] for k in ("step_time", "fsdp_bytes", "init_memory", "compile_time"))
    rows = [
        (
            "train step time: Trainer / hand-written jit",
            f"{st['toolkit_s'] * 1e3:.1f} ms / {st['hand_written_s'] * 1e3:.1f} ms",
            st["ratio"],
            1.02,
        ),
        ("  same, median of per-round ratios", "", st["paired_ratio_median"], 1.02),
        ("  compiled step flops: Trainer / hand-written (accuracy metric)", "", st["flops_ratio"], 1.02),
        (
            "fsdp params+opt bytes: max device / (total/8)",
            f"{fb['max_per_device_bytes']:,} / {fb['ideal_per_device_bytes']:,.0f}",
            fb["ratio"],
            1.02,
        ),
        *[
            (
                f"init peak / final state per device ({k}, {v['params'] / 1e6:.1f}M params)",
                f"{v['init_peak_bytes']:,} / {v['state_per_device_bytes']:,}",
                v["ratio"],
                1.1,
            )
            for k, v in im.items()
        ],
        (
            "compile time, scan_layers: 48 / 4 layers",
            f"{ct['layers_48_s']:.2f} s / {ct['layers_4_s']:.2f} s",
            ct["ratio"],
            1.5,
        ),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"{'metric':{w}s}  {'measured':>30s}  {'ratio':>7s}  {'target':>7s}  ok")
    for name, detail, ratio, target in rows:
        print(
            f"{name:{w}s}  {detail:>30s}  {ratio:7.3f}  {'<=' + str(target):>7s}  {'yes' if ratio <= target else 'NO'}"
        )
    results["targets_met"] = all(r[2] <= r[3] for r in rows)
    report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
