"""Loss-curve PNG from logged metrics (matplotlib, headless ``Agg`` backend).

Example::

    >>> plot_loss(logger.records, "runs/quickstart/loss.png", title="quickstart")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partitioning.errors import ConfigError


def plot_loss(records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Plots train ``loss`` and ``eval_loss`` against ``step`` and saves a PNG.

    Example::

        >>> plot_loss(logger.records, "runs/x/loss.png", title="x")
    """
    # A bare Figure (no pyplot) renders PNGs with the Agg canvas: no display,
    # and it never switches the backend of a notebook or GUI session.
    # Imported here: matplotlib costs ~0.5 s and only runs that plot need it.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.add_subplot()
    for key, label, style in (("loss", "train", "-"), ("eval_loss", "eval", "o-")):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, style, label=label, markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend()
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Writes a matplotlib Figure as PNG, creating the folder.

    Example::

        >>> save_figure(fig, "runs/x/plan.png")
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the PNG: {e.strerror or e}", arg="png") from None
    return path


__all__ = ["plot_loss", "save_figure"]
