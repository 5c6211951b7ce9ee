"""Node-aware meshes on real processes: local processes act as nodes (each with a few CPU devices).

Two launches, each checked for several things:

- ``srun partitioning train CONFIG --distributed``: 2 processes started with the variables srun sets (the
  ones jax's SLURM detection reads); the mesh's `data` axis spans the two nodes, `fsdp` stays inside each;
  the losses equal one process's on the same mesh shape.
- a Kubernetes JobSet's launch (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID): 4 processes x 2
  devices join with ``pt.initialize_distributed()``; each fsdp group's devices live on one process (from
  ``device.process_index``), factors of two axes span nodes, a split that does not match the processes is
  refused in one line (Python and config), and the losses equal one process's.
"""

import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest

import partitioning as pt
from tests.multihost.common import STEPS, losses_on

NODES_CFG = """\
model: {name: gpt, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh:
  shape: {fsdp: 4, data: 2}
  nodes: {data: 2}
  devices: 8
rules: fsdp
optimizer: {lr: 0.003, warmup_steps: 0, schedule: constant}
train: {steps: 3, batch_size: 8, seq_len: 32, log_every: 1, eval_every: 3, eval_batches: 1}
checkpoint: {every: 3}
"""


def _clean_env() -> dict[str, str]:
    """The tests' environment without their device flags and without any launcher's variables."""
    drop = ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}


def _slurm_job_id() -> int:
    """A job id whose coordinator port is free: jax's SlurmCluster listens on JOB_ID % 4096 + 61440."""
    for _ in range(200):
        port = random.randint(61440, 65535)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 4096 * random.randint(1, 500) + port - 61440
    pytest.skip("no free port in jax's SLURM coordinator range")


def _slurm_env(job: int, rank: int, ntasks: int) -> dict[str, str]:
    """What `srun --nodes N --ntasks-per-node 1` sets in task `rank` (one task per node; each node is here)."""
    return _clean_env() | {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NNODES": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(ntasks),
        "SLURM_NODELIST": ",".join(["localhost"] * ntasks),
        "SLURM_STEP_NODELIST": ",".join(["localhost"] * ntasks),
        "SLURM_PROCID": str(rank),
        "SLURM_NODEID": str(rank),
        "SLURM_LOCALID": "0",
    }


def _launch(cmds_envs, tmp_path, repo, timeout=600):
    """Starts one process per (command, environment), output to files (a full pipe never blocks a process);
    waits for all; returns each one's (return code, output)."""
    logs = [tmp_path / f"process{i}.log" for i in range(len(cmds_envs))]
    procs = []
    for (cmd, env), log in zip(cmds_envs, logs, strict=True):
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, cwd=repo, env=env, stdout=f, stderr=subprocess.STDOUT, text=True))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        tails = "\n".join(f"-- process {i}:\n{log.read_text()[-1500:]}" for i, log in enumerate(logs))
        pytest.fail(f"a multi-process run timed out\n{tails}")
    return [(p.returncode, log.read_text()) for p, log in zip(procs, logs, strict=True)]


@pytest.mark.slow
def test_srun_train_on_two_nodes_matches_one_process(repo, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(NODES_CFG)
    cmd = [sys.executable, "-m", "partitioning", "train", str(cfg), "--no-progress"]
    job = _slurm_job_id()
    multi = cmd + ["--distributed", "--set", f"run_dir={tmp_path / 'multi'}"]
    # No CPU profile yet (remat: auto measures one): process 0 measures it on its own devices and shares it, so
    # both choose one remat policy, and the single process after them reads it back from the cache.
    profiles = {"PARTITIONING_CACHE": str(tmp_path / "profiles")}
    outs = _launch([(multi, _slurm_env(job, i, 2) | profiles) for i in range(2)], tmp_path, repo)
    for code, out in outs:
        assert code == 0, out[-3000:]
    # Found on the devices the run got (device.process_index): data spans the two nodes, fsdp stays inside.
    assert "nodes: 2 x 4 devices; across nodes: data (2 nodes); inside one node: fsdp" in outs[0][1].splitlines()
    # One process (after the two: they share this machine's cores): one node, the same mesh shape.
    single = subprocess.run(
        cmd + ["--set", f"run_dir={tmp_path / 'single'}"],
        cwd=repo,
        env=_clean_env() | profiles,
        capture_output=True,
        text=True,
    )
    remat = [line.split(":", 2)[1] for line in outs[0][1].splitlines() if line.startswith("remat: auto")]
    assert remat and f"remat:{remat[0]}:" in single.stdout  # the same policy
    assert single.returncode == 0, single.stderr[-2000:]
    assert "nodes:" not in single.stdout

    def losses(run):
        return [json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert len(losses("multi")) == 3
    np.testing.assert_allclose(losses("multi"), losses("single"), rtol=2e-5)


@pytest.mark.slow
def test_four_processes_as_nodes_from_the_jobset_variables(repo, tmp_path, free_port):
    port = free_port()
    worker = [sys.executable, "tests/multihost/nodes_worker.py", str(tmp_path)]
    env = _clean_env() | {"PYTHONPATH": str(repo), "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}"}
    outs = _launch(
        [(worker, env | {"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": str(i)}) for i in range(4)], tmp_path, repo
    )
    for code, out in outs:
        assert code == 0, out[-3000:]
    r = json.loads((tmp_path / "nodes.json").read_text())
    assert r["process_count"] == 4 and r["local"] == 2

    # nodes {data: 4}: every fsdp group on one process; every data group across all four.
    assert r["whole"] == {"fsdp": [[0], [1], [2], [3]], "data": [[0, 1, 2, 3]]}
    # nodes {data: 2, fsdp: 2}: each axis' groups span two processes, each process holds one fsdp index.
    assert r["factors"] == {"fsdp": [[0, 2], [1, 3]], "data": [[0, 1], [2, 3]]}

    assert r["refused"] == (
        "nodes: {data: 2} puts the mesh on 2 nodes, but its devices belong to 4 processes (one per node); "
        "use nodes {data: 4}"
    )
    assert r["refused_config"] == (
        f"{tmp_path / 'refused0.yaml'}:4: mesh.nodes: {{data: 2}} puts the mesh on 2 nodes, but its devices "
        f"belong to 4 processes (one per node); use nodes {{data: 4}}"
    )

    # The same run in this one process, on the same mesh shape over 8 local devices.
    reference = losses_on(pt.make_mesh({"fsdp": 2, "data": 4}))
    assert len(r["losses"]) == STEPS
    np.testing.assert_allclose(r["losses"], reference, rtol=2e-5)
