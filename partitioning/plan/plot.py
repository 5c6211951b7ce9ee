"""PNG of a plan: per-device memory by category beside the ideal, and the mesh.

Takes the JSON-able report of ``partitioning plan`` (``--json`` writes the
same dict), so a saved plan can be drawn later.

Example::

    >>> import optax
    >>> from partitioning.models import GPT
    >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
    ...                                             batch_size=8, seq_len=16)
    >>> import pathlib, tempfile
    >>> report = pt.build_plan(params, opt_state, {"data": 2, "fsdp": 4}, "fsdp").to_json()   # or `plan --json`
    >>> pt.plan.plot_plan(report, pathlib.Path(tempfile.mkdtemp()) / "plan.png").name
    'plan.png'
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import numpy as np

from partitioning.fmt import fmt_bytes
from partitioning.outdir import save_figure

GIB = 1024**3
MAX_CELLS = 16


def _grid(mesh: dict[str, int]) -> tuple[int, int, str, str]:
    """Rows x columns for drawing a mesh: the last axis across, the others folded down.

    Size-1 axes are left out (they do not change the picture), so
    ``{data: 1, fsdp: 8, tensor: 1}`` draws as one row of 8 devices.
    """
    axes = [(n, s) for n, s in mesh.items() if s > 1]
    if not axes:
        return 1, 1, "", ""
    cols_name, cols = axes[-1]
    rows = math.prod(s for _, s in axes[:-1]) if len(axes) > 1 else 1
    rows_name = " x ".join(f"{n} {s}" for n, s in axes[:-1])
    return rows, cols, rows_name, f"{cols_name} {cols}"


def _axis_names(rules: list, unused: AbstractSet[int] = frozenset()) -> dict[str, list[str]]:
    """Mesh axis -> the logical names the rules map onto it (rules at the ``unused`` indices left out)."""
    out: dict[str, list[str]] = {}
    for i, (logical, axes) in enumerate(rules):
        if i in unused:
            continue
        for a in [axes] if isinstance(axes, str) else axes or []:
            out.setdefault(a, [])
            if logical not in out[a]:
                out[a].append(logical)
    return out


def _largest(report: dict[str, Any]) -> dict[str, Any] | None:
    """The parameter with the most bytes (the one whose split matters most), from the plan's leaves."""
    leaves = [leaf for leaf in report.get("leaves") or [] if leaf.get("shape")]
    return max(leaves, key=lambda leaf: leaf.get("total_bytes", 0), default=None)


def _block(leaf: dict[str, Any], coords: dict[str, int], mesh: dict[str, int]) -> str:
    """``[:, 32:64, 256:512]``: the slice of ``leaf`` a device at mesh ``coords`` holds."""
    out = []
    for size, claim in zip(leaf["shape"], leaf.get("claimed_by") or [None] * len(leaf["shape"]), strict=True):
        axes = claim["mesh_axes"] if claim else None
        axes = [axes] if isinstance(axes, str) else list(axes or [])
        ways, k = 1, 0
        for a in axes:  # the first axis is the major one, as in a PartitionSpec entry
            k, ways = k * mesh.get(a, 1) + coords.get(a, 0), ways * mesh.get(a, 1)
        b = size // ways if ways else size
        out.append(":" if ways == 1 else f"{k * b}:{(k + 1) * b}")
    return "[" + ", ".join(out) + "]"


def _coords(index: int, working: list[tuple[str, int]]) -> dict[str, int]:
    """Mesh coordinates of the device at ``index`` (row-major over the axes of size > 1)."""
    if not working:
        return {}
    at = np.unravel_index(index, [s for _, s in working])
    return {n: int(v) for (n, _), v in zip(working, at, strict=True)}


def _draw_mesh(mx: Any, report: dict[str, Any], unused: AbstractSet[int] = frozenset()) -> None:
    """The mesh as a grid (last axis across, the rest folded down), capped at MAX_CELLS a side. Each cell is a
    device with its slice of the largest parameter; each axis is labelled with what it splits."""
    mesh: dict[str, int] = report["mesh"]
    rules = report.get("rules") or []
    rows, cols, rows_name, cols_name = _grid(mesh)
    r_show, c_show = min(rows, MAX_CELLS), min(cols, MAX_CELLS)
    colour = np.tile(np.arange(c_show), (r_show, 1))
    mx.imshow(colour, cmap="tab20" if c_show <= 20 else "viridis", aspect="auto", interpolation="nearest", alpha=0.55)
    # Cell borders, so each device is visibly its own square.
    mx.set_xticks(np.arange(-0.5, c_show, 1), minor=True)
    mx.set_yticks(np.arange(-0.5, r_show, 1), minor=True)
    mx.grid(which="minor", color="white", linewidth=2)
    mx.tick_params(which="minor", length=0)
    big = _largest(report)
    working = [(n, s) for n, s in mesh.items() if s > 1]
    show_blocks = big is not None and r_show * c_show <= 32
    for r in range(r_show):
        for c in range(c_show):
            if r_show * c_show > 128:
                continue
            index = r * cols + c
            text = str(index)
            if show_blocks and big is not None:
                block = _block(big, _coords(index, working), mesh)
                # Narrow cells (many columns): one dimension per line.
                text += "\n" + (block.replace(", ", ",\n") if c_show > 4 else block)
            mx.text(c, r, text, ha="center", va="center", fontsize=8 if show_blocks else 9)
    axes_info = report.get("axes") or {}
    names = _axis_names(rules, unused)

    def what(axis: str) -> str:
        splits = (axes_info.get(axis) or {}).get("splits")
        params = ", ".join(splits) if splits else "no parameter"
        batch = " + the batch" if "batch" in names.get(axis, []) else ""
        return f"splits {params}{batch}"

    col_axis = working[-1][0] if working else ""
    mx.set_xticks(sorted({0, c_show - 1}), [str(i) for i in sorted({0, c_show - 1})])
    mx.set_xlabel(
        cols_name + (f": {what(col_axis)}" if col_axis else "") + ("" if c_show == cols else f" (first {c_show} shown)")
    )
    if rows > 1:
        mx.set_yticks([0, r_show - 1], ["0", str(r_show - 1)])
        row_axes = [n for n, _ in working[:-1]]
        mx.set_ylabel(
            rows_name
            + (f": {what(row_axes[0])}" if len(row_axes) == 1 else "")
            + ("" if r_show == rows else f" (first {r_show} shown)"),
            fontsize=9,
        )
    else:  # one row: a row axis would only label nothing
        mx.set_yticks([])
    lines = [f"{a} ({s}): {what(a)}" for a, s in mesh.items()]
    if show_blocks and big is not None:
        lines.insert(0, f"in each device: its index and its slice of {big['path']} {tuple(big['shape'])}")
    elif big is not None:
        lines.insert(
            0, f"device 0 holds {big['path']}{_block(big, _coords(0, working), mesh)} of {tuple(big['shape'])}"
        )
    cells = "what each device holds" if show_blocks else "device index"
    mx.set_title("mesh " + " x ".join(f"{n}={s}" for n, s in mesh.items()) + f": {cells}", fontsize=10)
    mx.text(0.0, -0.2, "\n".join(lines), transform=mx.transAxes, fontsize=8, va="top", family="monospace")


def plot_plan(report: dict[str, Any], path: str | Path) -> Path:
    """Saves a two-panel PNG: stacked per-device bytes by category (plan and XLA) and the device mesh.

    Example::

        >>> import json, pathlib, subprocess, sys, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "run.yaml").write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp}")
        >>> _ = subprocess.run([sys.executable, "-m", "partitioning", "plan", "run.yaml", "--devices", "8",
        ...                     "--no-compile", "--json", "plan.json"], cwd=d, capture_output=True, check=True)
        >>> pt.plan.plot_plan(json.loads((d / "plan.json").read_text()), d / "plan.png").exists()
        True
    """
    # Imported here: matplotlib costs ~0.5 s and only --png needs it.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5.6), dpi=100)
    ax, mx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})

    totals = report["totals"]
    cats = [("params", "#4c72b0"), ("gradients", "#55a868"), ("optimizer", "#c44e52")]
    bars = [
        ("plan", {k: totals[k]["per_device"] for k, _ in cats}),
        ("ideal", {k: totals[k]["ideal"] for k, _ in cats}),
    ]
    compiled = report.get("compiled") or {}
    mem = compiled.get("memory") if compiled.get("status") == "ok" else None
    unit = GIB if totals["total"]["per_device"] >= GIB / 4 else 1024**2
    unit_name = "GiB" if unit == GIB else "MiB"
    x = np.arange(len(bars) + (1 if mem else 0))
    for i, (_, vals) in enumerate(bars):
        bottom = 0.0
        for k, color in cats:
            ax.bar(i, vals[k] / unit, bottom=bottom, color=color, label=k if i == 0 else None)
            bottom += vals[k] / unit
        ax.text(i, bottom, fmt_bytes(bottom * unit), ha="center", va="bottom", fontsize=8)
    if mem:
        i = len(bars)
        state = mem["argument"] / unit
        temp = mem["temp"] / unit
        ax.bar(i, state, color="#8c8c8c", label="XLA arguments")
        ax.bar(i, temp, bottom=state, color="#dd8452", label="XLA temporaries")
        ax.text(i, state + temp, fmt_bytes((state + temp) * unit), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [b for b, _ in bars] + (["compiled (XLA)"] if mem else []))
    ax.set_ylabel(f"{unit_name} per device")
    ax.set_title(f"per-device memory, {report['devices']:,} devices")
    ax.margins(y=0.12)  # room above the tallest bar for its label
    # Below the axes, never over a bar or its label.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=5, frameon=False)
    ax.grid(True, axis="y", alpha=0.3)

    unused = {u["index"] for u in (report.get("warnings") or {}).get("unused_rules", [])}
    _draw_mesh(mx, report, unused)
    source = report.get("rules_source") or f"rules from {report.get('config', '')}"
    fig.suptitle(f"{report.get('model', {}).get('name', '')}: {source}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["plot_plan"]
