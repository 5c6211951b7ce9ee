"""Loss-curve PNG from logged metrics (matplotlib, headless ``Agg`` backend), and the hook that redraws it.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> import pathlib, tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> logger = pt.train.JsonlLogger(None)
    >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4,
    ...                hooks=[logger, pt.train.LossPlot(logger, run / "loss.png")], progress=False)   # redrawn
    >>> pt.train.plot_loss(logger.records, run / "again.png", title="quickstart").exists()
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from partitioning.outdir import save_figure


def plot_loss(records: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Plots train ``loss`` and ``eval_loss`` against ``step`` and saves a PNG.

    Example::

        >>> import pathlib, tempfile
        >>> records = [{"step": s, "loss": 5.5 / s} for s in range(1, 11)] + [{"step": 10, "eval_loss": 0.6}]
        >>> pt.train.plot_loss(records, pathlib.Path(tempfile.mkdtemp()) / "loss.png", title="x").name
        'loss.png'
    """
    # A bare Figure (no pyplot) renders PNGs with the Agg canvas: no display,
    # and it never switches the backend of a notebook or GUI session.
    # Imported here: matplotlib costs ~0.5 s and only runs that plot need it.
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.add_subplot()
    for key, label, style in (("loss", "train", "-"), ("eval_loss", "eval", "o-")):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, style, label=label, markersize=4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend()
    return save_figure(fig, path)


class LossPlot:
    """Hook redrawing ``path`` from ``logger.records`` at every eval and when the loop ends (process 0).

    ``logger`` is anything with a ``records`` list of logged metrics (a :class:`JsonlLogger`).

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
        >>> import pathlib, tempfile
        >>> logger, png = pt.train.JsonlLogger(None), pathlib.Path(tempfile.mkdtemp()) / "loss.png"
        >>> state = pt.fit(trainer, trainer.init(jax.random.key(0)), batches, steps=2,
        ...                hooks=[logger, pt.train.LossPlot(logger, png, title="x")], progress=False)
        >>> png.exists()
        True
    """

    def __init__(self, logger: Any, path: str | Path, *, title: str = ""):
        self.logger, self.path, self.title = logger, Path(path), title

    def draw(self) -> None:
        if jax.process_index() == 0 and self.logger.records:
            plot_loss(self.logger.records, self.path, title=self.title)

    def on_step_end(self, step: int, state: Any, metrics: dict[str, Any] | None) -> None:
        if metrics is not None and "eval_loss" in metrics:
            self.draw()

    def on_exit(self, state: Any, reason: str) -> None:
        self.draw()


__all__ = ["plot_loss", "LossPlot"]
