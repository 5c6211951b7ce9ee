"""`partitioning check` (partitioning.cli.check), in real subprocesses."""


def test_check_ok_simulates_devices(repo, tmp_path, run_cli_subprocess):
    # Its own run_dir: the README's first command leaves runs/quickstart at its last step in the checkout,
    # and check refuses a run with nothing left to train, as train would.
    r = run_cli_subprocess("check", "configs/quickstart.yaml", "--set", f"run_dir={tmp_path}/run", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "simulating 8 CPU devices" in r.stderr
    assert r.stdout.startswith("OK: configs/quickstart.yaml: model gpt (")
    assert "on mesh {'data': 1, 'fsdp': 8, 'tensor': 1} (8 devices)" in r.stdout


def test_check_devices_flag(write, run_cli_subprocess, base_config):
    path = write("run.yaml", base_config)
    r = run_cli_subprocess("check", str(path), "--devices", "16")
    assert r.returncode == 0, r.stderr
    assert "on mesh {'data': 1, 'fsdp': 16, 'tensor': 1} (16 devices)" in r.stdout


def test_check_bad_rule_one_line_exit_2(write, run_cli_subprocess, base_config):
    path = write("run.yaml", base_config.replace("rules: fsdp", "rules:\n  - [batch, data]\n  - [mlp, tensr]\n"))
    r = run_cli_subprocess("check", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {path}:12: rules[1]: mesh axis 'tensr' is not a mesh axis (data, fsdp, tensor); did you mean 'tensor'?"
    ]
    assert "Traceback" not in r.stderr


def test_check_indivisible(write, run_cli_subprocess, base_config):
    path = write(
        "run.yaml",
        base_config.replace("mlp: 128", "mlp: 100")
        .replace("heads: 4", "heads: 8")
        .replace("rules: fsdp", "rules: fsdp_tp")
        .replace("{data: 1, fsdp: -1, tensor: 1}", "{data: 1, fsdp: -1, tensor: 8}"),
    )
    r = run_cli_subprocess("check", str(path))
    assert r.returncode == 2
    assert (
        "run.yaml:10: rules: params/blocks/mlp/wi_0, params/blocks/mlp/wi_1: dim 2 ('mlp', size 100) is not "
        "divisible by mesh axes ('tensor',) of size 8 (presets/fsdp_tp.yaml:13: rules[4]); params/blocks/mlp/wo: "
        "dim 1 ('mlp', size 100) is not divisible by mesh axes ('tensor',) of size 8 (presets/fsdp_tp.yaml:13: "
        "rules[4]); change the rule or the size, or set on_indivisible: replicate\n" in r.stderr
    )
    r = run_cli_subprocess("check", str(path), "--set", "on_indivisible=replicate")
    assert r.returncode == 0, r.stderr
    assert "warning: params/blocks/mlp/wi_0: dim 2 ('mlp', size 100) is not divisible" in r.stderr


def test_check_device_mismatch(write, run_cli_subprocess, base_config):
    path = write(
        "run.yaml",
        base_config.replace("{data: 1, fsdp: -1, tensor: 1}", "{data: 3, fsdp: 2}").replace("devices: 8", "devices: 4"),
    )
    r = run_cli_subprocess("check", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {path}:8: mesh.shape: mesh {{data: 3, fsdp: 2}} needs 6 devices, but there are 4; "
        "change a size or use -1 for one axis"
    )


def test_missing_config_exit_2(tmp_path, run_cli_subprocess):
    r = run_cli_subprocess("check", str(tmp_path / "none.yaml"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {tmp_path / 'none.yaml'}: no such config file"
