"""`train.offload` from the command line: plan shows device and host bytes apart, check refuses a host share that
does not fit (one line, at the key to change), and bad values are config errors at their file:line."""

import json

import pytest

from partitioning.config.load import load_config

OFFLOAD = "train:\n  batch_size: 8\n  seq_len: 16\n  offload: [optimizer]\n"


@pytest.fixture
def config(write, small_config, tmp_path):
    text = small_config.replace("train:\n  batch_size: 8\n  seq_len: 16\n", OFFLOAD)
    return write("run.yaml", text.replace("vocab_size: 64", "vocab_size: 256"))  # the data is bytes


def test_plan_shows_device_and_host_bytes(config, tmp_path, run_cli_in_process):
    r = run_cli_in_process("plan", str(config), "--json", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "p.json").read_text())
    t = j["totals"]
    params, opt = t["params"]["per_device"], t["optimizer"]["per_device"]
    assert j["offload"] == {"state": ["optimizer"], "update": "device"}
    # The passes hold params and gradients; the update brings the optimizer state to the device; the host keeps it.
    kinds = j["memory_kinds"]
    assert kinds["device"] == {"per_device": 2 * params + opt, "passes": 2 * params, "update": 2 * params + opt}
    assert j["memory_kinds"]["host"] == {"per_device": opt}
    wi = next(row for row in j["leaves"] if row["path"] == "params/wi_0")
    assert wi["memory_kind"] == "device" and wi["host_bytes"] == 2 * wi["per_device_bytes"]  # adam's mu and nu
    assert wi["device_bytes"] == 2 * wi["per_device_bytes"]  # the param and its gradient
    mem = j["compiled"]["memory"]  # XLA's: the optimizer state's buffers are host memory, in place
    assert mem["host"] == mem["host_argument"] == mem["host_output"] == mem["host_alias"] == opt
    assert j["host_memory"]["per_device"] == opt and j["host_memory"]["devices"] == 8
    assert (
        "offload optimizer: device " in r.stdout and "(the update brings the optimizer state to the device)" in r.stdout
    )
    assert "XLA host memory per device: host_argument " in r.stdout
    assert f"memory: host: {_b(8 * opt)} per process ({_b(opt)} per device x 8 devices, compiled), budget " in r.stdout


def _b(n):
    from partitioning.fmt import fmt_bytes

    return fmt_bytes(n)


NEEDS = "the offloaded state needs 384.12 KiB of host memory per process (48.02 KiB per device x 8 devices, analytic)"
FIX = "offload less (train.offload), spread the state over more devices (fsdp), or raise mesh.host_memory"


def test_check_refuses_a_host_share_that_does_not_fit(config, run_cli_in_process, one_line_error):
    line = one_line_error(run_cli_in_process("check", str(config), "--set", "mesh.host_memory=64KiB"))
    where = f"{config} (--set mesh.host_memory=64KiB): mesh.host_memory"
    assert line == f"error: {where}: {NEEDS}, more than the 64.00 KiB there is; {FIX}"


def test_without_a_budget_the_machine_s_ram_is_the_host_s(config, run_cli_in_process, one_line_error, monkeypatch):
    monkeypatch.setattr("partitioning.plan.budget.host_memory", lambda: 2**16)
    line = one_line_error(run_cli_in_process("check", str(config)))
    assert line == f"error: {config}:14: train.offload: {NEEDS}, more than the 64.00 KiB there is; {FIX}"
    monkeypatch.setattr("partitioning.plan.budget.host_memory", lambda: 2**30)
    r = run_cli_in_process("check", str(config))
    assert r.returncode == 0, r.stderr
    assert "memory: host: 384.12 KiB per process (48.02 KiB per device x 8 devices, analytic), budget 1.00 GiB" in (
        r.stdout
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "[optimiser]",
            "train.offload[0]: must be one of optimizer, params, got 'optimiser'; did you mean 'optimizer'?",
        ),
        ("optimizer", "train.offload: expected a list, got str 'optimizer'"),
    ],
)
def test_bad_offload_values_are_config_errors(config, value, expected):
    import partitioning as pt

    with pytest.raises(pt.ConfigError) as e:
        load_config(str(config), [f"train.offload={value}"])
    assert str(e.value) == f"{config} (--set train.offload={value}): {expected}"
