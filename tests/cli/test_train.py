"""`partitioning train` (partitioning.cli.train): run-dir outputs, one-line errors, clean stops on
Ctrl-C / SIGTERM, checkpoints saved and resumed."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from partitioning.checkpoint import checkpoint_metadata
from partitioning.checkpoint.disk import list_steps
from partitioning.config import load_config
from partitioning.yamlfile import parse_yaml

TINY = """\
model: {name: gpt, embed: 32, heads: 4, mlp: 64, layers: 2}
mesh:
  shape: {data: 1, fsdp: -1, tensor: 1}
  devices: 8
rules: fsdp
optimizer: {name: adamw, lr: 0.01, warmup_steps: 2}
train: {steps: 6, batch_size: 8, seq_len: 32, log_every: 2, eval_every: 3, eval_batches: 1}
run_dir: RUN_DIR
"""


KEYS = {"step", "loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "accuracy", "tflops_per_device"}


def tiny(write, tmp_path, **replace):
    text = TINY.replace("RUN_DIR", str(tmp_path / "run"))
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return write("run.yaml", text)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_writes_metrics_config_and_plot(write, tmp_path, run_cli_in_process):
    path = tiny(write, tmp_path)
    result = run_cli_in_process("train", str(path), "--no-progress", "--set", "data.seed=3")
    assert result.returncode == 0
    out = result.stdout
    run = tmp_path / "run"
    recs = records(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 6]  # first, every 2nd, eval steps, last
    for r in recs:
        assert set(r) >= KEYS, r
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["grad_norm"] > 0
    assert [r["step"] for r in recs if "eval_loss" in r] == [1, 3, 6]
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.5
    assert recs[0]["lr"] == pytest.approx(0.005) and recs[1]["lr"] == pytest.approx(0.01)
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = parse_yaml((run / "config.yaml").read_text())[0]
    assert saved["data"]["seed"] == 3  # the resolved config, overrides applied
    # Every default, mesh sizes resolved, the rule table written out: it reproduces the run by itself.
    assert saved["optimizer"]["b2"] == 0.95 and saved["checkpoint"]["keep"] == 3
    assert -1 not in saved["mesh"]["shape"].values() and saved["rules"]["extra"][0] == ["batch", ["data", "fsdp"]]
    assert saved["rules"]["follows"] == "activations"
    again = load_config(run / "config.yaml")
    # grad_accum: auto recorded as the count the run used (1: one pass fits)
    assert again.train == load_config(path, ["data.seed=3", "train.grad_accum=1"]).train and list(again.rules) == list(
        load_config(path).rules
    )
    assert out.splitlines()[0].startswith("train: gpt (")
    assert "on mesh {'data': 1, 'fsdp': 8, 'tensor': 1} with 12 rules" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"done: step 6, loss {recs[-1]['loss']:.3f}, eval_loss {recs[-1]['eval_loss']:.3f}")
    assert recs[0]["tokens_per_s"] == pytest.approx(8 * 32 / recs[0]["step_time_s"])  # tokens, not examples
    assert all("mfu" not in r for r in recs)  # no peak on a CPU
    # Off a terminal: one plain line per logged step (no \r frames), each with TFLOP/s per device.
    assert "\r" not in out
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/6", "2/6", "3/6", "4/6", "6/6"]
    assert all(
        f"loss {r['loss']:.4g}" in line and "TFLOP/s/device" in line for line, r in zip(lines, recs, strict=True)
    )
    flops_line = next(line for line in out.splitlines() if line.startswith("flops: "))
    assert "compiled step" in flops_line and "6·N·tokens" in flops_line and "no MFU" in flops_line
    # TensorBoard's own reader finds the logged values at the logged steps.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    for tag, key in (
        ("train/loss", "loss"),
        ("eval/loss", "eval_loss"),
        ("train/lr", "lr"),
        ("perf/tflops_per_device", "tflops_per_device"),
    ):
        got = {e.step: e.value for e in events.Scalars(tag)}
        assert got == pytest.approx({r["step"]: r[key] for r in recs if key in r}, rel=1e-6), tag


@pytest.mark.parametrize(
    "replace,message",
    [
        (
            {"name: adamw": "name: adamx"},
            "{path}:6: optimizer.name: must be one of adamw, adafactor, sgd, got 'adamx'; did you mean 'adamw'?",
        ),
        (
            {"batch_size: 8": "batch_size: 12"},
            "{path}:7: train.batch_size: batch_size 12 is not divisible by the batch mesh axes ('data', 'fsdp') "
            "of size 8; use a multiple of 8",
        ),
        (
            {"batch_size: 8": "batch_size: 8, grad_accum: 3"},
            "{path}:7: train.grad_accum: batch_size 8 must be a positive multiple of grad_accum 3",
        ),
        (
            {"rules: fsdp": "rules: fsdp\ndata: {path: /no/such/dir}"},
            "{path}:6: data.path: '/no/such/dir': no such file or folder",
        ),
        (
            {"layers: 2}": "layers: 2, vocab_size: 128}"},
            "{path}:1: model.vocab_size: the data is bytes, so vocab_size must be >= 256, got 128",
        ),
        ({"steps: 6": "steps: 0"}, "{path}:7: train.steps: must be >= 1, got 0"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(write, tmp_path, replace, message, run_cli_in_process):
    path = tiny(write, tmp_path, **replace)
    result = run_cli_in_process("train", str(path), "--no-progress")
    assert result.returncode == 2
    err = result.stderr.strip().splitlines()
    assert err[-1] == "error: " + message.format(path=path)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_sigterm_stops_after_the_current_step_as_preempted(write, tmp_path, monkeypatch, run_cli_in_process):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    from partitioning.cli import train as train_cli

    class Preempt:  # the cluster sends SIGTERM during step 2
        def on_step_end(self, step, state, metrics):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    seen = []

    class Exit:
        def on_exit(self, state, reason):
            seen.append((int(state.step), reason))

    real_fit = train_cli.fit
    monkeypatch.setattr(
        train_cli, "fit", lambda *a, hooks=(), **kw: real_fit(*a, hooks=[Preempt(), *hooks, Exit()], **kw)
    )
    path = tiny(
        write, tmp_path, **{"name: gpt, embed: 32, heads: 4, mlp: 64, layers: 2": "name: mlp, embed: 32, mlp: 64"}
    )
    result = run_cli_in_process("train", str(path), "--no-progress")
    assert result.returncode == 143
    assert seen == [(2, "preempted")]
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2]  # the stop step is logged too
    assert result.stdout.strip().splitlines()[-1].startswith("preempted: step 2")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_ctrl_c_stops_cleanly_in_a_real_process(repo, tmp_path):
    """The real entry point: simulated devices notice, Ctrl-C after the first log, outputs written."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the CLI sets devices itself
    run = tmp_path / "run"
    sets = [
        "model.embed=32",
        "model.mlp=64",
        "model.layers=1",
        "train.steps=100000",
        "train.batch_size=8",
        "train.seq_len=32",
        "train.log_every=1",
        "train.eval_batches=0",
        f"run_dir={run}",
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "partitioning",
            "train",
            "configs/quickstart.yaml",
            "--no-progress",
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().count("\n") >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[0] == "simulating 8 CPU devices"
    assert "Traceback" not in err
    last = out.strip().splitlines()[-1]
    assert last.startswith("interrupted: step "), out
    steps = [r["step"] for r in records(run)]
    assert steps[-1] == int(last.split()[2].rstrip(",")) and 2 <= steps[-1] < 1000
    assert (run / "loss.png").exists() and (run / "config.yaml").exists()


def test_rerun_of_a_finished_run_says_so(write, tmp_path, run_cli_in_process):
    path = tiny(
        write,
        tmp_path,
        **{
            "name: gpt, embed: 32, heads: 4, mlp: 64, layers: 2": "name: mlp, embed: 32, mlp: 64",
            "steps: 6": "steps: 2",
        },
    )
    assert run_cli_in_process("train", str(path), "--no-progress").returncode == 0
    result = run_cli_in_process("train", str(path), "--no-progress")
    # Nothing was done, so it does not pass for success: one line, exit 2, what to do.
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {path}:") and "already at step 2 (train.steps is 2): nothing to train" in (
        result.stderr
    )
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2]  # nothing trained twice


def test_devices_flag_sets_the_mesh(write, tmp_path, run_cli_in_process):
    path = tiny(
        write,
        tmp_path,
        **{
            "name: gpt, embed: 32, heads: 4, mlp: 64, layers: 2": "name: mlp, embed: 32, mlp: 64",
            "steps: 6": "steps: 1",
        },
    )
    result = run_cli_in_process("train", str(path), "--no-progress", "--devices", "4")
    assert result.returncode == 0
    assert "on mesh {'data': 1, 'fsdp': 4, 'tensor': 1}" in result.stdout


# -- checkpoints in a run ---------------------------------------------------------------------------


@pytest.fixture
def ckpt_train_config(ckpt_model_yaml):
    """A run config of the checkpoint tests' GPT that checkpoints every 3 steps (no run_dir yet)."""
    return (
        ckpt_model_yaml.replace("vocab_size: 64", "vocab_size: 256")
        + """mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {steps: 6, batch_size: 8, seq_len: 16, log_every: 3, eval_every: 3, eval_batches: 1}
checkpoint: {every: 3, keep: 2}
optimizer: {schedule: constant, warmup_steps: 0}   # lr independent of train.steps, so 6 + 3 == 9
"""
    )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see tests/checkpoint
@pytest.mark.slow
def test_train_saves_resumes_and_continues(tmp_path, run_cli_subprocess, ckpt_train_config):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(ckpt_train_config + f"run_dir: {tmp_path / 'run'}\n")
    r = run_cli_subprocess("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr
    ckdir = tmp_path / "run" / "checkpoints"
    assert [s.step for s in list_steps(ckdir)] == [3, 6]
    meta = checkpoint_metadata(ckdir)
    assert meta["model"] == "gpt" and meta["config"]["checkpoint"] == {"every": 3, "keep": 2}
    assert meta["metrics"]["eval_loss"] > 0 and meta["arrays"]["params/embedding"]["names"] == ["vocab", "embed"]
    r = run_cli_subprocess("train", cfg, "--no-progress", "--set", "train.steps=9")
    assert r.returncode == 0, r.stderr
    assert f"checkpoint: resumed from step 6 ({ckdir})" in r.stdout
    assert [s.step for s in list_steps(ckdir)] == [6, 9]
    resumed = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in resumed] == [1, 3, 6, 7, 9]
    # The same loss curve (data order included) as a run that was never interrupted.
    cfg2 = tmp_path / "whole.yaml"
    cfg2.write_text(
        ckpt_train_config.replace("steps: 6", "steps: 9").replace("log_every: 3", "log_every: 1")
        + f"run_dir: {tmp_path / 'whole'}\n"
    )
    assert run_cli_subprocess("train", cfg2, "--no-progress").returncode == 0
    whole = {m["step"]: m for m in map(json.loads, (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines())}
    for m in resumed:
        assert m["loss"] == pytest.approx(whole[m["step"]]["loss"], rel=1e-6), m["step"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see tests/checkpoint
@pytest.mark.slow
def test_sigterm_saves_before_exiting(tmp_path, ckpt_train_config, repo):
    """Preemption: SIGTERM stops after the current step, which is checkpointed before exit."""
    import signal
    import time

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        ckpt_train_config.replace("steps: 6", "steps: 100000")
        .replace("log_every: 3", "log_every: 1")
        .replace("every: 3", "every: 0")
        + f"run_dir: {tmp_path / 'run'}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "partitioning", "train", str(cfg), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=env,
    )
    log = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    last = json.loads(log.read_text().splitlines()[-1])["step"]
    steps = [s.step for s in list_steps(tmp_path / "run" / "checkpoints")]
    assert steps == [last] and last >= 3
    assert f"checkpoint: saved step {last} to {tmp_path / 'run' / 'checkpoints'} (preempted)" in out


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see tests/checkpoint
def test_train_resume_flag_without_checkpoint(tmp_path, run_cli_subprocess, one_line_error, ckpt_train_config):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(ckpt_train_config + f"run_dir: {tmp_path / 'run'}\n")
    r = run_cli_subprocess("train", cfg, "--no-progress", "--resume")
    assert one_line_error(r) == f"error: --resume: no complete checkpoint in {tmp_path / 'run' / 'checkpoints'}"
    r = run_cli_subprocess("train", cfg, "--resume", "--no-resume")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
