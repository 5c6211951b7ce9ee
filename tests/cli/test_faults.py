"""`partitioning train` meeting the faults of a shared cluster: two jobs on one run directory (a real
lock-holding process), a diverging run (NaN loss), and the closing summary's numbers."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from partitioning.checkpoint.disk import list_steps

TINY = """\
model: {name: gpt, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
optimizer: {lr: 0.003, warmup_steps: 0, schedule: constant}
train: {steps: 4, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 2, eval_batches: 1, tracker: [jsonl]}
checkpoint: {every: 2}
run_dir: run
"""

HOLDER = """\
import sys, time
from partitioning.train.lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
print("HELD", flush=True)
time.sleep(600)
"""


def tree(root: Path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(TINY)
    return tmp_path


@pytest.fixture
def holder(repo):
    """holder(dir): a real process that takes DIR's run lock and sleeps; returns the Popen (killed at the end)."""
    procs = []

    def _start(directory) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(repo))
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True, env=env)
        procs.append(p)
        assert p.stdout.readline().strip() == "HELD"
        return p

    yield _start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_job_is_refused_naming_the_holder_and_a_dead_holder_frees_the_lock(
    in_tmp, holder, run_cli_in_process, one_line_error
):
    import socket

    p = holder("run")
    before = tree(Path("run"))
    error = one_line_error(run_cli_in_process("train", "run.yaml", "--no-progress"))
    assert error.startswith(f"error: run: run directory in use by pid {p.pid} on host {socket.gethostname()} since ")
    assert error.endswith("(run/.lock); wait for that job to end or stop it, or use another run_dir")
    assert tree(Path("run")) == before  # refused before anything was written
    # The holder dies (SIGKILL: no cleanup of its own): the kernel frees the lock and the next job runs.
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = run_cli_in_process("train", "run.yaml", "--no-progress", "--set", "train.steps=2")
    assert r.returncode == 0, r.stderr
    assert json.loads(Path("run/.lock").read_text())["pid"] == os.getpid()  # the last holder, kept for the record
    assert [s.step for s in list_steps("run") if s.complete] == [2]


def test_read_commands_work_beside_a_running_job(saved_run, holder, run_cli_in_process):
    _, root = saved_run
    holder(root)
    assert run_cli_in_process("ckpt", "ls", root).returncode == 0
    r = run_cli_in_process("ckpt", "inspect", root)
    assert r.returncode == 0 and r.stdout.splitlines()[0].endswith("files: OK")


def test_a_diverging_run_stops_at_once_saves_nothing_and_names_the_last_good_checkpoint(
    in_tmp, run_cli_in_process, one_line_error
):
    # A sane first stretch saves step 2; then a huge learning rate sends the loss to NaN.
    r = run_cli_in_process("train", "run.yaml", "--no-progress", "--set", "train.steps=2")
    assert r.returncode == 0, r.stderr
    # --resume: a changed optimizer is another experiment unless the run says it continues the checkpoint.
    r = run_cli_in_process(
        "train",
        "run.yaml",
        "--no-progress",
        "--resume",
        "--set",
        "optimizer.lr=1e4",
        "--set",
        "train.steps=40",
        "--set",
        "train.log_every=10",
        "--set",
        "checkpoint.every=5",
    )
    error = one_line_error(r)
    first = int(error.split("training diverged at step ")[1].split()[0])
    saved = [s.step for s in list_steps("run")]
    assert saved[0] == 2 and all(k < first for k in saved)  # no NaN state saved, the good ones kept
    assert error.endswith(
        "the loss or gradient norm is not finite; stopped without saving (train.on_nonfinite: stop); "
        f"last good checkpoint: run/checkpoints/{saved[-1]} (step {saved[-1]}); lower optimizer.lr, or set "
        "train.on_nonfinite: skip_step to drop such steps"
    )
    recs = [json.loads(line) for line in Path("run/metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["loss"] is None and recs[-1]["step"] - first < 5  # stopped at the next sync point
    assert "done:" not in r.stdout


def test_the_closing_summary_repeats_the_last_logged_numbers():
    from partitioning.cli.faults import closing_summary

    # A NaN eval (logged as null) is nan here, not the last finite eval loss.
    recs = [{"step": 50, "loss": 2.0, "eval_loss": 2152.0}, {"step": 60, "loss": None, "eval_loss": None}]
    assert closing_summary("done", recs) == "done: step 60, loss nan, eval_loss nan"
    recs = [{"step": 5, "loss": 2.5, "eval_loss": 3.0}, {"step": 10, "loss": 2.25, "skipped_steps": 3.0}]
    assert (
        closing_summary("done", recs)
        == "done: step 10, loss 2.250, eval_loss 3.000 (step 5), 3 non-finite steps skipped"
    )
