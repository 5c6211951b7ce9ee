"""``partitioning plan CONFIG``: every parameter's layout, per-device memory and communication, before running.

The table comes from ``jax.eval_shape`` only (nothing allocated, no device
needed: the mesh is planned from its axis sizes), so it takes seconds for any
mesh. The compiled view lowers and compiles the real train step
(:mod:`partitioning.cli.compiling`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax

from partitioning.cli.args import config_args, say
from partitioning.cli.compiling import compile_args, compiled, setup_devices, write_json
from partitioning.cli.render import console, render_plan
from partitioning.config.context import split_axes, takes_context
from partitioning.config.load import load_config
from partitioning.config.planning import plan_from_config
from partitioning.config.remat import is_auto
from partitioning.parallel.context import resolve_strategy
from partitioning.plan.axes import node_layout
from partitioning.plan.budget import check_budget, check_host, device_memory, host_budget, host_key
from partitioning.plan.plot import plot_plan

HELP = "every parameter's layout, per-device memory and communication, before running"
EXAMPLES = """examples:
  partitioning plan configs/llama3_70b.yaml
  partitioning plan configs/quickstart.yaml --json plan.json --png plan.png"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--json", metavar="FILE", help="write the plan (table, totals, warnings, compiled view) as JSON")
    p.add_argument("--png", metavar="FILE", help="draw per-device memory by category and the mesh")
    compile_args(p)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    cfg = load_config(args.config, args.set or [])
    devices, here = setup_devices(cfg, args)
    plan, model = plan_from_config(cfg, devices)
    remat_note = None
    if is_auto(cfg):
        policy = getattr(model, "remat", "the model's default")
        remat_note = (
            f"remat: auto is resolved when train starts, on the devices it runs on; planned here as {policy} "
            f"(--set model.remat=... plans another)"
        )
    context_note = _context_note(cfg, plan)
    t1 = time.perf_counter()
    view = compiled(cfg, args, devices, here, plan)
    t2 = time.perf_counter()
    report = {
        "config": str(cfg.path),
        "rules_source": cfg.rules_label(),
        "model": {"name": cfg.model_name, "options": dict(cfg.model_options)},
        "batch": {"batch_size": cfg.train.batch_size, "seq_len": cfg.train.seq_len},
        **plan.to_json(),
        "compiled": view,
        "timing": {"table_s": round(t1 - t0, 3), "compiled_s": round(t2 - t1, 3)},
    }
    if cfg.mesh.nodes:
        report["nodes"] = node_layout(plan.mesh, cfg.mesh.nodes)
    budget = cfg.mesh.memory_bytes if cfg.mesh.memory_bytes is not None else device_memory()
    mem = view.get("memory") if view.get("status") == "ok" else None
    fit = check_budget(plan, budget, mem)
    report["memory_budget"] = {
        "budget": fit.budget,
        "peak": fit.peak,
        "source": fit.source,
        "fits": fit.fits,
        "largest": [list(x) for x in fit.top],
    }
    host = None
    if plan.offload:  # the offloaded state's host memory, for a process driving this machine's devices
        host = check_host(plan, host_budget(cfg.mesh.host_memory), min(devices, jax.local_device_count()), mem)
        report["host_memory"] = {"budget": host.budget, "per_device": host.per_device, "devices": host.devices}
        report["host_memory"].update(need=host.need, source=host.source, fits=host.fits)
    render_plan(report, console())
    for note in (remat_note, context_note):  # with the table on stdout: stderr stays one line when something fails
        if note:
            print(note)
    print(f"memory: {fit.describe()}")
    if host is not None:
        print(f"memory: {host.describe()}")
    if args.json:
        write_json(args.json, report)
    if args.png:
        say(f"wrote {plot_plan(report, args.png)}")
    if not fit.fits:  # printed in full above; the exit status refuses the layout
        raise fit.error(
            cfg.where("mesh", "device_memory")
            if cfg.mesh.device_memory is not None
            else f"{cfg.path}: the devices' memory"
        )
    if host is not None and not host.fits:
        raise host.error(host_key(cfg.mesh.host_memory, cfg.where))
    return 0


def _context_note(cfg: Any, plan: Any) -> str | None:
    """What ``context_parallel: auto`` means for a plan: resolved at train time, planned with the model's rule."""
    sizes = dict(plan.mesh)
    axes = split_axes(cfg, sizes)
    if not takes_context(cfg) or cfg.model_options.get("context_parallel", "auto") != "auto" or not axes:
        return None
    planned = resolve_strategy("auto", cfg.train.seq_len, axes, mesh=sizes)
    return (
        f"context_parallel: auto is resolved when train starts (priced for its devices); planned here as {planned} "
        f"(--set model.context_parallel=ring|all_gather plans another)"
    )
