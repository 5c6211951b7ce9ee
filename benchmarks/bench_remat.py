"""``model.remat: auto`` benchmark: the policy it picks against every policy, measured, for the quickstart.

    python benchmarks/bench_remat.py [--rounds 8] [--set model.embed=256 ...] [--json out.json]

All on 8 simulated CPU devices: ``configs/quickstart.yaml`` (plus ``--set``
overrides), built once per remat policy (``none``, ``dots``, ``dots_no_batch``,
``full``); timed steps alternate between the policies (reversed every other
round, the same fixed batch). Reports each policy's median step time, wall and
device-seconds (process CPU time / devices, which a shared machine's other
load disturbs less), the policy ``auto`` resolves to (the cpu profile is
measured once and cached, see ``partitioning.tune.measure.cpu_profile``) and:

- ``auto_vs_none``: auto's step time / ``none``'s (the quickstart before this
  default: ``remat: none``), target < 1;
- ``auto_vs_best``: auto's step time / the fastest policy's, target <= 1.05.

Prints a table and a JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import REPO, report, setup

DEVICES = 8
POLICIES = ("none", "dots", "dots_no_batch", "full")


def bench(rounds: int, sets: list[str]) -> dict:
    import jax

    from partitioning.config.build import mesh_from_config, trainer_from_config
    from partitioning.config.load import load_config
    from partitioning.config.remat import resolve_remat
    from partitioning.data.corpus import load_corpus

    config = str(Path(REPO, "configs", "quickstart.yaml"))
    base = load_config(config, sets)
    mesh = mesh_from_config(base)
    t0 = time.perf_counter()
    resolved, note = resolve_remat(base, mesh)
    resolve_s = time.perf_counter() - t0
    sides = {}
    for policy in POLICIES:
        cfg = load_config(config, [*sets, f"model.remat={policy}"])
        trainer = trainer_from_config(cfg, mesh)
        batch = load_corpus().batches("train", cfg.train.batch_size, cfg.train.seq_len, trainer.batch_sharding, seed=0)
        b = batch.batch_at(0)
        state = trainer.init(jax.random.key(0))
        state, m = trainer.train_step(state, b)  # compile + warm up
        jax.block_until_ready(m)
        sides[policy] = {"trainer": trainer, "state": state, "batch": b, "wall": [], "cpu": []}
    for r in range(rounds):
        for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
            s = sides[policy]
            w, c = time.perf_counter(), time.process_time()
            s["state"], m = s["trainer"].train_step(s["state"], s["batch"])
            jax.block_until_ready(m)
            s["wall"].append(time.perf_counter() - w)
            s["cpu"].append((time.process_time() - c) / DEVICES)
    wall = {p: statistics.median(s["wall"]) for p, s in sides.items()}
    cpu = {p: statistics.median(s["cpu"]) for p, s in sides.items()}
    auto = resolved.model_options["remat"]
    return {
        "sets": sets,
        "auto": auto,
        "note": note,
        "resolve_s": resolve_s,
        "step_s": wall,
        "device_s": cpu,
        "auto_vs_none": wall[auto] / wall["none"],
        "auto_vs_best": wall[auto] / min(wall.values()),
        "auto_vs_none_device_s": cpu[auto] / cpu["none"],
        "auto_vs_best_device_s": cpu[auto] / min(cpu.values()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="timed steps of each policy, alternating")
    p.add_argument("--set", action="append", default=[], help="config override, e.g. model.embed=256")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup(DEVICES)
    res = bench(args.rounds, args.set)
    print(res["note"])
    print(f"{'policy':>14} {'step ms':>9} {'device ms':>10}")
    for policy in POLICIES:
        mark = "  <- auto" if policy == res["auto"] else ""
        print(f"{policy:>14} {res['step_s'][policy] * 1e3:>9.1f} {res['device_s'][policy] * 1e3:>10.1f}{mark}")
    print(
        f"auto / none: {res['auto_vs_none']:.3f} (device-s {res['auto_vs_none_device_s']:.3f}); "
        f"auto / fastest: {res['auto_vs_best']:.3f} (device-s {res['auto_vs_best_device_s']:.3f})"
    )
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
