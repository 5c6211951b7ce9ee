"""``partitioning tune CONFIG``: the best layout for a model, a device count and a memory budget, with the reasons.

1. Reads the config's model, optimizer and batch (``jax.eval_shape`` only).
2. Prices every candidate layout (:mod:`partitioning.tune`): meshes of the
   devices over the axes of each rule table (the presets and the config's
   own; ``pp`` and ``pp_fsdp`` when the model stacks its layers, ``ep`` when it
   has expert layers), ZeRO-1, remat policies (when the model has ``remat``),
   micro-batches and pipeline micro-batches; rejects what the rules cannot split or the budget cannot
   hold, with the reason; ranks the rest by estimated step time.
3. Compiles the leader (in this process up to 64 devices, else in a child on
   simulated devices; XLA's CPU backend stops at 2048) and folds in XLA's
   memory and the compiled step's costs, until the leader is a compiled
   layout that fits or ``--compile`` compiles are spent.
4. Prints the ranked table and the recommendation; ``--json``, ``--png``,
   ``--out best.yaml`` (a runnable config). Nothing fits: one line saying
   which budget would fit the smallest layout, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from partitioning.cli.args import config_args, say
from partitioning.cli.compiling import CPU_MAX_DEVICES, IN_PROCESS_MAX, compile_in_child, plan_devices, write_json
from partitioning.cli.render import console
from partitioning.cli.tune_report import render_search, write_best
from partitioning.config.axes import check_axes_used
from partitioning.config.load import load_config
from partitioning.config.planning import compiled_from_config, tune_inputs
from partitioning.config.remat import remat_policies
from partitioning.config.schema import Config
from partitioning.devices import simulate_devices
from partitioning.errors import ConfigError, MeshError, PartitioningError, ShardingError
from partitioning.fmt import parse_bytes
from partitioning.layout import logical_names
from partitioning.plan.plan import build_plan, mesh_sizes
from partitioning.rules import Rules, preset_names
from partitioning.tune.hardware import Hardware, hardware
from partitioning.tune.hardware_file import load_hardware
from partitioning.tune.host import priced_remats
from partitioning.tune.search import Search, search

HELP = "the best layout for a device count and memory budget: every candidate priced, ranked, explained"
EXAMPLES = """examples:
  partitioning tune configs/llama3_70b.yaml --devices 2048 --hardware v5p --out best.yaml
  partitioning tune configs/quickstart.yaml --hardware cpu --json tune.json --png tune.png"""
PRESETS = ("dp", "fsdp", "tp", "fsdp_tp", "seq", "fsdp_cp")
MEASURE_DEVICES = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--hardware",
        default="h100",
        metavar="NAME|FILE",
        help="a profile (h100, h200, a100-80g, v4, v5e, v5p, cpu: measured here) or a YAML file",
    )
    p.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="per-device budget, e.g. 80GiB (default: mesh.device_memory, else the hardware's memory)",
    )
    p.add_argument("--top", type=int, default=10, metavar="K", help="rows of the ranked table (default 10)")
    p.add_argument(
        "--rules", nargs="+", metavar="RULES", help="rule tables to search (default: the presets and the config's own)"
    )
    p.add_argument("--json", metavar="FILE", help="write every candidate, priced or rejected, as JSON")
    p.add_argument("--png", metavar="FILE", help="draw the candidates: peak memory against estimated step time")
    p.add_argument("--out", metavar="FILE", help="write the best layout as a runnable config YAML")
    p.add_argument(
        "--compile",
        type=int,
        default=None,
        metavar="N",
        dest="compiles",
        help=f"compiles at most (default 8 up to {IN_PROCESS_MAX} devices, else 2; 0: none)",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one compile (default 900)")


def _budget(cfg: Config, args: argparse.Namespace, hw: Hardware) -> int:
    if args.device_memory is not None:
        try:
            n = parse_bytes(args.device_memory)
        except ValueError as e:
            raise ConfigError(f"--device-memory: {e}", arg="device_memory") from None
        if n < 1:
            raise ConfigError(f"--device-memory: must be at least 1 byte, got {args.device_memory!r}")
        return n
    return cfg.mesh.memory_bytes if cfg.mesh.memory_bytes is not None else hw.memory


def _hardware(name: str, devices: int) -> Hardware:
    if name.lower() != "cpu":
        if name.endswith((".yaml", ".yml")) or Path(name).exists():
            if not Path(name).is_file():
                raise ConfigError(f"--hardware {name}: no such file", arg="hardware")
            return load_hardware(name)
        return hardware(name)
    from partitioning.tune.measure import measure_cpu

    n = devices if devices <= IN_PROCESS_MAX else MEASURE_DEVICES
    say(f"measuring the cpu profile on {n} simulated devices")
    return measure_cpu(n)


def _tables(
    cfg: Config, names: list[str] | None, config_path: str, records: Sequence[dict[str, Any]] = ()
) -> dict[str, Rules]:
    if names:
        out = {}
        for n in names:
            try:
                out[n] = Rules.preset(n) if n in preset_names() else Rules.from_yaml(Path(n))
            except PartitioningError as e:
                raise ConfigError(f"--rules {n}: {e}") from None
        return out
    kinds = {r["kind"] for r in records}
    extra = (("pp", "pp_fsdp") if "pipeline" in kinds else ()) + (("ep",) if "experts" in kinds else ())
    out = {n: Rules.preset(n) for n in PRESETS + extra}
    if "pipeline" in kinds:
        # Stages across tensor parallelism too: with many devices a stage's data shards need a sequence
        # of every micro-batch each, so pipelines at scale keep a tensor axis inside the stage.
        for n in ("tp", "fsdp_tp"):
            out[f"pp_{n}"] = Rules([["layers", "stage"]]) + Rules.preset(n)
    own = cfg.rules.to_list()
    if not any(own == r.to_list() and cfg.rules.declared_batch_axes == r.declared_batch_axes for r in out.values()):
        out[f"config ({Path(config_path).name})"] = cfg.rules
    return out


def _model_axes(cfg: Config, params: Any, activations: set) -> list[str]:
    """The config's mesh axes the model names directly (no rule mentions them): every candidate keeps them."""
    used = {n for names in activations for n in names} | {
        n for names in jax.tree.leaves(logical_names(params), is_leaf=lambda x: isinstance(x, tuple)) for n in names
    }
    return [a for a in cfg.mesh.shape if a in used and a not in cfg.rules.logical_names]


def compile_candidate(
    cfg: Config, sets: list[str], overrides: list[str], devices: int, here: bool, timeout: float
) -> dict[str, Any]:
    """The compiled view of the config turned into one candidate layout (here or in a child)."""
    if devices > CPU_MAX_DEVICES:
        return {"status": "skipped", "reason": f"XLA's CPU backend compiles for at most {CPU_MAX_DEVICES} devices"}
    if here:
        try:
            return compiled_from_config(load_config(cfg.path, sets + overrides), devices)
        except PartitioningError as e:
            return {"status": "failed", "reason": str(e)}
    args = [str(cfg.path), "--devices", str(devices)]
    for s in sets + overrides:
        args += ["--set", s]
    return compile_in_child("partitioning.cli.compiling", args, devices, timeout=timeout)


def refine(
    s: Search, cfg: Config, sets: list[str], devices: int, here: bool, budget_compiles: int, timeout: float
) -> int:
    """Compiles the leader until the leader is a compiled layout that fits (or the compiles run out)."""
    done = 0
    while done < budget_compiles:
        leader = next((r for r in s.ranked if r.compiled_view is None), None)
        if leader is None or (s.ranked and s.ranked[0].compiled_view is not None and s.ranked[0].fits):
            break
        say(f"compiling {leader.candidate.label} on {devices:,} simulated devices")
        t0 = time.perf_counter()
        view = compile_candidate(
            cfg, sets, leader.candidate.overrides(leader.rules, leader.optimizer_rules), devices, here, timeout
        )
        s.add_compiled(leader, view)
        done += 1
        note = (
            f"peak {leader.peak / 2**30:.2f} GiB ({'fits' if leader.fits else 'does not fit'})"
            if view.get("status") == "ok"
            else f"{view.get('status')}: {view.get('reason')}"
        )
        say(f"  compiled in {time.perf_counter() - t0:.0f} s: {note}")
        if view.get("status") != "ok":
            break
    return done


def _check_config_mesh(cfg: Config, devices: int, params: Any, opt_state: Any) -> None:
    """The config's own mesh uses every axis, as in check / train (tune searches other meshes too, but a typo
    in this one is still a typo)."""
    try:
        sizes = mesh_sizes(cfg.mesh.shape, devices)
    except MeshError:
        return  # a mesh for another device count: tune searches this count's meshes
    p = build_plan(params, opt_state, sizes, cfg.rules, optimizer_rules=cfg.optimizer_rules, on_indivisible="replicate")
    check_axes_used(cfg, sizes, p.params + p.opt_state)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    sets = list(args.set or [])
    cfg = load_config(args.config, sets)
    devices = plan_devices(cfg, args.devices)
    if args.top < 1:
        raise ConfigError(f"--top must be at least 1, got {args.top}", arg="top")
    if args.compiles is not None and args.compiles < 0:
        raise ConfigError(f"--compile must be 0 or more, got {args.compiles}", arg="compile")
    here = devices <= IN_PROCESS_MAX
    if here or args.hardware.lower() == "cpu":
        try:
            simulate_devices(devices if here else MEASURE_DEVICES, quiet=False)
        except MeshError as e:
            raise MeshError(f"--devices: {e}") from None
    hw = _hardware(args.hardware, devices)
    budget = _budget(cfg, args, hw)
    inputs = tune_inputs(cfg)
    params, opt_state, records, names, w = (
        inputs.params,
        inputs.opt_state,
        inputs.records,
        inputs.names,
        inputs.workload,
    )
    _check_config_mesh(cfg, devices, params, opt_state)
    tables = _tables(cfg, args.rules, args.config, records)
    s = search(
        params,
        opt_state,
        tables,
        devices,
        w,
        hw,
        budget,
        remats=priced_remats(remat_policies(cfg), hw) or (None,),
        activations={n: names for n in tables},
        on_indivisible=cfg.on_indivisible,
        records=records,
        model_axes=_model_axes(cfg, params, names),
        frozen=inputs.frozen,
    )
    compiles = args.compiles if args.compiles is not None else (8 if here else 2)
    t1 = time.perf_counter()
    n_compiled = refine(s, cfg, sets, devices, here, compiles, args.timeout)
    t2 = time.perf_counter()
    best = s.best
    report = {
        "config": str(cfg.path),
        "model": cfg.model_name,
        "devices": devices,
        "parameters": w.params,
        "tokens_per_step": w.tokens,
        "best": best.to_json() if best else None,
        "search": s.to_json(),
        "timing": {
            "search_s": round(s.seconds, 2),
            "compile_s": round(t2 - t1, 2),
            "compiles": n_compiled,
            "total_s": round(t2 - t0, 2),
        },
    }
    out = console()
    render_search(report, s, args.top, out)
    if args.json:
        write_json(args.json, report)
    if args.png:
        from partitioning.tune.plot import plot_search

        plot_search(report, args.png)
        say(f"wrote {args.png}")
    if best is None:
        raise ShardingError(s.nothing_fits(), arg="device_memory")
    if args.out:
        write_best(cfg, sets, best, args.out, report)
    sys.stdout.flush()
    return 0
