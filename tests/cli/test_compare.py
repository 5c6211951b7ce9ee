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
    assert j["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert by["fsdp"]["totals"]["params"]["per_device"] == total // 4  # replicated over data
    assert by[str(rules)]["totals"]["params"]["per_device"] == 4 * (64 * 32 * 2 + 4 * 32 * 256 // 4)
    assert by["dp"]["replicated_share"] == pytest.approx(1.0, abs=1e-3)
    assert by["fsdp"]["replicated_share"] == pytest.approx(0.0, abs=1e-3)
    assert by[str(rules)]["replicated_share"] > 0.1  # embedding + unembed
    dp_c, fsdp_c = by["dp"]["compiled"]["collectives"], by["fsdp"]["compiled"]["collectives"]
    assert dp_c["all-gather"]["count"] == 0 and fsdp_c["all-gather"]["count"] >= 1
    assert dp_c["all-reduce"]["bytes"] >= total
    row = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("dp "))
    assert row.split("│")[2].strip() == "144.00 KiB" and "100.0%" in row
