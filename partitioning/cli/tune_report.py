"""What ``partitioning tune`` prints and writes: the ranked table, the recommendation with its terms, the
rejections, and the best layout as a runnable config.

Example::

    >>> import optax
    >>> from partitioning.cli.tune_report import why
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
    >>> w = pt.tune.workload(pt.build_plan(params, opt_state, {"data": 8}, "dp").params, batch_size=32, seq_len=128)
    >>> s = pt.tune.search(params, opt_state, {"fsdp": pt.Rules.preset("fsdp")}, 8, w, pt.tune.hardware("h100"),
    ...                       budget=80 * 2**30)
    >>> why(s.best)   # the recommendation's terms, as `tune` prints them
    'fwd: compute ..., comm ...; bwd: compute ...; step = ...'
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import JustifyMethod
from rich.table import Table

from partitioning.cli.compiling import write_text
from partitioning.config.build import model_options_resolved
from partitioning.config.load import load_config
from partitioning.config.schema import Config
from partitioning.fmt import fmt_bytes, fmt_mesh
from partitioning.tune.cost import PHASES, Estimate
from partitioning.tune.search import Result, Search


def fmt_seconds(t: float) -> str:
    """``12.3 ms`` / ``1.25 s``."""
    if t != t or t == float("inf"):
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _axes(e: Estimate) -> str:
    return ", ".join(f"{a} {fmt_seconds(t)}" for a, t in e.per_axis().items() if t > 0) or "-"


def _estimate(r: Result) -> Estimate:
    """A ranked result's estimate: every ranked (fitting) result was priced."""
    if r.estimate is None:
        raise ValueError(f"{r.candidate.label} was ranked without an estimate")
    return r.estimate


def _host(r: Result) -> str:
    """The offloaded state (and activations) in host memory per device, and what is offloaded."""
    c = r.candidate
    what = list(c.offload) + (["activations"] if c.remat == "offload" else [])
    where = " (update on host)" if "optimizer" in c.offload and c.offload_update == "host" else ""
    return f"{fmt_bytes(r.host)}: {', '.join(what)}{where}" if what else "-"


def _row(i: int, r: Result, budget: int, host: bool = False) -> list[str]:
    c, e = r.candidate, _estimate(r)
    peak = f"{fmt_bytes(r.peak)} / {fmt_bytes(budget)}" + (" *" if r.peak_source == "compiled" else "")
    return [
        str(i),
        c.rules_name + (" +zero1" if c.zero1 else ""),
        fmt_mesh(c.mesh) + (f" nodes {fmt_mesh(c.nodes)}" if c.nodes else ""),
        c.remat or "-",
        str(c.grad_accum) + (f", M={c.microbatches}" if c.stages > 1 else ""),
        peak,
        fmt_seconds(sum(e.compute.values())),
        _axes(e),
        fmt_seconds(r.step_time),
        f"{e.mfu * e.step_time / r.step_time:.0%}",
        e.bottleneck,
        e.source if e.source == "compiled" or r.scale == 1 else f"analytic x{r.scale:.2f}",
    ] + ([_host(r)] if host else [])


def why(r: Result) -> str:
    """The recommendation's terms: compute and communication per phase, and how they combine."""
    e = _estimate(r)
    phases = "; ".join(f"{p}: compute {fmt_seconds(e.compute[p])}, comm {fmt_seconds(e.comm_time(p))}" for p in PHASES)
    other = "".join(f"; {k} {fmt_seconds(v)}" for k, v in e.other.items())
    how = "max(compute, comm) per phase" if e.overlap else "compute + comm per phase (not overlapped)"
    return f"{phases}{other}; step = {how} = {fmt_seconds(e.step_time)}"


def nodes_note(r: Result, node_size: int) -> str:
    """Where the best layout's axes sit on nodes, what each link level costs, and the other placements priced."""
    e, c = _estimate(r), r.candidate
    across = sum(x.seconds for x in e.comm if x.nodes > 1)
    inside = sum(x.seconds for x in e.comm if x.nodes <= 1)
    count = c.devices // node_size
    others = ", ".join(f"{fmt_mesh(n)} {fmt_seconds(t)}" for n, t in r.placements if n != dict(c.nodes or ()) and t > 0)
    return (
        f"nodes: {fmt_mesh(c.nodes or {})} on {count} nodes of {node_size} devices: comm across nodes "
        f"{fmt_seconds(across)}, inside a node {fmt_seconds(inside)} per step"
        + (f"; other placements (analytic step): {others}" if others else "")
    )


def render_search(report: dict[str, Any], s: Search, top: int, console: Any) -> None:
    """The header, the ranked table, the recommendation and the rejections."""
    hw, w = s.hardware, s.workload
    cpu = hw.name == "cpu"
    console.print(
        f"[bold]{report['model']}[/bold] ({w.params:,} parameters, {w.tokens:,} tokens per step) on "
        f"{s.devices:,} x {hw.name}: {hw.peak_flops / 1e12:,.1f} TFLOP/s, {fmt_bytes(hw.memory)} at "
        f"{hw.memory_bandwidth / 1e9:,.0f} GB/s; budget {fmt_bytes(s.budget)} per device"
    )
    ranked = s.ranked
    t = Table(title=f"{len(ranked):,} of {len(s.results):,} layouts fit; the fastest {min(top, len(ranked))}")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"),
        ("rules", "left"),
        ("mesh", "left"),
        ("remat", "left"),
        ("micro-batches", "right"),
        ("peak / budget", "right"),
        ("compute", "right"),
        ("comm by axis", "left"),
        ("step", "right"),
        ("MFU", "right"),
        ("bound by", "left"),
        ("estimate", "left"),
    )
    host = any(r.host for r in ranked[:top])  # a column of its own only when something is offloaded
    columns += (("host memory", "left"),) if host else ()
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    for i, r in enumerate(ranked[:top], 1):
        t.add_row(*_row(i, r, s.budget, host))
    console.print(t)
    unit = "; times in device-seconds (CPU time / devices)" if cpu else ""
    console.print(
        "peak: params + gradients + optimizer state (exact) + activations (estimate); * XLA's compiled "
        "peak. step: the roofline of cost.py"
        + unit
        + (
            "; host memory: offloaded state and activations per device, "
            "their transfers priced on the host link (comm 'host')"
            if host
            else ""
        ),
        highlight=False,
    )
    if s.duplicates:
        console.print(
            f"{s.duplicates:,} layouts equal to a listed one once size-1 axes are dropped are not listed",
            highlight=False,
        )
    if s.calibration != 1.0:
        console.print(
            f"analytic estimates are scaled by {s.calibration:.2f}, the median compiled / analytic ratio "
            f"of the compiled layouts",
            highlight=False,
        )
    if ranked:
        b = ranked[0]
        console.print(
            f"[bold]best:[/bold] {b.candidate.label}: {fmt_seconds(b.step_time)} per step "
            f"({_estimate(b).source}), MFU {_estimate(b).mfu:.0%}, bound by {_estimate(b).bottleneck}; peak "
            f"{fmt_bytes(b.peak)} of {fmt_bytes(s.budget)} ({b.peak_source})"
            + (f"; host memory {_host(b)} per device" if b.host else ""),
            highlight=False,
        )
        console.print(f"  why: {why(b)}", highlight=False, markup=False)
        if b.placements:
            console.print(f"  {nodes_note(b, hw.node_size)}", highlight=False, markup=False)
        view = b.compiled_view or {}
        if view and view.get("status") != "ok":
            console.print(f"  compiled view {view.get('status')}: {view.get('reason')}", highlight=False, markup=False)
    rejected = s.rejected
    if rejected:
        kinds = Counter((r.reason or "").split(":")[0] for r in rejected)
        console.print(
            f"rejected {len(rejected):,}: " + ", ".join(f"{k} {n:,}" for k, n in kinds.most_common()), highlight=False
        )
        priced = sorted((r for r in rejected if r.peak > 0), key=lambda r: r.peak)[:3]
        for r in priced:
            console.print(f"  - {r.candidate.label}: {r.reason}", highlight=False, markup=False)
    tm = report["timing"]
    console.print(
        f"timing: search {tm['search_s']:.1f} s, {tm['compiles']} compiles {tm['compile_s']:.1f} s, "
        f"total {tm['total_s']:.1f} s",
        highlight=False,
    )


def write_best(cfg: Config, sets: list[str], best: Result, path: str, report: dict[str, Any]) -> Path:
    """The config with the best layout applied, every default resolved (``partitioning train`` runs it)."""
    overrides = best.candidate.overrides(best.rules, best.optimizer_rules)
    # Another layout is another run: its own run_dir (named after the file), never the original's checkpoints.
    run_dir = f"runs/{Path(path).stem}"
    tuned = load_config(cfg.path, [*sets, *overrides, f"run_dir={run_dir}"])
    e = _estimate(best)
    head = [
        f"# Written by `partitioning tune {cfg.path}` for {best.candidate.devices:,} devices "
        f"({report['search']['hardware']['name']}):",
        f"#   {best.candidate.label}",
        f"#   estimated {fmt_seconds(best.step_time)} per step ({e.source}), bound by {e.bottleneck};",
        f"#   peak {fmt_bytes(best.peak)} per device ({best.peak_source}) of a "
        f"{fmt_bytes(report['search']['budget_bytes'])} budget.",
        f"#   run_dir {run_dir}: its own, so `partitioning train {path}` starts a run of this layout",
    ]
    text = "\n".join(head) + "\n" + tuned.to_yaml(best.candidate.sizes, model_options_resolved(tuned))
    return write_text(path, text, "--out")


__all__ = ["render_search", "write_best", "fmt_seconds", "why", "nodes_note"]
