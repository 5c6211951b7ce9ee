"""`partitioning check` and `partitioning rules explain`, in real subprocesses."""

import os
import subprocess
import sys

import pytest

from tests.test_config import BASE


def run_cli(*args, cwd=None, devices=None):
    env = dict(os.environ)
    # The CLI decides the device count itself; don't inherit the test's.
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run([sys.executable, "-m", "partitioning", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_check_ok_simulates_devices(repo):
    r = run_cli("check", "configs/quickstart.yaml", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "simulating 8 CPU devices" in r.stderr
    assert r.stdout.startswith("OK: configs/quickstart.yaml: model gpt (")
    assert "on mesh {'data': 1, 'fsdp': 8, 'tensor': 1} (8 devices)" in r.stdout


def test_check_devices_flag(write):
    path = write("run.yaml", BASE)
    r = run_cli("check", str(path), "--devices", "16")
    assert r.returncode == 0, r.stderr
    assert "on mesh {'data': 1, 'fsdp': 16, 'tensor': 1} (16 devices)" in r.stdout


def test_check_bad_rule_one_line_exit_2(write):
    path = write("run.yaml", BASE.replace("rules: fsdp", "rules:\n  - [batch, data]\n  - [mlp, tensr]\n"))
    r = run_cli("check", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {path}:12: rules[1]: mesh axis 'tensr' is not a mesh axis (data, fsdp, tensor); did you mean 'tensor'?"
    ]
    assert "Traceback" not in r.stderr


def test_check_indivisible(write):
    path = write("run.yaml", BASE.replace("mlp: 128", "mlp: 100").replace("heads: 4", "heads: 8").replace("rules: fsdp", "rules: fsdp_tp")
                 .replace("{data: 1, fsdp: -1, tensor: 1}", "{data: 1, fsdp: -1, tensor: 8}"))
    r = run_cli("check", str(path))
    assert r.returncode == 2
    assert "error: params/blocks/mlp/wi_0: dim 2 ('mlp', size 100) is not divisible by mesh axes ('tensor',) of size 8" in r.stderr
    r = run_cli("check", str(path), "--set", "on_indivisible=replicate")
    assert r.returncode == 0, r.stderr
    assert "warning: params/blocks/mlp/wi_0: dim 2 ('mlp', size 100) is not divisible" in r.stderr


def test_check_device_mismatch(write):
    path = write("run.yaml", BASE.replace("{data: 1, fsdp: -1, tensor: 1}", "{data: 3, fsdp: 2}").replace("devices: 8", "devices: 4"))
    r = run_cli("check", str(path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "error: mesh {data: 3, fsdp: 2} needs 6 devices, but there are 4; change a size or use -1 for one axis"


def test_missing_config_exit_2(tmp_path):
    r = run_cli("check", str(tmp_path / "none.yaml"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {tmp_path / 'none.yaml'}: no such config file"


def test_rules_explain(repo):
    r = run_cli("rules", "explain", "configs/quickstart.yaml", cwd=repo)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "params/blocks/mlp/wi_0" in out
    assert "rule 1 ['embed', 'fsdp']" in out
    assert "skipped rule 3 ('mlp', 'fsdp'): mesh axis 'fsdp' already used by dim 1" in out
    assert "logical names no rule mentions (unsharded): heads, kv, kv_heads, layers" in out


def test_rules_explain_reports_rules_that_never_fire(write):
    path = write("run.yaml", BASE.replace("rules: fsdp", "rules:\n  - [embed, fsdp]\n  - [expert, tensor]\n"))
    r = run_cli("rules", "explain", str(path))
    assert r.returncode == 0, r.stderr
    assert "rules that never fire on this model: rule 1 ['expert', 'tensor']" in r.stdout


@pytest.mark.parametrize("argv", [["nope"], ["check"]])
def test_usage_errors_exit_2(argv):
    r = run_cli(*argv)
    assert r.returncode == 2
    assert "usage: partitioning" in r.stderr
