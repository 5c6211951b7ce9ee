"""The plan PNG (partitioning.plan.plot) and the loss PNG (partitioning.train.plots): what is drawn where."""

import json

from matplotlib.figure import Figure

from partitioning.plan.plot import _axis_names, _draw_mesh, _grid, plot_plan
from partitioning.train.plots import plot_loss

RULES = [["batch", ["data", "fsdp"]], ["embed", "fsdp"], ["vocab", "fsdp"], ["mlp", "fsdp"]]


def _texts(ax):
    return (
        [t.get_text() for t in ax.texts]
        + [ax.get_xlabel(), ax.get_ylabel()]
        + [t.get_text() for t in ax.get_yticklabels()]
    )


def test_mesh_panel_has_no_stray_labels_and_only_rules_that_fire():
    assert _grid({"data": 1, "fsdp": 8, "tensor": 1}) == (1, 8, "", "fsdp 8")
    assert _axis_names(RULES, {2, 3}) == {"data": ["batch"], "fsdp": ["batch", "embed"]}
    mx = Figure().subplots()
    _draw_mesh(mx, {"data": 1, "fsdp": 8, "tensor": 1}, RULES, {2, 3})
    texts = _texts(mx)
    assert "-" not in texts and mx.get_ylabel() == "" and not mx.get_yticks().size
    legend = next(t for t in texts if t.startswith("data (1)"))
    assert legend.splitlines() == ["data (1): batch", "fsdp (8): batch, embed", "tensor (1): no rule fires on it"]


def test_the_legend_sits_below_the_bars(tmp_path, monkeypatch):
    seen = {}
    real = Figure.savefig

    def check(fig, *a, **k):
        out = real(fig, *a, **k)  # draws: extents are final
        ax = fig.axes[0]
        seen["legend_top"] = ax.get_legend().get_window_extent().y1
        seen["axes_bottom"] = ax.get_window_extent().y0
        return out

    monkeypatch.setattr(Figure, "savefig", check)
    report = {
        "devices": 8,
        "mesh": {"data": 1, "fsdp": 8},
        "rules": RULES,
        "model": {"name": "gpt"},
        "config": "x",
        "warnings": {"unused_rules": [{"index": 2}, {"index": 3}]},
        "totals": {k: {"per_device": 2**30, "ideal": 2**30} for k in ("params", "gradients", "optimizer", "total")},
        "compiled": {"status": "ok", "memory": {"argument": 3 * 2**30, "temp": 2**30}},
    }
    path = plot_plan(json.loads(json.dumps(report)), tmp_path / "plan.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert seen["legend_top"] <= seen["axes_bottom"]  # outside the plot area: it covers no bar, no label


def test_loss_plot_has_whole_step_ticks(tmp_path, monkeypatch):
    drawn = {}
    real = Figure.savefig

    def keep(fig, *a, **k):
        drawn["ticks"] = fig.axes[0].get_xticks()
        return real(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_loss(
        [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5, "eval_loss": 2.7}, {"step": 3, "loss": 2.0}],
        tmp_path / "loss.png",
    )
    assert len(drawn["ticks"]) and all(float(t).is_integer() for t in drawn["ticks"])
