"""``model.remat: auto`` benchmark: the default against every policy, measured side by side, and its start.

    python benchmarks/bench_remat.py [--rounds 8] [--starts 3] [--set model.embed=256 ...] [--json out.json]
    python benchmarks/bench_remat.py --smoke        # 2 layers, 4 rounds, 2 starts each: proves it runs

All on 8 simulated CPU devices, ``configs/quickstart.yaml`` (plus ``--set``
overrides; ``train.grad_accum=1`` so every side steps the same batch in one
pass), with a verdict cache of its own (a temporary ``PARTITIONING_CACHE``; the
CPU profile copied in, so the estimate is the one a run here makes). Four parts:

1. **estimate**: each policy's step time as tune prices it, and the policy the
   estimate picks (what a short run, ``check`` or another machine's plan uses);
2. **default**: ``remat: auto`` decided as ``partitioning train`` decides it
   when measuring pays (``train.measure_defaults: true``): the fitting policies
   timed side by side, the fastest kept and cached; its line and time spent;
3. **side by side**: every policy (``none``, ``dots``, ``dots_no_batch``,
   ``full``) built once and stepped in alternating rounds (reversed every other
   round, one fixed batch), wall and device-seconds (process CPU time / devices,
   which a shared machine's other load disturbs less):

   - ``default_vs_fastest``: the measured default's step / the fastest policy's
     (target <= 1.03; device-seconds too);
   - ``estimate_vs_fastest``: the estimate's pick's step / the fastest's, and the
     estimate's ranking beside the measured one (``ranking_agrees``);
4. **start**: ``partitioning train ... --set train.steps=1`` in fresh
   processes, alternating: ``auto`` with the verdict cached against the winner
   named (``model.remat=WINNER``); ``cached_start_vs_named``: the median
   process wall time ratio (target <= 1.10).

Prints a table and a JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, report, setup

DEVICES = 8
POLICIES = ("none", "dots", "dots_no_batch", "full")
SMOKE = ["model.layers=2"]
CLI = "import sys; from partitioning.cli import main; sys.exit(main(sys.argv[1:]))"


def _cache(tmp: Path) -> None:
    """A verdict cache of the benchmark's own, with this machine's CPU profile (measured once, as a run finds it)."""
    from partitioning.tune.measure import cache_dir

    own = tmp / "cache"
    own.mkdir()
    for f in Path(cache_dir()).glob("cpu-*.json"):
        shutil.copy(f, own / f.name)
    os.environ["PARTITIONING_CACHE"] = str(own)


def estimate(cfg, mesh) -> dict:
    from partitioning.config.defaults import _profile
    from partitioning.config.remat import remat_choices

    p = _profile(cfg, mesh)
    choices = remat_choices(cfg, p.sizes, p.hw, p.source, p.budget)
    assert choices is not None, "the config names its remat policy: nothing to decide"
    return {"pick": choices.pick, "step_s": choices.estimates, "line": choices.line}


def default(cfg, mesh, batch) -> dict:
    from partitioning.config.defaults import Trial, resolve_defaults

    t0 = time.perf_counter()
    d = resolve_defaults(cfg, mesh, Trial(batch=lambda: batch))
    v = next(v for v in d.verdicts if v.choices.name == "remat")
    return {
        "choice": v.choice,
        "how": v.how,
        "note": v.note(),
        "seconds": v.seconds,
        "spent_s": v.timings.spent_s if v.timings else None,
        "resolve_s": time.perf_counter() - t0,
    }


def side_by_side(config: str, sets: list[str], mesh, rounds: int):
    import jax

    from partitioning.config.build import trainer_from_config
    from partitioning.config.load import load_config
    from partitioning.data.corpus import load_corpus

    sides = {}
    for policy in POLICIES:
        cfg = load_config(config, [*sets, f"model.remat={policy}"])
        trainer = trainer_from_config(cfg, mesh)
        data = load_corpus().batches("train", cfg.train.batch_size, cfg.train.seq_len, trainer.batch_sharding, seed=0)
        b = data.batch_at(0)
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
    return wall, cpu, sides["none"]["batch"]


def starts(config: str, sets: list[str], winner: str, runs: int, tmp: Path) -> dict:
    """Process wall seconds of a 1-step ``train``: auto (cached) and the winner named, alternating."""
    out: dict[str, list[float]] = {"cached": [], "named": []}
    for i in range(runs):
        for side in ("cached", "named") if i % 2 == 0 else ("named", "cached"):
            extra = ["--set", f"model.remat={winner}"] if side == "named" else []
            args = [a for s in sets for a in ("--set", s)] + extra
            run_dir = tmp / f"start-{side}-{i}"
            cmd = [sys.executable, "-c", CLI, "train", config, "--no-progress", "--set", "train.steps=1"]
            t0 = time.perf_counter()
            p = subprocess.run([*cmd, *args, "--set", f"run_dir={run_dir}"], capture_output=True, text=True, cwd=REPO)
            out[side].append(time.perf_counter() - t0)
            if p.returncode:
                raise RuntimeError(f"train ({side}) failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
            if side == "cached" and "from the cache" not in p.stdout:
                raise RuntimeError(f"the cached run did not read the verdict: {p.stdout.strip().splitlines()[:6]}")
    return out


def _rank(times: dict) -> list[str]:
    return sorted(times, key=lambda k: times[k])


def bench(rounds: int, runs: int, sets: list[str], tmp: Path) -> dict:
    from partitioning.config.build import mesh_from_config
    from partitioning.config.load import load_config

    _cache(tmp)
    config = str(Path(REPO, "configs", "quickstart.yaml"))
    sets = ["train.grad_accum=1", *sets]
    base = load_config(config, sets)
    mesh = mesh_from_config(base)
    est = estimate(base, mesh)
    wall, cpu, batch = side_by_side(config, sets, mesh, rounds)
    dflt = default(load_config(config, [*sets, "train.measure_defaults=true"]), mesh, batch)
    start = starts(config, sets, dflt["choice"], runs, tmp) if runs else {"cached": [], "named": []}
    pick, chosen = est["pick"], dflt["choice"]
    measured_rank = _rank(cpu)
    est_rank = _rank({k: v for k, v in est["step_s"].items() if v is not None})
    return {
        "sets": sets,
        "estimate": est,
        "default": dflt,
        "step_s": wall,
        "device_s": cpu,
        "fastest": min(cpu, key=lambda k: cpu[k]),
        "default_vs_fastest": wall[chosen] / min(wall.values()),
        "default_vs_fastest_device_s": cpu[chosen] / min(cpu.values()),
        "estimate_vs_fastest": wall[pick] / min(wall.values()),
        "estimate_vs_fastest_device_s": cpu[pick] / min(cpu.values()),
        "default_vs_none": wall[chosen] / wall["none"],
        "measured_ranking": measured_rank,
        "estimated_ranking": est_rank,
        "ranking_agrees": [p for p in measured_rank if p in est_rank] == est_rank,
        "start_s": start,
        "cached_start_vs_named": (
            statistics.median(start["cached"]) / statistics.median(start["named"]) if start["named"] else None
        ),
        "load_average": os.getloadavg(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="timed steps of each policy, alternating")
    p.add_argument("--starts", type=int, default=3, help="1-step train processes of each side, alternating")
    p.add_argument("--set", action="append", default=[], help="config override, e.g. model.embed=256")
    p.add_argument("--smoke", action="store_true", help=f"{' '.join(SMOKE)}, 4 rounds, 2 starts")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.set, args.rounds, args.starts = [*SMOKE, *args.set], 4, 2
    setup(DEVICES)
    with tempfile.TemporaryDirectory() as tmp:
        res = bench(args.rounds, args.starts, args.set, Path(tmp))
    est, d = res["estimate"], res["default"]
    print(d["note"])
    print(f"{'policy':>14} {'step ms':>9} {'device ms':>10} {'est. ms':>8}")
    for policy in POLICIES:
        mark = ("  <- default" if policy == d["choice"] else "") + ("  <- estimate" if policy == est["pick"] else "")
        e = est["step_s"].get(policy)
        e_ms = f"{e * 1e3:>8.1f}" if e is not None else f"{'-':>8}"
        print(f"{policy:>14} {res['step_s'][policy] * 1e3:>9.1f} {res['device_s'][policy] * 1e3:>10.1f} {e_ms}{mark}")
    print(
        f"default / fastest: {res['default_vs_fastest']:.3f} (device-s {res['default_vs_fastest_device_s']:.3f}; "
        f"target <= 1.03); estimate / fastest: {res['estimate_vs_fastest']:.3f} "
        f"(device-s {res['estimate_vs_fastest_device_s']:.3f}); ranking measured {res['measured_ranking']}, "
        f"estimated {res['estimated_ranking']}"
    )
    if res["cached_start_vs_named"] is not None:
        print(f"start, cached / named: {res['cached_start_vs_named']:.3f} (target <= 1.10)")
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
