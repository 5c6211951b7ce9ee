"""The plan PNG (partitioning.plan.plot) and the loss PNG (partitioning.train.plots): what is drawn where."""

import json

from matplotlib.figure import Figure

from partitioning.plan.plot import _axis_names, _block, _draw_mesh, _grid, plot_plan
from partitioning.train.plots import plot_loss

RULES = [["batch", ["data", "fsdp"]], ["embed", "fsdp"], ["vocab", "fsdp"], ["mlp", "fsdp"]]


def _texts(ax):
    return (
        [t.get_text() for t in ax.texts]
        + [ax.get_xlabel(), ax.get_ylabel()]
        + [t.get_text() for t in ax.get_yticklabels()]
    )


WI = {
    "path": "params/wi",
    "shape": [64, 256],
    "total_bytes": 65536,
    "claimed_by": [
        {"rule": 1, "logical": "embed", "mesh_axes": "fsdp"},
        {"rule": 3, "logical": "mlp", "mesh_axes": "tensor"},
    ],
}


def test_mesh_panel_has_no_stray_labels_and_only_rules_that_fire():
    assert _grid({"data": 1, "fsdp": 8, "tensor": 1}) == (1, 8, "", "fsdp 8")
    assert _axis_names(RULES, {2, 3}) == {"data": ["batch"], "fsdp": ["batch", "embed"]}
    mx = Figure().subplots()
    axes = {"data": {"splits": []}, "fsdp": {"splits": ["embed"]}, "tensor": {"splits": []}}
    _draw_mesh(mx, {"mesh": {"data": 1, "fsdp": 8, "tensor": 1}, "rules": RULES, "axes": axes}, {2, 3})
    texts = _texts(mx)
    assert "-" not in texts and mx.get_ylabel() == "" and not mx.get_yticks().size
    legend = next(t for t in texts if t.startswith("data (1)"))
    assert legend.splitlines() == [
        "data (1): splits no parameter + the batch",
        "fsdp (8): splits embed + the batch",
        "tensor (1): splits no parameter",
    ]
    assert mx.get_xlabel() == "fsdp 8: splits embed + the batch"


def test_each_device_shows_its_slice_of_the_largest_parameter():
    mesh = {"data": 1, "fsdp": 4, "tensor": 2}
    assert _block(WI, {"fsdp": 1, "tensor": 1}, mesh) == "[16:32, 128:256]"
    assert _block(WI, {"fsdp": 3, "tensor": 0}, {"fsdp": 4, "tensor": 1}) == "[48:64, :]"
    both = dict(WI, claimed_by=[{"mesh_axes": ["fsdp", "tensor"]}, None])  # the first axis is the major one
    assert _block(both, {"fsdp": 1, "tensor": 1}, mesh) == "[24:32, :]"
    mx = Figure().subplots()
    _draw_mesh(mx, {"mesh": mesh, "rules": RULES, "leaves": [WI], "axes": {}})
    cells = [t.get_text() for t in mx.texts if t.get_text()[:1].isdigit()]
    assert cells[:3] == ["0\n[0:16, 0:128]", "1\n[0:16, 128:256]", "2\n[16:32, 0:128]"]
    legend = next(t for t in _texts(mx) if t.startswith("in each device"))
    assert legend.splitlines()[0] == "in each device: its index and its slice of params/wi (64, 256)"
    assert mx.get_title() == "mesh data=1 x fsdp=4 x tensor=2: what each device holds"


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
