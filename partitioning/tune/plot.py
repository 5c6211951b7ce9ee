"""PNG of a search: every priced layout's peak memory per device against its estimated step time.

Takes the JSON-able report of ``partitioning tune`` (``--json`` writes the same
dict), so a saved search can be drawn later. Fitting layouts are coloured by
rule table, rejected ones are grey crosses, the budget is a horizontal line
and the recommended layout is circled; compiled figures are filled markers.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
    >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
    >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
    >>> s = pt.tune.search(params, opt_state, {"fsdp": pt.Rules.preset("fsdp")}, 8, w, pt.tune.hardware("h100"),
    ...                       budget=80 * 2**30)
    >>> import pathlib, tempfile
    >>> report = {"model": "gpt", "search": s.to_json(), "best": s.best.to_json()}   # or what `tune --json` wrote
    >>> pt.tune.plot_search(report, pathlib.Path(tempfile.mkdtemp()) / "tune.png").name
    'tune.png'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from partitioning.fmt import fmt_bytes
from partitioning.outdir import save_figure

GIB = 2**30
# Ten distinguishable colours (matplotlib's tab10 with black for its grey, which the rejected crosses use);
# beyond ten tables the marker changes too, so every table is its own (colour, marker).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#000000", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D")


def _points(rows: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    out = []
    for r in rows:
        t = r.get("step_time_s")
        if t and r.get("peak_bytes"):
            out.append((t, r["peak_bytes"] / GIB, r))
    return out


def table_styles(tables: list[str]) -> dict[str, tuple[str, str]]:
    """``{table: (colour, marker)}``, a different pair for each of up to 40 tables.

    Example::

        >>> from partitioning.tune.plot import table_styles
        >>> table_styles(["dp", "fsdp"])
        {'dp': ('#1f77b4', 'o'), 'fsdp': ('#ff7f0e', 'o')}
    """
    return {t: (PALETTE[i % len(PALETTE)], MARKERS[i // len(PALETTE) % len(MARKERS)]) for i, t in enumerate(tables)}


def plot_search(report: dict[str, Any], path: str | Path) -> Path:
    """Saves the candidates' scatter (see the module docstring); ``report``: ``{"model", "search": Search.to_json(),
    "best": Result.to_json()}`` (what ``tune --json`` writes).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=32, seq_len=128)
        >>> plan = pt.build_plan(params, opt_state, {"data": 8}, "dp")   # any layout: the workload reads shapes
        >>> w = pt.tune.workload(plan.params, batch_size=32, seq_len=128)
        >>> s = pt.tune.search(params, opt_state, {"fsdp": pt.Rules.preset("fsdp")}, 8, w, pt.tune.hardware("h100"),
        ...                       budget=80 * 2**30)
        >>> import pathlib, tempfile
        >>> png = pathlib.Path(tempfile.mkdtemp()) / "tune.png"
        >>> pt.tune.plot_search({"model": "gpt", "search": s.to_json(), "best": s.best.to_json()}, png).exists()
        True
    """
    from matplotlib.figure import Figure  # ~0.5 s to import; only --png needs it

    fig = Figure(figsize=(12.5, 6.2), dpi=100)
    ax = fig.subplots()
    search = report["search"]
    fitting, rejected = _points(search["ranked"]), _points(search["rejected"])
    if rejected:
        ax.scatter(
            [p[0] for p in rejected],
            [p[1] for p in rejected],
            marker="x",
            color="#bbbbbb",
            s=14,
            label=f"rejected ({len(search['rejected'])})",
            zorder=1,
        )
    tables = sorted({p[2]["rules"] for p in fitting})
    styles = table_styles(tables)
    colours, markers = {t: c for t, (c, _) in styles.items()}, {t: m for t, (_, m) in styles.items()}
    for name in tables:
        pts = [p for p in fitting if p[2]["rules"] == name]
        compiled = [p for p in pts if (p[2].get("estimate") or {}).get("source") == "compiled"]
        ax.scatter(
            [p[0] for p in pts],
            [p[1] for p in pts],
            s=22,
            marker=markers[name],
            facecolors="none",
            edgecolors=colours[name],
            label=f"{name} ({len(pts)})",
            zorder=2,
        )
        if compiled:
            ax.scatter(
                [p[0] for p in compiled],
                [p[1] for p in compiled],
                s=30,
                marker=markers[name],
                color=colours[name],
                zorder=3,
            )
    budget = search["budget_bytes"] / GIB
    ax.axhline(budget, color="#c44e52", linestyle="--", linewidth=1.2, zorder=0)
    ax.text(
        0.995,
        budget,
        f" budget {fmt_bytes(search['budget_bytes'])}",
        color="#c44e52",
        fontsize=8,
        va="bottom",
        ha="right",
        transform=ax.get_yaxis_transform(),
    )
    best = report.get("best")
    if best and best.get("estimate"):
        bt, bp = best["step_time_s"], best["peak_bytes"] / GIB
        ax.scatter([bt], [bp], s=260, facecolors="none", edgecolors="black", linewidths=1.6, zorder=4)
        ax.annotate(
            f"best: {best['label']}",
            (bt, bp),
            xytext=(12, 14),
            textcoords="offset points",
            fontsize=8,
            arrowprops={"arrowstyle": "-", "color": "black"},
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("estimated step time (s)" + (" — device-seconds" if search["hardware"]["name"] == "cpu" else ""))
    ax.set_ylabel("peak memory per device (GiB)")
    hw = search["hardware"]
    ax.set_title(
        f"{report.get('model', '')}: {search['candidates']:,} layouts of {search['devices']:,} "
        f"{hw['name']} devices ({search['fitting']:,} fit); filled: compiled",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="rule table (fitting)", title_fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["plot_search", "table_styles"]
