"""``partitioning compare CONFIG --rules A B ...``: several rule tables side by side, each on its own mesh.

Each table is laid out on a mesh that uses its axes (:mod:`partitioning.config.tables`):
the one given with ``--mesh``, the config's own for the config's own table,
else the mesh the preset or rules file is meant for, fitted to the model; the
table says which mesh each row used and why.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pydantic import ValidationError
from rich.table import Table

from partitioning.cli.args import config_args
from partitioning.cli.compiling import compile_args, compiled, setup_devices, write_json
from partitioning.cli.render import console
from partitioning.config.load import load_config
from partitioning.config.schema import MeshConfig
from partitioning.config.tables import describe, table_layout
from partitioning.errors import ConfigError, PartitioningError
from partitioning.fmt import fmt_bytes, fmt_mesh
from partitioning.rules import Rules
from partitioning.yamlfile import load_value

HELP = "side by side per-device memory, communication and replication of several rule tables, each on its mesh"
EXAMPLES = """examples:
  partitioning compare configs/quickstart.yaml --rules fsdp_tp fsdp tp dp
  partitioning compare configs/quickstart.yaml --rules tp dp --mesh "{data: 4, tensor: 2}" -
  partitioning compare configs/llama3_70b.yaml --rules fsdp_tp configs/my_rules.yaml --no-compile"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--rules",
        nargs="+",
        required=True,
        metavar="RULES",
        help="rule tables to compare: preset names or rules YAML files",
    )
    p.add_argument(
        "--mesh",
        nargs="+",
        metavar="MESH",
        help="one mesh per --rules table, e.g. \"{data: 2, tensor: 4}\" ('-': choose it; default: the config's "
        "mesh for its own table, else the mesh the preset or rules file is meant for, fitted to the model)",
    )
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    compile_args(p)


def _meshes(args: argparse.Namespace) -> list[dict[str, int] | None]:
    given = args.mesh or []
    if given and len(given) != len(args.rules):
        raise ConfigError(
            f"--mesh: {len(given)} mesh(es) for {len(args.rules)} rule tables; give one per table ('-' to choose it)",
            arg="mesh",
        )
    out: list[dict[str, int] | None] = []
    for text in given or ["-"] * len(args.rules):
        if text.strip() == "-":
            out.append(None)
            continue
        try:
            out.append(dict(MeshConfig(shape=load_value(text)).shape))
        except (ConfigError, ValidationError, TypeError) as e:
            msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
            raise ConfigError(f"--mesh {text}: expected a mesh shape such as {{data: 2, tensor: 4}} ({msg})") from None
    return out


def _check_tables(names: list[str]) -> None:
    """Every --rules table exists (a preset, or a rules file): a typo is bad input, not a layout that does not fit."""
    for n in names:
        try:
            Rules.from_yaml(Path(n)) if n.endswith((".yaml", ".yml")) else Rules.preset(n)
        except PartitioningError as e:
            raise ConfigError(f"--rules {n}: {e}", arg="rules") from None


def run(args: argparse.Namespace) -> int:
    sets = list(args.set or [])
    cfg0 = load_config(args.config, sets)
    _check_tables(args.rules)
    meshes = _meshes(args)
    devices, here = setup_devices(cfg0, args)
    rows, layouts, refused = [], [], []
    for name, mesh in zip(args.rules, meshes, strict=True):
        t0 = time.perf_counter()
        try:
            layout = table_layout(args.config, sets, name, devices, mesh)
        except ConfigError as e:
            # A table no mesh of these devices can hold (e.g. fsdp alone with a batch smaller than the devices)
            # is a finding of the comparison, not the end of it.
            refused.append((name, str(e)))
            continue
        layouts.append(layout)
        plan = layout.plan
        view = compiled(layout.cfg, args, devices, here, plan, extra_set=layout.overrides)
        rows.append(
            {
                "rules": name,
                "mesh": plan.mesh,
                "mesh_source": layout.source,
                "totals": plan.totals,
                "replicated_share": plan.replicated_share,
                "warnings": plan.warnings(),
                "errors": plan.errors,
                "compiled": view,
                "wall_s": round(time.perf_counter() - t0, 3),
            }
        )
    if not rows:
        raise ConfigError(refused[0][1])
    out = console()
    table = Table(title=f"{cfg0.model_name} on {devices:,} devices: per device, each table on its mesh")
    table.add_column("rules")
    table.add_column("mesh")
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
        table.add_column(col, justify="right")
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
        table.add_row(r["rules"], fmt_mesh(r["mesh"]), *cells)
    for name, _ in refused:
        table.add_row(name, "no mesh fits", *["-"] * 12)
    out.print(table)
    out.print("collective columns: bytes per step per device (buffer sizes; loop iterations counted)")
    out.print("meshes: " + "; ".join(describe(x) for x in layouts), highlight=False, markup=False)
    for name, why in refused:
        out.print(f"{name}: not laid out: {why}", highlight=False, markup=False)
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
        tables = rows + [{"rules": name, "mesh": None, "error": why} for name, why in refused]
        write_json(
            args.json, {"config": str(cfg0.path), "model": cfg0.model_name, "devices": devices, "tables": tables}
        )
    return 0
