"""A host that dies: 2 processes x 4 devices train; process 1 is SIGKILLed mid-training. Process 0 stops
within the peer timeout with one line naming process 1 (no C++ crash dump), and `--resume` on both
continues from the last complete step with the losses of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from partitioning.checkpoint.disk import list_steps
from partitioning.peers import EXIT_PEER_DIED

CFG = """\
model: {name: gpt, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
optimizer: {lr: 0.003, warmup_steps: 0, schedule: constant}
train: {steps: 100000, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 0, eval_batches: 0, tracker: [jsonl]}
checkpoint: {every: 2, keep: 0}
"""


def _train(repo, cfg, run, *extra, process=None, port=None):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = [sys.executable, "-m", "partitioning", "train", str(cfg), "--no-progress", "--set", f"run_dir={run}", *extra]
    if process is not None:
        cmd += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(process)]
        cmd += ["--peer-timeout", "5"]
    return subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_a_killed_process_stops_the_other_with_one_line_and_both_resume(repo, tmp_path, free_port):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(CFG)
    run = tmp_path / "multi"
    port = free_port()
    procs = [_train(repo, cfg, run, process=i, port=port) for i in range(2)]
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            done = (
                [s.step for s in list_steps(run / "checkpoints") if s.complete]
                if (run / "checkpoints").is_dir()
                else []
            )
            if 4 in done:
                break
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.2)
        assert 4 in done, "no checkpoint of step 4 in time"
        os.kill(procs[1].pid, signal.SIGKILL)  # the host dies: no cleanup, no goodbye
        t0 = time.time()
        out, err = procs[0].communicate(timeout=60)
        took = time.time() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[0].returncode == EXIT_PEER_DIED, err[-3000:]
    assert took < 20  # the watch saw the closed connection at once; silence would take --peer-timeout (5 s)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("simulating", "[Gloo]"))]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"error: process 1 (pid {procs[1].pid} on host ")
    assert "died (its connection closed without a goodbye); stopping this process too; the last complete " in lines[0]
    assert lines[0].endswith("restart every process (with --resume to continue from the last complete checkpoint)")
    for noise in ("Check failure", "Terminating process", "Traceback", "coordination_service"):
        assert noise not in err
    last = max(s.step for s in list_steps(run / "checkpoints") if s.complete)
    assert last >= 4 and f"the last complete checkpoint is {run / 'checkpoints' / str(last)}" in lines[0]

    # Both processes resume from the last complete step; an uninterrupted single process runs beside them.
    steps = last + 2
    port = free_port()
    resumed = [
        _train(repo, cfg, run, "--resume", "--set", f"train.steps={steps}", process=i, port=port) for i in range(2)
    ]
    single = _train(repo, cfg, tmp_path / "single", "--set", f"train.steps={steps}")
    results = [p.communicate(timeout=300) for p in (*resumed, single)]
    for p, (_, e) in zip((*resumed, single), results, strict=True):
        assert p.returncode == 0, e[-3000:]
    assert f"checkpoint: resumed from step {last} " in results[0][0]
    multi, ref = _losses(run), _losses(tmp_path / "single")
    assert sorted(multi) == list(range(1, steps + 1)) == sorted(ref)
    np.testing.assert_allclose([multi[k] for k in sorted(ref)], [ref[k] for k in sorted(ref)], rtol=2e-5)
