"""`partitioning compare` (partitioning.cli.compare): several rule tables side by side."""

import json

import pytest


def test_compare(write, tmp_path, run_cli_in_process, small_config):
    cfg = write("small.yaml", small_config)
    rules = write("mine.yaml", "rules:\n  - [batch, [data, fsdp]]\n  - [mlp, fsdp]\n")
    code, out, err = run_cli_in_process(
        "compare",
        cfg,
        "--rules",
        "fsdp",
        "dp",
        rules,
        "--json",
        tmp_path / "c.json",
        "--set",
        "mesh.shape={data: 2, fsdp: -1, tensor: 1}",
    )
    assert code == 0, err
    j = json.loads((tmp_path / "c.json").read_text())
    by = {t["rules"]: t for t in j["tables"]}
    assert list(by) == ["fsdp", "dp", str(rules)]
    total = 36_864 * 4
    assert by["dp"]["totals"]["params"]["per_device"] == total
    # Each table on a mesh that uses its axes: the config's own for its table and for a file that names
    # no mesh but fits it, the preset's for dp (the config's fsdp axis would only repeat dp's work).
    assert by["fsdp"]["mesh"] == by[str(rules)]["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert by["dp"]["mesh"] == {"data": 8} and by["dp"]["mesh_source"] == "the mesh of rules dp"
    assert "dp: mesh {data: 8} (the mesh of rules dp)" in out
    assert by["fsdp"]["totals"]["params"]["per_device"] == total // 4  # replicated over data
    assert by[str(rules)]["totals"]["params"]["per_device"] == 4 * (64 * 32 * 2 + 4 * 32 * 256 // 4)
    assert by["dp"]["replicated_share"] == pytest.approx(1.0, abs=1e-3)
    assert by["fsdp"]["replicated_share"] == pytest.approx(0.0, abs=1e-3)
    assert by[str(rules)]["replicated_share"] > 0.1  # embedding + unembed
    dp_c, fsdp_c = by["dp"]["compiled"]["collectives"], by["fsdp"]["compiled"]["collectives"]
    assert dp_c["all-gather"]["count"] == 0 and fsdp_c["all-gather"]["count"] >= 1
    assert dp_c["all-reduce"]["bytes"] >= total
    row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("dp "))
    assert row.split("│")[3].strip() == "144.00 KiB" and "100.0%" in row


def test_each_table_on_a_mesh_that_uses_its_axes(repo, run_cli_subprocess, one_line_error, tmp_path):
    """The issue's case: fsdp_tp is no longer fsdp, tp and dp no longer replicate over an unused fsdp axis."""
    r = run_cli_subprocess(
        "compare",
        "configs/quickstart.yaml",
        "--rules",
        "fsdp_tp",
        "fsdp",
        "tp",
        "dp",
        "--no-compile",
        "--json",
        tmp_path / "c.json",
    )
    assert r.returncode == 0, r.stderr
    by = {t["rules"]: t for t in json.loads((tmp_path / "c.json").read_text())["tables"]}
    assert {k: t["mesh"] for k, t in by.items()} == {
        "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
        "fsdp": {"data": 1, "fsdp": 8, "tensor": 1},
        "tp": {"data": 2, "tensor": 4},  # tensor 8 would not divide the 4 heads
        "dp": {"data": 8},
    }
    ratio = {k: t["totals"]["total"]["per_device"] / t["totals"]["total"]["ideal"] for k, t in by.items()}
    assert ratio["fsdp_tp"] == pytest.approx(1.0, abs=0.01) and ratio["dp"] == pytest.approx(8.0)
    assert 1.9 < ratio["tp"] < 2.1  # replicated over data 2 only
    assert "tp: mesh {data: 2, tensor: 4} (the mesh of rules tp)" in r.stdout
    # A mesh per table by hand ('-': chosen), and a wrong count is one line.
    r = run_cli_subprocess(
        "compare",
        "configs/quickstart.yaml",
        "--rules",
        "tp",
        "dp",
        "--mesh",
        "{data: 4, tensor: 2}",
        "-",
        "--no-compile",
        "--json",
        tmp_path / "d.json",
    )
    assert r.returncode == 0, r.stderr
    tables = json.loads((tmp_path / "d.json").read_text())["tables"]
    assert [(t["mesh"], t["mesh_source"]) for t in tables] == [
        ({"data": 4, "tensor": 2}, "--mesh"),
        ({"data": 8}, "the mesh of rules dp"),
    ]
    err = one_line_error(run_cli_subprocess("compare", "configs/quickstart.yaml", "--rules", "tp", "dp", "--mesh", "-"))
    assert err == "error: --mesh: 1 mesh(es) for 2 rule tables; give one per table ('-' to choose it)"


def test_a_preset_mesh_that_does_not_divide_the_model_is_fitted(write, small_config):
    from partitioning.config.tables import candidates, table_layout

    assert candidates({"data": -1, "tensor": 4}, 8)[:2] == [{"data": 2, "tensor": 4}, {"data": 4, "tensor": 2}]
    # 2 heads: tensor 4 does not divide them; the closest mesh over the same axes that does is data 4 x tensor 2.
    cfg = write(
        "gpt.yaml",
        "model: {name: gpt, embed: 32, heads: 2, mlp: 64, layers: 2, vocab_size: 64}\n"
        + small_config.split("mesh:", 1)[1].join(["mesh:", ""]),
    )
    t = table_layout(str(cfg), [], "tp", 8)
    assert t.plan.mesh == {"data": 4, "tensor": 2}
    assert t.source.startswith("fitted: the mesh of rules tp, {data: -1, tensor: 4}, does not fit (")
