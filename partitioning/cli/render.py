"""Rendering for the terminal: rich tables of layouts, plans and compiled views.

Example::

    >>> from partitioning.cli.render import console, explain_table
    >>> w = pt.LogicallyPartitioned(jax.ShapeDtypeStruct((64, 256), jnp.float32), ("embed", "mlp"))
    >>> table = explain_table(pt.tree_layouts({"w": w}, {"data": 1, "fsdp": 8}, "fsdp"), {}, title="w")
    >>> table.row_count, [c.header for c in table.columns][:3]   # console().print(table) draws it
    (2, ['parameter', 'dim', 'logical'])
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from partitioning.fmt import fmt_bytes, fmt_mesh, fmt_rule
from partitioning.layout import LeafLayout


class _Console(Console):
    """Rich's console, except that a closed pipe is left to the command line's one handler.

    Rich answers a broken pipe with ``SystemExit(1)``; ``partitioning ... | head`` is a quiet exit 0
    (:func:`partitioning.cli.main.main`), whatever printed last.
    """

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def console() -> Console:
    """A console for tables: as wide as the terminal (or ``$COLUMNS``), no syntax highlighting.

    Tables fold long cells to fit the terminal. Into a file or a pipe (and no
    ``$COLUMNS``) they are 200 columns wide, so each row stays one greppable
    line. Plain lines are never wrapped (``soft_wrap``).
    """
    out = _Console(highlight=False, soft_wrap=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = _Console(width=200, highlight=False, soft_wrap=True)
    return out


def explain_table(layouts: Sequence[LeafLayout], computes: Mapping[str, str], *, title: str) -> Table:
    """Per parameter and dimension: logical name, size, mesh axes, the claiming rule and why others did not."""
    table = Table(title=title)
    for col in ("parameter", "dim", "logical", "size", "mesh axes", "claimed by / why not", "compute spec"):
        table.add_column(col, overflow="fold")
    for leaf in layouts:
        for d in leaf.dims:
            why = f"rule {d.rule_index} {fmt_rule(d.rule)}" if d.rule is not None else "-"
            if d.notes:
                why += "; " + "; ".join(d.notes)
            if leaf.named_by is not None:
                why += f"; name from {leaf.named_by}"
            first = d.dim == 0
            table.add_row(
                leaf.path if first else "",
                str(d.dim),
                str(d.name),
                str(d.size),
                "-" if d.mesh_axes is None else str(d.mesh_axes),
                escape(why),  # `[embed, fsdp]` is text, not rich markup
                computes.get(leaf.path, "") if first else "",
            )
    return table


def _claimed(row: dict[str, Any]) -> str:
    return " ".join("-" if c is None else f"r{c['rule']}" for c in row["claimed_by"]) or "-"


def render_plan(report: dict[str, Any], console: Any) -> None:
    """The plan: parameter table, per-device totals, warnings, compiled view, timing."""
    mesh = report["mesh"]
    active = report.get("active_parameters")
    active = f", {active:,} active per token" if active is not None else ""
    console.print(
        f"[bold]{report['model']['name']}[/bold] ({report['parameters']:,} parameters{active}) on mesh "
        f"{mesh} ({report['devices']:,} devices), {report.get('rules_source') or 'rules from ' + report['config']}"
    )
    t = Table(title="parameters", show_lines=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("parameter", "left"),
        ("shape", "left"),
        ("dtype", "left"),
        ("logical", "left"),
        ("PartitionSpec", "left"),
        ("rules", "left"),
        ("per device", "right"),
        ("total", "right"),
    )
    offload = (report.get("offload") or {}).get("state")
    if offload:  # each param with its gradient and optimizer state, by where they live
        columns += (("+grad, opt: device", "right"), ("host", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    rows = annotation_labels(report["leaves"])
    for r in report["leaves"]:
        logical = "(" + ", ".join(str(n) for n in r["logical"]) + ")" if r["logical"] is not None else "-"
        if r.get("named_by"):
            logical += f" {rows[r['named_by']]}"
        per = fmt_bytes(r["per_device_bytes"])
        kinds = [fmt_bytes(r["device_bytes"]), fmt_bytes(r["host_bytes"])] if offload else []
        t.add_row(
            r["path"],
            str(tuple(r["shape"])),
            r["dtype"],
            logical,
            r["spec"],
            _claimed(r),
            f"[red]{per}[/red]" if r["replicated"] and report["devices"] > 1 and r["total_bytes"] > 4 else per,
            fmt_bytes(r["total_bytes"]),
            *kinds,
        )
    console.print(t)
    console.print("rules: " + "  ".join(f"r{i}={fmt_rule(p)}" for i, p in enumerate(report["rules"])), markup=False)
    if rows:
        console.print("names from annotations: " + "  ".join(f"{a}={o}" for o, a in rows.items()), highlight=False)

    tt = Table(title=f"per device ({report['devices']:,} devices)")
    for col in ("", "per device", "ideal (total / devices)", "per device / ideal", "total"):
        tt.add_column(col, justify="right" if col else "left")
    for k in ("params", "optimizer", "gradients", "total"):
        v = report["totals"][k]
        ratio = v["per_device"] / v["ideal"] if v["ideal"] else 1.0
        tt.add_row(k, fmt_bytes(v["per_device"]), fmt_bytes(v["ideal"]), f"{ratio:.2f}x", fmt_bytes(v["total"]))
    console.print(tt)
    tr, fr = report["totals"].get("trainable"), report["totals"].get("frozen")
    if fr and fr["total"]:
        console.print(
            f"trainable: {report.get('trainable_parameters', 0):,} parameters, {fmt_bytes(tr['per_device'])} per "
            f"device (with gradients and optimizer state); frozen: {fmt_bytes(fr['per_device'])} per device "
            f"(stored dtype, no gradient, no optimizer state)",
            highlight=False,
        )
    if offload:
        console.print(memory_kinds_line(report), highlight=False)
    console.print(f"replicated share of per-device memory: {report['replicated_share']:.1%}")

    render_axes(report, console)
    msgs = report["warnings"]["messages"]
    if msgs:
        console.print("[bold yellow]warnings[/bold yellow]")
        for m in msgs:
            console.print(f"  - {m}", markup=False, highlight=False)
    render_compiled(report["compiled"], console)
    tm = report["timing"]
    console.print(f"timing: table {tm['table_s']:.1f} s, compiled view {tm['compiled_s']:.1f} s")


def memory_kinds_line(report: dict[str, Any]) -> str:
    """One line: the state per device on the device (during the passes, during the update) and on the host."""
    kinds, off = report["memory_kinds"], report["offload"]
    dev, host = kinds["device"], kinds["host"]["per_device"]
    update = (
        "the update brings the optimizer state to the device"
        if "optimizer" in off["state"] and off["update"] == "device"
        else "the update runs on the host"
        if "optimizer" in off["state"]
        else "the update runs on the device"
    )
    return (
        f"offload {', '.join(off['state'])}: device {fmt_bytes(dev['passes'])} per device during the passes, "
        f"{fmt_bytes(dev['update'])} during the update ({update}); host {fmt_bytes(host)} per device"
    )


def annotation_labels(leaves: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``{row origin: "a3"}`` for the annotation rows that named the plan's arrays (``a`` + the row's index)."""
    out: dict[str, str] = {}
    for r in leaves:
        origin = r.get("named_by")
        if origin and origin not in out:
            m = re.search(r"\[(\d+)\]", origin.rsplit(": ", 1)[-1])
            out[origin] = f"a{m.group(1)}" if m else f"a?{len(out)}"
    return out


def render_axes(report: dict[str, Any], console: Any) -> None:
    """Per mesh axis: what it splits and the collectives over it; the pipeline's and the experts' costs."""
    axes, view = report.get("axes") or {}, report.get("compiled") or {}
    by_axis = view.get("collectives_by_axis") or {}
    nodes = report.get("nodes")
    if nodes:
        console.print(nodes_line(nodes), highlight=False)
    t = Table(title="per mesh axis (state per device; collectives per step and device, compiled)")
    cols = ("axis", "size", "splits", "state it splits", "without it", "collectives over it")
    for col in cols + (("across nodes",) if nodes else ()):
        t.add_column(col, justify="right" if col in ("size", "state it splits", "without it") else "left")
    for name in list(axes) + [k for k in by_axis if k not in axes]:
        a = axes.get(name, {})
        colls = (
            ", ".join(
                f"{k} {v['count']}x {fmt_bytes(v['bytes'])}" for k, v in by_axis.get(name, {}).items() if v["count"]
            )
            or "-"
        )
        row = [
            name,
            str(a.get("size", "")),
            ", ".join(a.get("splits", [])) or "-",
            fmt_bytes(a["per_device_bytes"]) if a else "",
            fmt_bytes(a["unsplit_bytes"]) if a else "",
            colls,
        ]
        if nodes:
            spans = max((nodes["axes"].get(x, 1) for x in name.split("+")), default=1)
            row.append(f"yes: {spans} nodes" if spans > 1 else "no")
        t.add_row(*row)
    console.print(t)

    def compiled(kind: str, axis: str) -> str:
        c = (by_axis.get(axis) or {}).get(kind)
        return f"; compiled over `{axis}`: {c['count']}x {fmt_bytes(c['bytes'])}" if c else ""

    p = (report.get("parallel") or {}).get("pipeline")
    if p and p["stages"] > 1:
        console.print(pipeline_line(p) + compiled("collective-permute", "stage"), highlight=False)
    e = (report.get("parallel") or {}).get("experts")
    if e:
        console.print(
            f"experts: {e['experts']} (top-{e['top_k']}, capacity {e['capacity']}) over {e['expert_shards']} "
            f"shard(s) in {e['layers']} layers: all-to-all {e['all_to_all_count']}x "
            f"{fmt_bytes(e['all_to_all_bytes'])} per step and device (analytic)"
            + (compiled("all-to-all", "expert") if e["expert_shards"] > 1 else ""),
            highlight=False,
        )


def nodes_line(nodes: Mapping[str, Any], configured: bool = True) -> str:
    """``nodes: 4 x 8 devices (mesh.nodes {data: 4}); across nodes: data (4 nodes); inside one node: fsdp``
    (``configured=False``: the layout a run found on its devices, without naming the key)."""
    across = [f"{a} ({n} nodes)" for a, n in nodes["axes"].items() if n > 1]
    inside = [a for a, n in nodes["axes"].items() if n == 1]
    key = f" (mesh.nodes {fmt_mesh(nodes['split'])})" if configured else ""
    return (
        f"nodes: {nodes['count']} x {nodes['per_node']} devices{key}; across nodes: {', '.join(across) or 'nothing'}"
        f"; inside one node: {', '.join(inside) or 'nothing'}"
    )


def render_across_nodes(view: Mapping[str, Any], console: Any) -> None:
    """The compiled step's collectives by kind, mesh axes and nodes spanned: which cross nodes, and their bytes."""
    rows: dict[tuple[str, str, int], list[int]] = {}
    for c in view.get("collective_ops") or []:
        if "nodes" not in c:
            return
        r = rows.setdefault((c["kind"], c["axes"], c["nodes"]), [0, 0, 0])
        r[0] += c["executions"]
        r[1] += c["executions"] * c["bytes"]
        r[2] += c["executions"] * c["across_bytes"]
    t = Table(title="collectives per step (per device): which cross nodes")
    for col in ("collective", "over", "crosses nodes", "count", "bytes", "bytes across nodes"):
        t.add_column(col, justify="right" if col in ("count", "bytes", "bytes across nodes") else "left")
    for (kind, axes, spans), (count, nbytes, across) in sorted(rows.items(), key=lambda kv: (-kv[1][2], kv[0])):
        t.add_row(
            kind, axes, f"yes: {spans} nodes" if spans > 1 else "no", f"{count:,}", fmt_bytes(nbytes), fmt_bytes(across)
        )
    console.print(t)
    total = sum(v["bytes"] for v in view["across_nodes"].values())
    every = sum(v[1] for v in rows.values())
    console.print(
        f"across nodes: {fmt_bytes(total)} of {fmt_bytes(every)} per step and device ({total / every:.1%})"
        if every
        else "across nodes: no collectives",
        highlight=False,
    )


def pipeline_line(p: dict[str, Any]) -> str:
    """The pipeline's analytic costs in one line (:func:`partitioning.plan.parallel.pipeline_cost`)."""
    r = p.get("repeats", 1)
    if r > 1:
        shape = f" ({r} chunks of {p['layers_per_chunk']} each, circular)"
        bubble = f"(S-1)/(RM+S-1) = {p['bubble']:.1%} (GPipe: {p['bubble_gpipe']:.1%}); "
        bubble += f"weights regrouped {fmt_bytes(p['regroup_bytes'])}"
    else:
        shape, bubble = "", f"(S-1)/(M+S-1) = {p['bubble']:.1%}"
    return (
        f"pipeline: {p['layers']} layers in {p['stages']} stages of {p['layers_per_stage']}{shape}, "
        f"{p['microbatches']} micro-batches of {p['micro_batch_rows']} rows: bubble {bubble}; shifts "
        f"{p['collective_permute_count']}x collective-permute {fmt_bytes(p['collective_permute_bytes'])}, "
        f"stage all-reduce {fmt_bytes(p['stage_all_reduce_bytes'])} per step and device (analytic)"
    )


def render_compiled(view: dict[str, Any], console: Any) -> None:
    """XLA's memory per device, FLOPs and collectives per step and the sharding self-check (or why there is none)."""
    if view["status"] != "ok":
        console.print(f"[bold]compiled view {view['status']}:[/bold] {escape(view['reason'])}", highlight=False)
        return
    console.print(
        f"[bold]compiled train step[/bold] ({view['devices']} {view['backend']} devices): "
        f"lowered in {view['lower_s']:.1f} s, compiled in {view['compile_s']:.1f} s"
    )
    m = view.get("memory")
    if m:
        console.print(
            "XLA memory per device: "
            + ", ".join(f"{k} {fmt_bytes(m[k])}" for k in ("argument", "output", "alias", "temp", "peak_estimate"))
        )
        if m.get("host"):  # offloaded state: XLA's host buffers (pinned_host), apart from device memory
            keys = ("host_argument", "host_output", "host_alias", "host_temp", "host")
            console.print("XLA host memory per device: " + ", ".join(f"{k} {fmt_bytes(m.get(k, 0))}" for k in keys))
    f = view.get("flops")
    if f:
        line = (
            f"FLOPs per step: {f['per_device'] / 1e12:.4g} TFLOP per device, {f['total'] / 1e12:.4g} TFLOP on "
            f"{view['devices']} devices (XLA cost analysis, loop trips counted)"
        )
        if f.get("six_n_tokens"):
            line += f"; 6·N·tokens {f['six_n_tokens'] / 1e12:.4g} TFLOP"
        console.print(line, highlight=False)
    t = Table(title="collectives per step (per device)")
    for col in ("collective", "count", "bytes"):
        t.add_column(col, justify="left" if col == "collective" else "right")
    for k, v in view["collectives"].items():
        t.add_row(k, f"{v['count']:,}", fmt_bytes(v["bytes"]))
    console.print(t)
    if view.get("across_nodes"):
        render_across_nodes(view, console)
    chk = view.get("sharding_check")
    if chk:
        if not chk["mismatches"]:
            console.print(f"self-check: the {chk['checked']} compiled input/output shardings match the rules")
        else:
            console.print(
                f"[bold red]self-check: {len(chk['mismatches'])} of {chk['checked']} compiled "
                f"shardings differ from the rules[/bold red]"
            )
            for d in chk["mismatches"]:
                console.print(
                    f"  - {d['side']} {d['path']}: rules {d['expected']}, compiled {d['compiled']}",
                    markup=False,
                    highlight=False,
                )


__all__ = ["console", "explain_table", "render_plan", "render_axes", "render_compiled", "nodes_line"]
