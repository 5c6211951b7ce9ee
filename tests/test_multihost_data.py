"""Data through grain on 2 processes x 4 CPU devices: a run trained from a pre-tokenized .npy file is
SIGKILLed after a checkpoint and resumed, and sees exactly the batches an uninterrupted run sees (here
one process with all 8 devices, so the process count changes too) — the batches the pure function of
(seed, step) gives in a single process with no mesh at all."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from partitioning.checkpoint import checkpoint_metadata
from partitioning.checkpoint.disk import list_steps
from partitioning.data.corpus import load_corpus
from partitioning.data.order import batch_digest

CONFIG = """\
model: {name: mlp, vocab_size: 64, embed: 32, mlp: 64, layers: 1}
mesh:
  shape: {data: 1, fsdp: -1}
  devices: 8
rules: fsdp
optimizer: {lr: 0.003, warmup_steps: 0, schedule: constant}
data: {path: tokens.npy, seed: 7, log_batches: true}
train: {steps: 10, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 5, eval_batches: 1}
checkpoint: {every: 3}
"""
STEPS, KILL_AFTER, SAVED = 10, 7, 6  # frozen after step 7: the last checkpoint is step 6


def _launch(repo, cwd, run, log, port, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(repo), **(env_extra or {}))
    procs = []
    for i in range(2):
        # The child gets its own copy of the file descriptor: ours can close as soon as it started.
        with open(cwd / f"{log}.{i}.out", "w") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(repo / "tests/multihost/train_worker.py"),
                        "run.yaml",
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
                    cwd=cwd,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
    return procs


def _finish(procs, cwd, log, timeout=300):
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = [(cwd / f"{log}.{i}.out").read_text() for i in range(2)]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return outs


def _digests(run: Path, processes: int = 2) -> dict[int, dict[str, int]]:
    """step -> {row key: crc} joined over the processes; every record of a step must agree."""
    by_step: dict[int, dict[str, int]] = {}
    for i in range(processes):
        for line in (run / f"batches.{i}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert rec["process"] == i
            rows = by_step.setdefault(rec["step"], {})
            for key, crc in rec["rows"].items():
                assert rows.setdefault(key, crc) == crc, f"step {rec['step']} {key}: two different batches"
    return by_step


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_killed_and_resumed_run_sees_the_batches_of_an_uninterrupted_run(
    repo, tmp_path, free_port, monkeypatch, run_cli_in_process
):
    np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 64, 20_000).astype(np.uint16))
    (tmp_path / "run.yaml").write_text(CONFIG)

    # The uninterrupted run: this process, all 8 devices.
    monkeypatch.chdir(tmp_path)
    full = tmp_path / "full"
    r = run_cli_in_process("train", "run.yaml", "--no-progress", "--set", f"run_dir={full}")
    assert r.returncode == 0, r.stderr

    # The same run, frozen after step 7 (checkpoint 6 on disk, step 7 trained but unsaved), then SIGKILLed.
    run = tmp_path / "killed"
    flag = tmp_path / "paused"
    procs = _launch(
        repo, tmp_path, run, "killed", free_port(), {"PAUSE_AFTER": str(KILL_AFTER), "PAUSE_FLAG": str(flag)}
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not all(Path(f"{flag}.{i}").exists() for i in range(2)):
            assert all(p.poll() is None for p in procs), (tmp_path / "killed.0.out").read_text()[-3000:]
            time.sleep(0.2)
        assert all(Path(f"{flag}.{i}").exists() for i in range(2)), "the run never reached the kill point"
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
    # The second may see its peer die first: the dead-peer watch stops it with exit status 75 (a SIGKILL
    # of one process of a job is the case it exists for).
    assert procs[0].returncode == -signal.SIGKILL and procs[1].returncode in (-signal.SIGKILL, 75)
    assert max(s.step for s in list_steps(run / "checkpoints") if s.complete) == SAVED
    assert max(_digests(run)) == KILL_AFTER - 1  # it had taken the batch of step 7 (index 6)

    outs = _finish(_launch(repo, tmp_path, run, "resumed", free_port()), tmp_path, "resumed")
    assert f"checkpoint: resumed from step {SAVED}" in outs[0]
    assert outs[0].strip().splitlines()[-1].startswith(f"done: step {STEPS}")

    # Exactly the uninterrupted run's batches, step by step, row by row...
    seen, reference = _digests(run), _digests(full, processes=1)
    assert sorted(seen) == sorted(reference) == list(range(STEPS))
    for step in range(STEPS):
        assert len(seen[step]) == 16 and seen[step] == reference[step], step
    # ... which are the pure function of (seed, step): one process, no mesh.
    expected = load_corpus(str(tmp_path / "tokens.npy")).batches("train", 8, 16, seed=7)
    for step in range(STEPS):
        assert seen[step] == batch_digest(expected.batch_at(step)), step
    # The same batches make the same losses, and the checkpoint says where the data stood.
    np.testing.assert_allclose(_losses(run), _losses(full), rtol=2e-5)
    assert len(_losses(run)) == STEPS
    meta = checkpoint_metadata(run / "checkpoints", SAVED)
    assert meta["step"] == SAVED and meta["data"]["position"] == "step" and meta["data"]["seed"] == 7
