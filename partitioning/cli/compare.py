"""``partitioning compare CONFIG --rules A B ...``: several rule tables side by side."""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from partitioning.cli.args import config_args
from partitioning.cli.compiling import compile_args, compiled, setup_devices, write_json
from partitioning.cli.render import console
from partitioning.config.load import load_config
from partitioning.config.planning import plan_from_config
from partitioning.fmt import fmt_bytes

HELP = "side by side per-device memory, communication and replication of several rule tables"
EXAMPLES = """examples:
  partitioning compare configs/quickstart.yaml --rules fsdp fsdp_tp tp
  partitioning compare configs/llama3_70b.yaml --rules fsdp_tp my_rules.yaml --no-compile"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--rules",
        nargs="+",
        required=True,
        metavar="RULES",
        help="rule tables to compare: preset names or rules YAML files",
    )
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    compile_args(p)


def run(args: argparse.Namespace) -> int:
    cfg0 = load_config(args.config, args.set or [])
    configs = [(name, load_config(args.config, list(args.set or []) + [f"rules={name}"])) for name in args.rules]
    devices, here = setup_devices(cfg0, args)
    rows = []
    for name, cfg in configs:
        t0 = time.perf_counter()
        plan, _ = plan_from_config(cfg, devices)
        view = compiled(cfg, args, devices, here, plan, extra_set=[f"rules={name}"])
        rows.append(
            {
                "rules": name,
                "totals": plan.totals,
                "replicated_share": plan.replicated_share,
                "warnings": plan.warnings(),
                "errors": plan.errors,
                "compiled": view,
                "wall_s": round(time.perf_counter() - t0, 3),
            }
        )
    sizes = plan.mesh  # every table plans the same mesh
    out = console()
    t = Table(title=f"{cfg0.model_name} on mesh {sizes} ({devices:,} devices): per device")
    t.add_column("rules")
    for col in (
        "params",
        "optimizer",
        "gradients",
        "total",
        "total / ideal",
        "replicated",
        "all-gather",
        "reduce-scatter",
        "all-reduce",
        "all-to-all",
        "coll. permute",
        "collectives",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        tot = r["totals"]
        cells = [fmt_bytes(tot[k]["per_device"]) for k in ("params", "optimizer", "gradients", "total")]
        cells.append(f"{tot['total']['per_device'] / tot['total']['ideal']:.2f}x")
        cells.append(f"{r['replicated_share']:.1%}")
        v = r["compiled"]
        if v["status"] == "ok":
            c = v["collectives"]
            cells += [
                fmt_bytes(c[k]["bytes"])
                for k in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
            ]
            cells.append(fmt_bytes(sum(x["bytes"] for x in c.values())))
        else:
            cells += ["-"] * 6
        t.add_row(r["rules"], *cells)
    out.print(t)
    out.print("collective columns: bytes per step per device (buffer sizes; loop iterations counted)")
    for r in rows:
        if r["compiled"]["status"] != "ok":
            out.print(
                f"{r['rules']}: compiled view {r['compiled']['status']}: {r['compiled']['reason']}",
                highlight=False,
                markup=False,
            )
        for w in r["warnings"]:
            out.print(f"{r['rules']}: {w}", highlight=False, markup=False)
    if args.json:
        write_json(
            args.json,
            {"config": str(cfg0.path), "model": cfg0.model_name, "devices": devices, "mesh": sizes, "tables": rows},
        )
    return 0
