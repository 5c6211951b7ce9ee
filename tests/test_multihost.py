"""Multi-host: 2 local processes x 4 CPU devices (jax.distributed + gloo) train the
same model as 1 process x 8 devices, with the same losses, and write an orbax
checkpoint through the multi-host path that a single process restores."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.checkpoint import abstract_target
from partitioning.checkpoint import restore_checkpoint as restore
from tests.multihost.common import STEPS, losses_and_checkpoint, make_trainer


@pytest.mark.slow
def test_two_processes_match_one_and_checkpoint_restores(repo, tmp_path, free_port):
    port = str(free_port())
    env = dict(os.environ, PYTHONPATH=str(repo))
    procs = [
        subprocess.Popen(
            [sys.executable, "tests/multihost/worker.py", str(i), "2", port, str(tmp_path)],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            [q.kill() for q in procs]
            pytest.fail("multi-process run timed out")
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "losses.json").read_text())
    assert result["process_count"] == 2 and result["device_count"] == 8 and result["local"] == 4

    # The same run in this one process over 8 local devices.
    reference = losses_and_checkpoint(None)
    assert len(result["losses"]) == STEPS
    np.testing.assert_allclose(result["losses"], reference, rtol=2e-5)
    assert reference[-1] < reference[0]

    # The checkpoint both processes wrote restores here, onto a different layout.
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    trainer = make_trainer(pt.make_mesh({"data": 1, "fsdp": -1}))
    tp_trainer = type(trainer)(trainer.model, trainer.tx, mesh, "fsdp_tp", batch_size=8, seq_len=32)
    target = abstract_target(tp_trainer.abstract_state, shardings=tp_trainer.state_shardings)
    state = restore(tmp_path / "ckpt", target)
    assert int(state.step) == STEPS
    wi = state.params["blocks"]["mlp"]["wi_0"]
    assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert np.isfinite(np.asarray(wi)).all()


TRAIN_CFG = """\
model: {name: gpt, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh:
  shape: {data: 1, fsdp: -1}
  devices: 8
rules: fsdp
optimizer: {lr: 0.003, warmup_steps: 0, schedule: constant}
train: {steps: 4, batch_size: 8, seq_len: 32, log_every: 1, eval_every: 4, eval_batches: 1}
checkpoint: {every: 2}
"""


@pytest.mark.slow
def test_train_cli_on_two_processes_matches_one(repo, tmp_path, free_port):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TRAIN_CFG)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the CLI sets devices itself
    port = str(free_port())
    cmd = [sys.executable, "-m", "partitioning", "train", str(cfg), "--no-progress"]
    procs = [
        subprocess.Popen(
            cmd
            + [
                "--set",
                f"run_dir={tmp_path / 'multi'}",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    single = subprocess.run(
        cmd + ["--set", f"run_dir={tmp_path / 'single'}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            [q.kill() for q in procs]
            pytest.fail("multi-process train timed out")
    assert single.returncode == 0, single.stderr[-2000:]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    # Process 0 prints and writes; process 1 stays quiet.
    assert outs[0][0].strip().splitlines()[-1].startswith("done: step 4")
    assert "done:" not in outs[1][0]

    def losses(run):
        return [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert len(losses("multi")) == 4
    np.testing.assert_allclose(losses("multi"), losses("single"), rtol=2e-5)
    steps = sorted(int(p.name) for p in (tmp_path / "multi" / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [2, 4]


def test_partial_multihost_flags_are_one_line_errors(repo, tmp_path, run_cli_subprocess):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TRAIN_CFG)
    r = run_cli_subprocess("train", str(cfg), "--coordinator", "127.0.0.1:1", cwd=repo)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: multi-host needs all of --coordinator HOST:PORT, --num-processes N and --process-id I "
        "(or only --distributed on a cluster jax detects by itself)"
    )


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_the_same_step(repo, tmp_path, free_port):
    """Preemption rarely reaches every host at the same instant: the processes
    agree at the next logging step, stop together, save, and exit 143."""
    import signal
    import time

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        TRAIN_CFG.replace("steps: 4", "steps: 100000")
        .replace("log_every: 1", "log_every: 2")
        .replace("eval_every: 4", "eval_every: 1000000")
    )
    run = tmp_path / "multi"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "partitioning",
                "train",
                str(cfg),
                "--no-progress",
                "--set",
                f"run_dir={run}",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.time() + 240
        metrics = run / "metrics.jsonl"
        while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            time.sleep(0.2)
        assert metrics.exists(), "training never logged"
        procs[1].send_signal(signal.SIGTERM)  # only the second host is told
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [143, 143], [o[1][-2000:] for o in outs]
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    assert last % 2 == 0  # stopped at a logging step
    assert outs[0][0].strip().splitlines()[-1].startswith(f"preempted: step {last}")
    steps = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert max(steps) == last  # saved at the stop step (also every 2 steps before it)
