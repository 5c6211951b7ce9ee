"""``partitioning plan`` and ``partitioning compare``.

    partitioning plan CONFIG [--devices N] [--set k=v ...] [--json FILE] [--png FILE] [--no-compile]
    partitioning compare CONFIG --rules A B ... [--devices N] [--set k=v ...] [--json FILE]

The table comes from ``jax.eval_shape`` only (nothing allocated, no device
needed: the mesh is planned from its axis sizes), so it takes seconds for any
mesh. The compiled view lowers and compiles the real train step
(:class:`partitioning.Trainer`): in this process for small meshes, otherwise
in a child process on simulated CPU devices (``python -m
partitioning.report_cli`` is that child).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from partitioning.cli import config_args, say, command, config_devices, ensure_devices

# Meshes up to this size are simulated in this process; larger ones compile in a
# child (a process holding thousands of CPU devices is slow to start and to exit).
IN_PROCESS_MAX = 64


def _plan_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--json", metavar="FILE", help="write the plan (table, totals, warnings, compiled view) as JSON")
    p.add_argument("--png", metavar="FILE", help="draw per-device memory by category and the mesh")
    _compile_args(p)


def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-compile", action="store_true", help="skip the compiled view (eval_shape table only)")
    p.add_argument("--compile-in", choices=("auto", "here", "child"), default="auto",
                   help="where to compile: this process, a child process with simulated devices, "
                        f"or auto (here up to {IN_PROCESS_MAX} devices)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one compile (default 900)")


def _compare_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--rules", nargs="+", required=True, metavar="RULES",
                   help="rule tables to compare: preset names or rules YAML files")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    _compile_args(p)


# -- building blocks (Config in, plain values out) --------------------------------------

def optimizer_from_config(cfg: Any):
    """The optax transformation the config's ``optimizer`` section describes."""
    from partitioning.optimizer import make_optimizer

    o = cfg.optimizer
    return make_optimizer(o.name, lr=o.lr, total_steps=max(1, cfg.train.steps), warmup_steps=o.warmup_steps,
                          schedule=o.schedule, min_lr_ratio=o.min_lr_ratio, weight_decay=o.weight_decay,
                          b1=o.b1, b2=o.b2, eps=o.eps, momentum=o.momentum, clip_norm=o.clip_norm)


def _devices(cfg: Any, override: int | None) -> int:
    from partitioning.errors import MeshError

    if override is not None and override < 1:
        raise MeshError(f"--devices must be a positive number of devices, got {override}")
    n = config_devices(cfg, override)
    if n is None:
        import jax

        n = jax.device_count()
    return n


def plan_for_config(cfg: Any, devices: int):
    """(plan, model) for a config on ``devices`` devices, from eval_shape only."""
    from partitioning.registry import build_model
    from partitioning.report import abstract_train_state, activation_names, build_plan, mesh_sizes

    sizes = mesh_sizes(cfg.mesh.shape, devices)
    model = build_model(cfg.model_name, **cfg.model_options)
    tx = optimizer_from_config(cfg)
    b, t = cfg.train.batch_size, cfg.train.seq_len
    params, opt_state = abstract_train_state(model, tx, batch_size=b, seq_len=t)
    acts = activation_names(model, params, sizes, cfg.rules, batch_size=b, seq_len=t)
    plan = build_plan(params, opt_state, sizes, cfg.rules, optimizer_rules=cfg.optimizer_rules,
                      on_indivisible=cfg.on_indivisible, activations=acts)
    return plan, model


def expected_specs(plan: Any) -> dict[str, Any]:
    """What the rules ask for, by the train step's input / output paths."""
    from jax.sharding import PartitionSpec

    specs = {l.path: l.spec for l in plan.params + plan.opt_state}
    specs["step"] = PartitionSpec()
    batch = plan.rules.resolve(("batch", None))
    specs["batch/inputs"] = specs["batch/targets"] = batch
    return specs


def compile_config(cfg: Any, devices: int, plan: Any = None) -> dict[str, Any]:
    """The compiled view of the config's train step on the first ``devices`` devices of this process."""
    import jax

    from partitioning.compiled import compiled_view
    from partitioning.mesh import make_mesh
    from partitioning.registry import build_model
    from partitioning.train import Trainer

    if plan is None:
        plan, model = plan_for_config(cfg, devices)
    else:
        model = build_model(cfg.model_name, **cfg.model_options)
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=jax.devices()[:devices])
    trainer = Trainer(model, optimizer_from_config(cfg), mesh, cfg.rules, batch_size=cfg.train.batch_size,
                      seq_len=cfg.train.seq_len, optimizer_rules=cfg.optimizer_rules,
                      on_indivisible=cfg.on_indivisible, grad_accum=cfg.train.grad_accum)
    return compiled_view(trainer.lower_train_step, expected=expected_specs(plan),
                         input_names=("", "batch"), output_names=("", "metrics"))


def _compiled(cfg: Any, args: argparse.Namespace, devices: int, here: bool, plan: Any,
              extra_set: list[str] = ()) -> dict[str, Any]:
    from partitioning.compiled import CPU_LIMIT_REASON, CPU_MAX_DEVICES, compile_in_child, failed, skipped
    from partitioning.errors import PartitioningError

    if args.no_compile:
        return skipped("--no-compile")
    if plan.errors:
        return skipped(f"the train step would refuse this layout: {plan.errors[0]}")
    if here:
        try:
            return compile_config(cfg, devices, plan)
        except PartitioningError as e:
            return failed(str(e))
    if devices > CPU_MAX_DEVICES:
        return skipped(CPU_LIMIT_REASON.format(n=devices))
    child_args = [str(cfg.path), "--devices", str(devices)]
    for s in list(args.set or []) + list(extra_set):
        child_args += ["--set", s]
    return compile_in_child("partitioning.report_cli", child_args, devices, timeout=args.timeout)


def _setup_devices(cfg: Any, args: argparse.Namespace) -> tuple[int, bool]:
    """(devices, compile here?). Sets up simulated devices before any jax computation."""
    from partitioning.errors import MeshError

    devices = _devices(cfg, args.devices)
    if args.no_compile or args.compile_in == "child":
        return devices, False
    if args.compile_in == "auto" and devices > IN_PROCESS_MAX:
        return devices, False
    try:
        ensure_devices(devices)
    except MeshError:
        if args.compile_in == "here":
            raise
        return devices, False
    return devices, True


# -- rendering -------------------------------------------------------------------------

def _claimed(row: dict[str, Any]) -> str:
    return " ".join("-" if c is None else f"r{c['rule']}" for c in row["claimed_by"]) or "-"


def render_plan(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from partitioning.report import fmt_bytes

    mesh = report["mesh"]
    console.print(f"[bold]{report['model']['name']}[/bold] ({report['parameters']:,} parameters) on mesh "
                  f"{mesh} ({report['devices']:,} devices), rules from {report['config']}")
    t = Table(title="parameters", show_lines=False)
    for col, just in (("parameter", "left"), ("shape", "left"), ("dtype", "left"), ("logical", "left"),
                      ("PartitionSpec", "left"), ("rules", "left"), ("per device", "right"), ("total", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for r in report["leaves"]:
        logical = "(" + ", ".join(str(n) for n in r["logical"]) + ")" if r["logical"] is not None else "-"
        per = fmt_bytes(r["per_device_bytes"])
        t.add_row(r["path"], str(tuple(r["shape"])), r["dtype"], logical, r["spec"], _claimed(r),
                  f"[red]{per}[/red]" if r["replicated"] and report["devices"] > 1 and r["total_bytes"] > 4 else per,
                  fmt_bytes(r["total_bytes"]))
    console.print(t)
    console.print("rules: " + "  ".join(f"r{i}={tuple(p)}" for i, p in enumerate(report["rules"])))

    tt = Table(title=f"per device ({report['devices']:,} devices)")
    for col in ("", "per device", "ideal (total / devices)", "per device / ideal", "total"):
        tt.add_column(col, justify="right" if col else "left")
    for k in ("params", "optimizer", "gradients", "total"):
        v = report["totals"][k]
        ratio = v["per_device"] / v["ideal"] if v["ideal"] else 1.0
        tt.add_row(k, fmt_bytes(v["per_device"]), fmt_bytes(v["ideal"]), f"{ratio:.2f}x", fmt_bytes(v["total"]))
    console.print(tt)
    console.print(f"replicated share of per-device memory: {report['replicated_share']:.1%}")

    msgs = report["warnings"]["messages"]
    if msgs:
        console.print("[bold yellow]warnings[/bold yellow]")
        for m in msgs:
            console.print(f"  - {m}", markup=False, highlight=False)
    render_compiled(report["compiled"], console)
    tm = report["timing"]
    console.print(f"timing: table {tm['table_s']:.1f} s, compiled view {tm['compiled_s']:.1f} s")


def render_compiled(view: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from partitioning.report import fmt_bytes

    if view["status"] != "ok":
        console.print(f"[bold]compiled view {view['status']}:[/bold] {view['reason']}", highlight=False)
        return
    console.print(f"[bold]compiled train step[/bold] ({view['devices']} {view['backend']} devices): "
                  f"lowered in {view['lower_s']:.1f} s, compiled in {view['compile_s']:.1f} s")
    m = view.get("memory")
    if m:
        console.print("XLA memory per device: " + ", ".join(
            f"{k} {fmt_bytes(m[k])}" for k in ("argument", "output", "alias", "temp", "peak_estimate")))
    t = Table(title="collectives per step (per device)")
    for col in ("collective", "count", "bytes"):
        t.add_column(col, justify="left" if col == "collective" else "right")
    for k, v in view["collectives"].items():
        t.add_row(k, f"{v['count']:,}", fmt_bytes(v["bytes"]))
    console.print(t)
    chk = view.get("sharding_check")
    if chk:
        if not chk["mismatches"]:
            console.print(f"self-check: the {chk['checked']} compiled input/output shardings match the rules")
        else:
            console.print(f"[bold red]self-check: {len(chk['mismatches'])} of {chk['checked']} compiled "
                          f"shardings differ from the rules[/bold red]")
            for d in chk["mismatches"]:
                console.print(f"  - {d['side']} {d['path']}: rules {d['expected']}, compiled {d['compiled']}",
                              markup=False, highlight=False)


def _console():
    from rich.console import Console

    return Console(width=max(200, Console().width), highlight=False)


# -- commands -----------------------------------------------------------------------------

@command("plan", _plan_args)
def cmd_plan(args: argparse.Namespace) -> int:
    """every parameter's layout, per-device memory and communication, before running"""
    from partitioning.config import load_config

    t0 = time.perf_counter()
    cfg = load_config(args.config, args.set or [])
    devices, here = _setup_devices(cfg, args)
    plan, _ = plan_for_config(cfg, devices)
    t1 = time.perf_counter()
    view = _compiled(cfg, args, devices, here, plan)
    t2 = time.perf_counter()
    report = {
        "config": str(cfg.path),
        "model": {"name": cfg.model_name, "options": dict(cfg.model_options)},
        "batch": {"batch_size": cfg.train.batch_size, "seq_len": cfg.train.seq_len},
        **plan.to_json(),
        "compiled": view,
        "timing": {"table_s": round(t1 - t0, 3), "compiled_s": round(t2 - t1, 3)},
    }
    render_plan(report, _console())
    if args.json:
        _write_json(args.json, report)
    if args.png:
        from partitioning.plan_plot import plot_plan

        plot_plan(report, args.png)
    return 0


@command("compare", _compare_args)
def cmd_compare(args: argparse.Namespace) -> int:
    """side by side per-device memory, communication and replication of several rule tables"""
    from rich.table import Table

    from partitioning.config import load_config
    from partitioning.report import fmt_bytes

    cfg0 = load_config(args.config, args.set or [])
    configs = [(name, load_config(args.config, list(args.set or []) + [f"rules={name}"])) for name in args.rules]
    devices, here = _setup_devices(cfg0, args)
    rows = []
    for name, cfg in configs:
        t0 = time.perf_counter()
        plan, _ = plan_for_config(cfg, devices)
        view = _compiled(cfg, args, devices, here, plan, extra_set=[f"rules={name}"])
        rows.append({"rules": name, "totals": plan.totals, "replicated_share": plan.replicated_share,
                     "warnings": plan.warnings(), "errors": plan.errors, "compiled": view,
                     "wall_s": round(time.perf_counter() - t0, 3)})
    sizes = plan.mesh   # every table plans the same mesh
    console = _console()
    t = Table(title=f"{cfg0.model_name} on mesh {sizes} ({devices:,} devices): per device")
    t.add_column("rules")
    for col in ("params", "optimizer", "gradients", "total", "total / ideal", "replicated",
                "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "coll. permute", "collectives"):
        t.add_column(col, justify="right")
    for r in rows:
        tot = r["totals"]
        cells = [fmt_bytes(tot[k]["per_device"]) for k in ("params", "optimizer", "gradients", "total")]
        cells.append(f"{tot['total']['per_device'] / tot['total']['ideal']:.2f}x")
        cells.append(f"{r['replicated_share']:.1%}")
        v = r["compiled"]
        if v["status"] == "ok":
            c = v["collectives"]
            cells += [fmt_bytes(c[k]["bytes"]) for k in ("all-gather", "reduce-scatter", "all-reduce",
                                                          "all-to-all", "collective-permute")]
            cells.append(fmt_bytes(sum(x["bytes"] for x in c.values())))
        else:
            cells += ["-"] * 6
        t.add_row(r["rules"], *cells)
    console.print(t)
    console.print("collective columns: bytes per step per device (buffer sizes; loop iterations counted)")
    for r in rows:
        if r["compiled"]["status"] != "ok":
            console.print(f"{r['rules']}: compiled view {r['compiled']['status']}: {r['compiled']['reason']}",
                          highlight=False, markup=False)
        for w in r["warnings"]:
            console.print(f"{r['rules']}: {w}", highlight=False, markup=False)
    if args.json:
        _write_json(args.json, {"config": str(cfg0.path), "model": cfg0.model_name, "devices": devices,
                                "mesh": sizes, "tables": rows})
    return 0


def _write_json(path: str, data: Any) -> None:
    from partitioning.errors import ConfigError

    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data, indent=1, default=str))
    except OSError as e:
        raise ConfigError(f"--json {path}: cannot write: {e.strerror}") from None
    say(f"wrote {p}")


# -- the compile child ----------------------------------------------------------------------

def _worker(argv: list[str]) -> None:
    """``python -m partitioning.report_cli CONFIG --devices N [--set ...] --out FILE``."""
    from partitioning.compiled import failed, write_and_exit
    from partitioning.config import load_config
    from partitioning.errors import PartitioningError

    p = argparse.ArgumentParser(prog="python -m partitioning.report_cli")
    p.add_argument("config")
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config, a.set)
        ensure_devices(a.devices)
        view = compile_config(cfg, a.devices)
    except PartitioningError as e:
        view = failed(str(e))
    except Exception as e:  # a bug or an XLA failure: the parent reports it on one line
        view = failed(f"{type(e).__name__}: {e}")
    write_and_exit(a.out, view)


if __name__ == "__main__":
    _worker(sys.argv[1:])
