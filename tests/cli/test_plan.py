"""`partitioning plan` (partitioning.cli.plan): output, JSON, PNG, bad input, big meshes, compiling in a child."""

import json

import pytest

PLAN_KEYS = {
    "config",
    "rules_source",
    "model",
    "batch",
    "mesh",
    "devices",
    "rules",
    "optimizer_rules",
    "on_indivisible",
    "parameters",
    "trainable_parameters",
    "active_parameters",
    "leaves",
    "optimizer_leaves",
    "totals",
    "memory_kinds",
    "replicated_share",
    "warnings",
    "errors",
    "compiled",
    "timing",
    "memory_budget",
    "axes",
    "parallel",
    "offload",
}


COMPILED_KEYS = {
    "status",
    "backend",
    "devices",
    "lower_s",
    "compile_s",
    "memory",
    "flops",
    "collectives",
    "collective_ops",
    "sharding_check",
}


def test_plan_table_json_png(write, tmp_path, run_cli_in_process, small_config, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: cells unfolded (narrow ones: test_tables_fit_the_terminal)
    cfg = write("small.yaml", small_config)
    code, out, err = run_cli_in_process("plan", cfg, "--json", tmp_path / "p.json", "--png", tmp_path / "p.png")
    assert code == 0, err
    assert (
        f"mlp (36,864 parameters) on mesh {{'data': 1, 'fsdp': 8, 'tensor': 1}} (8 devices), rules fsdp ({cfg}:10)"
        in out
    )
    assert f"wrote {tmp_path / 'p.png'}" in err
    assert "params/wi_0" in out and "P('fsdp', None)" in out
    assert "compiled train step (8 cpu devices)" in out
    assert "self-check: the " in out and "compiled input/output shardings match the rules" in out
    j = json.loads((tmp_path / "p.json").read_text())
    assert set(j) == PLAN_KEYS
    assert j["parameters"] == 36_864 and j["devices"] == 8
    # No mesh.device_memory and a CPU reports no limit: peak is known, the budget is not, so it fits.
    assert j["memory_budget"]["peak"] > 0 and j["memory_budget"]["fits"] is True
    assert j["totals"]["params"] == {"per_device": 36_864 * 4 // 8, "total": 36_864 * 4, "ideal": 36_864 * 4 / 8}
    assert set(j["compiled"]) >= COMPILED_KEYS and j["compiled"]["status"] == "ok"
    assert j["compiled"]["collectives"]["all-gather"]["count"] >= 1
    assert j["compiled"]["sharding_check"]["mismatches"] == []
    assert set(j["compiled"]["memory"]) == {
        "argument",
        "output",
        "alias",
        "temp",
        "generated_code",
        "peak_estimate",
    } | {"host_argument", "host_output", "host_alias", "host_temp", "host"}
    assert j["compiled"]["memory"]["host"] == 0 and j["offload"] == {"state": [], "update": "device"}
    # the state is donated: XLA's argument bytes are the plan's params + optimizer state (+ batch, scalars)
    state = j["totals"]["params"]["per_device"] + j["totals"]["optimizer"]["per_device"]
    assert state <= j["compiled"]["memory"]["argument"] <= state + 1024
    # FLOPs: each device does 1/8 of the step; an MLP on tokens still does ~6 FLOPs per parameter per token
    # (its matmuls are all but the embedding gather).
    f = j["compiled"]["flops"]
    assert f["total"] == pytest.approx(8 * f["per_device"])
    assert 0.5 * f["six_n_tokens"] <= f["total"] <= 1.5 * f["six_n_tokens"]
    assert f"FLOPs per step: {f['per_device'] / 1e12:.4g} TFLOP per device" in out
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_warns_about_replicated_matrix(write, run_cli_in_process, small_config):
    cfg = write(
        "rep.yaml", small_config.replace("rules: fsdp", "rules:\n  - [batch, [data, fsdp]]\n  - [vocab, fsdp]\n")
    )
    code, out, err = run_cli_in_process("plan", cfg, "--no-compile")
    assert code == 0, err
    assert "replicated: params/wi_0 (32, 256) is whole on every device: 128.00 KiB per device" in out
    assert "no rule mentions logical name(s) 'embed', 'length', 'mlp'" in out
    assert "compiled view skipped: --no-compile" in out


def test_plan_beyond_cpu_limit_gives_table_and_says_why(write, tmp_path, run_cli_in_process, small_config):
    cfg = write("big.yaml", small_config.replace("embed: 32", "embed: 4096").replace("mlp: 256", "mlp: 8192"))
    code, out, err = run_cli_in_process("plan", cfg, "--devices", "4096", "--json", tmp_path / "b.json")
    assert code == 0, err
    j = json.loads((tmp_path / "b.json").read_text())
    assert j["devices"] == 4096 and j["mesh"] == {"data": 1, "fsdp": 4096, "tensor": 1}
    assert j["totals"]["params"]["per_device"] * 4096 == j["totals"]["params"]["total"]
    assert j["compiled"]["status"] == "skipped"
    assert "XLA's CPU backend compiles for at most 2048 devices" in j["compiled"]["reason"]
    assert "compiled view skipped: XLA's CPU backend compiles for at most 2048 devices" in " ".join(out.split())


def test_plan_compiles_in_a_child_process(write, tmp_path, run_cli_in_process, small_config):
    cfg = write("small.yaml", small_config)
    code, out, err = run_cli_in_process("plan", cfg, "--compile-in", "child", "--json", tmp_path / "c.json")
    assert code == 0, err
    v = json.loads((tmp_path / "c.json").read_text())["compiled"]
    assert v["status"] == "ok", v
    assert v["devices"] == 8 and v["child_wall_s"] > 0
    assert v["collectives"]["reduce-scatter"]["count"] >= 1
    assert v["sharding_check"]["mismatches"] == []


def test_plan_child_reports_train_step_errors_on_one_line(write, tmp_path, run_cli_in_process, small_config):
    cfg = write("small.yaml", small_config.replace("batch_size: 8", "batch_size: 12"))
    code, out, err = run_cli_in_process("plan", cfg, "--compile-in", "child", "--json", tmp_path / "c.json")
    assert code == 0, err
    v = json.loads((tmp_path / "c.json").read_text())["compiled"]
    assert v["status"] == "failed" and "\n" not in v["reason"]
    assert v["reason"].startswith(
        f"{cfg}:12: train.batch_size: batch_size 12 is not divisible by the batch mesh axes ('data', 'fsdp') of size 8"
    )


# plan and compare share their config handling: bad input for either is one line and exit 2.


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "nope.yaml"], "error: nope.yaml: no such config file"),
        (
            ["plan", "{cfg}", "--set", "trian.steps=3"],
            "error: --set trian.steps=3: unknown key 'trian'; did you mean 'train'?",
        ),
        (
            ["plan", "{cfg}", "--devices", "12", "--set", "mesh.shape={data: 2, fsdp: 4}"],
            "small.yaml (--set mesh.shape={data: 2, fsdp: 4}): mesh.shape: mesh {data: 2, fsdp: 4} needs 8 devices, "
            "but there are 12; change a size or use -1 for one axis",
        ),
        (["compare", "{cfg}", "--rules", "fsdp", "fsdp_pt"], "did you mean 'fsdp_tp'?"),
        (["plan", "{cfg}", "--devices", "0"], "error: --devices must be a positive number of devices, got 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(write, argv, message, run_cli_in_process, small_config):
    cfg = write("small.yaml", small_config)
    code, out, err = run_cli_in_process(*[a.replace("{cfg}", str(cfg)) for a in argv])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


@pytest.mark.parametrize("columns", [72, 100])  # the table needs 110 columns unfolded
def test_tables_fit_the_terminal(write, run_cli_in_process, small_config, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    cfg = write("small.yaml", small_config)
    code, out, err = run_cli_in_process("plan", cfg, "--no-compile")
    assert code == 0, err
    table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(leaf) for leaf in table) <= columns
    assert "params/wi_0" in out  # long cells fold inside their column, never vanish
