"""A new user's first hour, with relative paths (the CLI's main, run in this process from the user's folder):
a train that would do nothing (or would continue another experiment's checkpoint) says so and exits 2, starting
over keeps the old run whole, a mesh axis no rule uses is refused, and the small things a first run trips over."""

import json

import pytest

RUN = """\
model: {name: gpt, vocab_size: 256, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh: {shape: {data: 1, fsdp: -1, tensor: 1}, devices: 4}
rules: fsdp
train: {steps: 2, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 0, eval_batches: 1}
checkpoint: {async: false}
"""


@pytest.mark.slow  # a training run and the CLI calls a user makes after it
def test_a_run_dir_keeps_one_experiment(tmp_path, run_cli_in_process, one_line_error, monkeypatch):
    """One training run (2 steps), then what a user tries next, in order (one test: the run is built once)."""
    (tmp_path / "run.yaml").write_text(RUN)
    monkeypatch.chdir(tmp_path)
    cli = run_cli_in_process
    r = cli("train", "run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    trained = (tmp_path, r)
    the_first_run_says_how_to_view_tensorboard(trained)
    a_run_with_nothing_to_train_exits_2_and_says_what_to_do(trained, cli, one_line_error)
    another_optimizer_is_another_experiment(trained, cli, one_line_error)
    a_mesh_axis_no_rule_uses_is_refused(trained, cli, one_line_error)
    starting_over_keeps_the_old_run_together(trained, cli)


def snapshot(run_dir):
    """Every file of a run, byte for byte, but its lock (the directory's, held by whichever job runs there now)."""
    files = (p for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock")
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in files}


def the_first_run_says_how_to_view_tensorboard(trained):
    _, r = trained
    hint, last = r.stdout.strip().splitlines()[-2:]
    assert last.startswith("done: step 2")  # the summary stays the last line
    assert hint.startswith("view the curves: ") and "tensorboard --logdir runs/run/tensorboard" in hint


def a_run_with_nothing_to_train_exits_2_and_says_what_to_do(trained, cli, one_line_error):
    d, _ = trained
    before = snapshot(d / "runs" / "run")
    line = one_line_error(cli("train", "run.yaml"))
    assert line.startswith("error: run.yaml:4: train.steps: the checkpoint in runs/run is already at step 2")
    assert "nothing to train" in line and "--set train.steps=4" in line
    assert "--no-resume" in line and "--set run_dir=runs/NAME" in line
    assert snapshot(d / "runs" / "run") == before  # nothing written, nothing moved


def another_optimizer_is_another_experiment(trained, cli, one_line_error):
    d, _ = trained
    before = snapshot(d / "runs" / "run")
    lr = ["--set", "train.steps=4", "--set", "optimizer.lr=0.001"]
    line = one_line_error(cli("train", "run.yaml", *lr))
    assert line == (
        "error: runs/run: the checkpoint at step 2 was trained with another optimizer (lr 0.003 -> 0.001), so this "
        "run is another experiment: give this run its own run_dir (--set run_dir=runs/NAME), or start over with "
        "--no-resume (the old run moves to runs/run/previous/); or --resume to continue the checkpoint with this config"
    )
    assert snapshot(d / "runs" / "run") == before
    # check is the pre-flight: it says the same, and with --resume what the continuation changes.
    assert one_line_error(cli("check", "run.yaml", *lr)) == line
    r = cli("check", "run.yaml", *lr, "--resume", "--set", "mesh.shape={data: 2, fsdp: -1}")
    assert r.returncode == 0, r.stderr
    assert (
        "resume: step 2 continues with another config: optimizer: lr 0.003 -> 0.001; layout: mesh "
        "{data: 1, fsdp: 4, tensor: 1} -> {data: 2, fsdp: 2} (the checkpoint is resharded as it is read)"
    ) in r.stdout
    # Another layout alone is a continuation (checkpoints restore onto any layout); so is a remat policy.
    r = cli("check", "run.yaml", "--set", "train.steps=4", "--set", "model.remat=full")
    assert r.returncode == 0 and "resume: train would continue from the checkpoint at step 2" in r.stdout, r.stderr


def a_mesh_axis_no_rule_uses_is_refused(trained, cli, one_line_error):
    d, _ = trained
    typo = ["--set", "mesh.shape.tensr=2", "--set", "run_dir=runs/typo"]
    want = (
        "error: run.yaml (--set mesh.shape.tensr=2): mesh.shape.tensr: no rule uses mesh axis 'tensr' (size 2): its "
        "2 devices would repeat the same work (rules fsdp use data, fsdp); did you mean 'tensor'? Otherwise give it "
        "size 1, or list it in mesh.unused_axes to keep it"
    )
    assert one_line_error(cli("check", "run.yaml", *typo)) == want
    assert one_line_error(cli("train", "run.yaml", *typo)) == want
    assert not (d / "runs" / "typo").exists()
    # Kept on purpose: named in mesh.unused_axes.
    r = cli("check", "run.yaml", *typo, "--set", "mesh.unused_axes=[tensr]")
    assert r.returncode == 0 and "'tensr': 2" in r.stdout, r.stderr


def starting_over_keeps_the_old_run_together(trained, cli):
    """--no-resume moves the whole previous run (history, curves, config, events, checkpoints) aside together."""
    d, _ = trained
    run_dir = d / "runs" / "run"
    old = snapshot(run_dir)
    r = cli("train", "run.yaml", "--no-resume", "--no-progress", "--set", "optimizer.lr=0.001")
    assert r.returncode == 0, r.stderr[-2000:]
    [aside] = (run_dir / "previous").iterdir()
    assert (
        f"run_dir: starting over: moved the previous run (config.yaml, metrics.jsonl, loss.png, tensorboard, "
        f"checkpoints) to runs/run/previous/{aside.name}" in r.stdout
    )
    assert snapshot(aside) == old  # byte for byte, checkpoints included
    new = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in new] == [1, 2] and new[-1]["lr"] < json.loads(old["metrics.jsonl"].splitlines()[-1])[
        "lr"
    ]
    assert len(list((run_dir / "tensorboard").iterdir())) == 1  # this run's events only
    assert "lr: 0.001" in (run_dir / "config.yaml").read_text()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]


def test_bare_partitioning_lists_the_commands(run_cli_in_process):
    r = run_cli_in_process()
    assert r.returncode == 0 and r.stderr == ""
    for cmd in ("check", "rules", "train", "plan", "compare", "tune", "ckpt", "config"):
        assert f"\n    {cmd} " in r.stdout
    r = run_cli_in_process("ckpt")
    assert r.returncode == 0 and "inspect" in r.stdout and "reshard" in r.stdout


@pytest.mark.parametrize(
    "cmd, says",
    [
        (["ckpt", "ls"], "list a run's checkpoints"),
        (["ckpt", "inspect"], "a checkpoint's arrays"),
        (["ckpt", "reshard"], "rewrite a checkpoint for another mesh"),
        (["rules", "explain"], "per parameter and dimension, the rule that claimed it"),
        (["config", "schema"], "print the JSON Schema of a run config"),
        (["config", "show"], "print a config fully resolved"),
    ],
)
def test_leaf_commands_help_says_what_they_do(cmd, says, capsys):
    from partitioning.cli import main

    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    usage, description = capsys.readouterr().out.split("\n\n")[:2]
    assert " ".join(description.split()).startswith(says)


def test_set_typos_get_a_hint(repo, run_cli_in_process, one_line_error, monkeypatch):
    monkeypatch.chdir(repo)
    line = one_line_error(run_cli_in_process("check", "configs/quickstart.yaml", "--set", "train.step=20"))
    assert line == (
        "error: configs/quickstart.yaml (--set train.step=20): train.step: expected a mapping, got int 20; "
        "did you mean 'steps'?"
    )
    line = one_line_error(
        run_cli_in_process("check", "configs/quickstart.yaml", "--set", "mesh.shape={data:2,tensor:-1}")
    )
    assert line == (
        "error: --set mesh.shape={data:2,tensor:-1}: 'data:2' reads as one key with no value: YAML needs a space "
        "after each colon, e.g. {data: 2, tensor: -1}"
    )


def test_simulate_devices_from_python_speaks_of_devices_not_a_config(repo):
    import subprocess
    import sys

    code = (
        "import jax, partitioning as pt\njax.devices()\n"
        "try:\n    pt.simulate_devices(8)\nexcept pt.MeshError as e:\n    print(e)\n"
        "try:\n    pt.make_mesh({'data': 1, 'fsdp': -1, 'tensor': 2})\nexcept pt.MeshError as e:\n    print(e)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    first, second = r.stdout.strip().splitlines()
    assert first == (
        "8 devices are needed but jax already started with 1: call simulate_devices(8) before any JAX computation "
        "(a fresh Python process), or set XLA_FLAGS=--xla_force_host_platform_device_count=8 before starting Python"
    )
    assert "config" not in first
    assert second.endswith(
        "the fixed axes need a multiple of 2 devices, but there are 1 (on a CPU, simulate devices: call "
        "partitioning.simulate_devices(8) before any JAX computation, or set "
        "XLA_FLAGS=--xla_force_host_platform_device_count=8 before starting Python)"
    )


def test_titles_name_the_rules_in_force(write, run_cli_in_process, small_config, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    cfg = write("small.yaml", small_config)
    sets = ["--set", "rules=fsdp_tp", "--set", "mesh.shape.tensor=2"]
    code, out, err = run_cli_in_process("rules", "explain", cfg, *sets)
    assert code == 0, err
    assert f"rules fsdp_tp ({cfg} (--set rules=fsdp_tp))" in out and f"rules from {cfg}" not in out
    code, out, err = run_cli_in_process("plan", cfg, *sets, "--no-compile", "--png", tmp_path / "p.png")
    assert code == 0, err
    assert f"rules fsdp_tp ({cfg} (--set rules=fsdp_tp))" in out
    assert f"wrote {tmp_path / 'p.png'}" in err and (tmp_path / "p.png").stat().st_size > 10_000


def test_the_tensorboard_hint_is_true(monkeypatch):
    from partitioning.train import trackers

    monkeypatch.setattr(trackers.shutil, "which", lambda name: None)
    assert trackers.tensorboard_hint("runs/x/tensorboard") == (
        "view the curves: pip install 'partitioning[tensorboard]', then tensorboard --logdir runs/x/tensorboard"
    )
    monkeypatch.setattr(trackers.shutil, "which", lambda name: "/usr/bin/tensorboard")
    assert trackers.tensorboard_hint("runs/x/tensorboard") == "view the curves: tensorboard --logdir runs/x/tensorboard"


def test_the_shipped_files_exist_and_declare_what_they_promise(repo):
    import tomllib

    assert (repo / "LICENSE").read_text().startswith("\n                                 Apache License")
    meta = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert any(d.startswith("tensorboard") for d in meta["optional-dependencies"]["tensorboard"])
    for f in ("configs/tp.yaml", "configs/my_rules.yaml", "examples/lm1b/lm1b.yaml", "examples/lm1b/models.py"):
        assert (repo / f).is_file(), f
