"""``partitioning ckpt ls|inspect|reshard`` and checkpointing in ``partitioning train``."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.cli import main as cli_main
from partitioning.checkpoint import CheckpointManager, abstract_target, checkpoint_metadata, restore_checkpoint
from partitioning.checkpoint.disk import list_steps
from tests.test_checkpoint import Setup, assert_bit_exact, mesh

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see test_checkpoint

REPO = Path(__file__).resolve().parent.parent
MODEL = "model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2}\n"


def run_cli(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "partitioning", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or REPO, env=env, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run dir with fsdp checkpoints at steps 3 and 6 (with metadata) and one unfinished save."""
    s = Setup()
    root = tmp_path_factory.mktemp("run")
    m = mesh({"data": 1, "fsdp": 8})
    tr = s.trainer(m, "fsdp")
    with CheckpointManager(root / "checkpoints", every=3, rules="fsdp", model_name="gpt",
                           abstract=tr.abstract_state, config={"model": {"name": "gpt"}}) as mngr:
        mngr.save(3, s.state(m, "fsdp", step=3), metrics={"loss": 2.5})
        mngr.save(6, s.state(m, "fsdp", step=6), metrics={"loss": 2.25, "eval_loss": 2.75})
    (root / "checkpoints" / "9.orbax-checkpoint-tmp-1234").mkdir()
    return s, root


def main(*args) -> int:
    return cli_main([str(a) for a in args])


def test_ls(run, capsys):
    _, root = run
    assert main("ckpt", "ls", root) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["3", "6", "9"]
    assert [r.split("│")[2].strip() for r in rows] == ["complete", "complete", "INCOMPLETE (save unfinished or killed)"]
    assert "eval_loss 2.75, loss 2.25" in rows[1]
    # On-disk size varies with orbax's chunking: check its form, not its value.
    assert all(re.fullmatch(r"\d+(\.\d\d)? (B|KiB|MiB)", r.split("│")[3].strip()) for r in rows[:2])
    assert out.rstrip().endswith("latest complete step: 6")


def test_inspect(run, capsys):
    _, root = run
    assert main("ckpt", "inspect", root, "--config") == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith(f"checkpoint {root / 'checkpoints' / '6'}: step 6, 38 arrays, ")
    assert first.endswith("files: OK")
    assert f"jax {jax.__version__}" in out and "model gpt; mesh {data: 1, fsdp: 8} (8 devices)" in out
    assert "rules: batch->data/fsdp, embed->fsdp, vocab->fsdp, mlp->fsdp" in out
    assert "metrics: eval_loss 2.75, loss 2.25" in out
    row = next(l for l in out.splitlines() if "│ params/blocks/attn/q " in l)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["params/blocks/attn/q", "(2, 32, 4, 8)", "float32", "(layers, embed, heads, kv)",
                     "P(None, 'fsdp', None, None) on {data: 1, fsdp: 8}"]
    assert "config:\nmodel:\n  name: gpt" in out
    assert main("ckpt", "inspect", root, "--step", "3", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step"] == 3 and data["problems"] == [] and data["metadata"]["metrics"] == {"loss": 2.5}
    assert data["arrays"]["opt_state/0/nu/embedding"] == {
        "shape": [64, 32], "dtype": "float32", "sharding": "P(None, 'fsdp') on {data: 1, fsdp: 8}",
        "names": ["vocab", "embed"]}


@pytest.mark.parametrize("mesh_yaml,rules,n,spec_q", [
    ("{data: 1, fsdp: 2, tensor: 4}", "fsdp_tp", 8, "P(None, 'fsdp', 'tensor', None)"),
    ("{data: 2, tensor: 4}", "tp", 8, "P(None, None, 'tensor', None)"),
    ("{data: 1, fsdp: 1}", "fsdp", 1, "P(None, 'fsdp', None, None)"),
], ids=["to-fsdp_tp", "to-tp", "to-1-device"])
def test_reshard(run, tmp_path, capsys, mesh_yaml, rules, n, spec_q):
    s, root = run
    cfg = tmp_path / "new.yaml"
    cfg.write_text(MODEL + f"mesh: {{shape: {mesh_yaml}, devices: {n}}}\nrules: {rules}\n"
                   "train: {batch_size: 8, seq_len: 8}\n")
    out = tmp_path / "out"
    assert main("ckpt", "reshard", root, "--config", cfg, "--out", out) == 0
    assert capsys.readouterr().out.startswith(
        "resharded step 6: 38 arrays from mesh {data: 1, fsdp: 8} to {" + mesh_yaml[1:-1] + "}")
    # The new checkpoint is laid out for the new mesh, with the same values ...
    assert main("ckpt", "inspect", out, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arrays"]["params/blocks/attn/q"]["sharding"].startswith(spec_q)
    assert data["metadata"]["resharded_from"] == str(root / "checkpoints" / "6")
    assert data["metadata"]["rules"] == pt.Rules.preset(rules).to_list()
    src_mesh = mesh({"data": 1, "fsdp": 8})
    original = restore_checkpoint(root, s.target(src_mesh, "fsdp"))
    assert_bit_exact(restore_checkpoint(out, s.target(src_mesh, "fsdp")), original)
    # ... and is what a run with the new config resumes from, reading only local slices.
    sizes = {k: int(v) for k, v in (kv.split(": ") for kv in mesh_yaml[1:-1].split(", "))}
    dst = mesh(sizes, n)
    back = restore_checkpoint(out, s.target(dst, rules))
    assert_bit_exact(back, original)
    assert str(back.params["blocks"]["attn"]["q"].sharding.spec) == spec_q


def test_reshard_plain_orbax_checkpoint(run, tmp_path, capsys):
    """No toolkit metadata: params take their names from the config's model, moments from their param."""
    import orbax.checkpoint as ocp

    s, _ = run
    state = s.state(mesh({"data": 1, "fsdp": 8}), "fsdp", step=11)
    with ocp.CheckpointManager(tmp_path / "plain") as mngr:
        mngr.save(11, args=ocp.args.StandardSave(state))
    cfg = tmp_path / "new.yaml"
    cfg.write_text(MODEL + "mesh: {shape: {data: 1, fsdp: 2, tensor: 4}, devices: 8}\nrules: fsdp_tp\n")
    assert main("ckpt", "reshard", tmp_path / "plain", "--config", cfg, "--out", tmp_path / "out") == 0
    assert capsys.readouterr().out.startswith(
        "resharded step 11: 38 arrays from mesh {data: 1, fsdp: 8} to {data: 1, fsdp: 2, tensor: 4}")
    meta = checkpoint_metadata(tmp_path / "out")
    for p in ("params/embedding", "opt_state/0/mu/embedding", "opt_state/0/nu/embedding"):
        assert meta["arrays"][p]["names"] == ["vocab", "embed"] and meta["arrays"][p]["spec"] == ["tensor", "fsdp"]
    assert meta["arrays"]["opt_state/0/count"]["spec"] == []
    dst = mesh({"data": 1, "fsdp": 2, "tensor": 4})
    assert_bit_exact(restore_checkpoint(tmp_path / "out", s.target(dst, "fsdp_tp")), state)


# -- bad input: one line on stderr, exit 2 --------------------------------------------------------

def _one_line_error(r):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("simulating")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_ls_missing_dir(tmp_path):
    assert _one_line_error(run_cli("ckpt", "ls", tmp_path / "nope")) == f"error: {tmp_path / 'nope'}: no such checkpoint directory"


def test_inspect_truncated_checkpoint(run, tmp_path):
    import shutil

    _, root = run
    ck = tmp_path / "6"
    shutil.copytree(root / "checkpoints" / "6", ck)
    victim = max((ck / "state").glob("ocdbt.process_*/d/*"), key=lambda f: f.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(10)
    r = run_cli("ckpt", "inspect", ck)
    line = _one_line_error(r)
    assert line.startswith(f"error: checkpoint {ck}: truncated file {victim} (10 bytes, needs at least ")
    # The tree is still shown: shapes and shardings come from the intact metadata.
    assert "files: DAMAGED: truncated file" in r.stdout.splitlines()[0] and "params/blocks/attn/q" in r.stdout


def test_reshard_bad_inputs(run, tmp_path):
    _, root = run
    indivisible = tmp_path / "ind.yaml"
    indivisible.write_text(MODEL + "mesh: {shape: {data: 1, tensor: 8}, devices: 8}\nrules: tp\n")
    line = _one_line_error(run_cli("ckpt", "reshard", root, "--config", indivisible, "--out", tmp_path / "o"))
    assert line.startswith("error: params/blocks/attn/k: dim 2 ('kv_heads', size 4) is not divisible by mesh axes "
                           "('tensor',) of size 8")
    # The same message `partitioning check` gives for that config (the init's layout step).
    assert _one_line_error(run_cli("check", indivisible)) == line
    other = tmp_path / "other.yaml"
    other.write_text(MODEL.replace("mlp: 64", "mlp: 128") + "mesh: {shape: {data: 1, fsdp: 8}, devices: 8}\nrules: fsdp\n")
    line = _one_line_error(run_cli("ckpt", "reshard", root, "--config", other, "--out", tmp_path / "o"))
    assert line.startswith(f"error: checkpoint {root / 'checkpoints' / '6'} does not fit the model (3 of 12 arrays differ): "
                           "params/blocks/mlp/wi_0: checkpoint (2, 32, 64) vs model (2, 32, 128)")
    assert not (tmp_path / "o").exists()


# -- partitioning train ---------------------------------------------------------------------------------

TRAIN = MODEL.replace("vocab_size: 64", "vocab_size: 256") + """mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {steps: 6, batch_size: 8, seq_len: 16, log_every: 3, eval_every: 3, eval_batches: 1}
checkpoint: {every: 3, keep: 2}
optimizer: {schedule: constant, warmup_steps: 0}   # lr independent of train.steps, so 6 + 3 == 9
"""


@pytest.mark.slow
def test_train_saves_resumes_and_continues(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TRAIN + f"run_dir: {tmp_path / 'run'}\n")
    r = run_cli("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr
    ckdir = tmp_path / "run" / "checkpoints"
    assert [s.step for s in list_steps(ckdir)] == [3, 6]
    meta = checkpoint_metadata(ckdir)
    assert meta["model"] == "gpt" and meta["config"]["checkpoint"] == {"every": 3, "keep": 2}
    assert meta["metrics"]["eval_loss"] > 0 and meta["arrays"]["params/embedding"]["names"] == ["vocab", "embed"]
    r = run_cli("train", cfg, "--no-progress", "--set", "train.steps=9")
    assert r.returncode == 0, r.stderr
    assert f"checkpoint: resumed from step 6 ({ckdir})" in r.stdout
    assert [s.step for s in list_steps(ckdir)] == [6, 9]
    resumed = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in resumed] == [1, 3, 6, 7, 9]
    # The same loss curve (data order included) as a run that was never interrupted.
    cfg2 = tmp_path / "whole.yaml"
    cfg2.write_text(TRAIN.replace("steps: 6", "steps: 9").replace("log_every: 3", "log_every: 1")
                    + f"run_dir: {tmp_path / 'whole'}\n")
    assert run_cli("train", cfg2, "--no-progress").returncode == 0
    whole = {m["step"]: m for m in map(json.loads, (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines())}
    for m in resumed:
        assert m["loss"] == pytest.approx(whole[m["step"]]["loss"], rel=1e-6), m["step"]


def test_no_resume_moves_checkpoints_aside(run, tmp_path):
    import shutil

    from partitioning.config.build import checkpoint_hook_from_config as checkpoint_hook
    from partitioning.config import load_config

    s, root = run
    shutil.copytree(root, tmp_path / "run")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(MODEL + "mesh: {shape: {data: 1, fsdp: 8}}\nrules: fsdp\ntrain: {batch_size: 8, seq_len: 8}\n")
    config = load_config(cfg)
    tr = s.trainer(mesh({"data": 1, "fsdp": 8}), "fsdp")
    said = []
    hook = checkpoint_hook(config, tr, tmp_path / "run", resume=False, log=said.append)
    assert not hook.resume and hook.manager.latest_step() is None
    moved = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoints.prev-")]
    assert len(moved) == 1 and [s.step for s in list_steps(moved[0]) if s.complete] == [3, 6]
    assert said == [f"checkpoint: --no-resume: moved existing checkpoints to {moved[0]}"]
    hook.manager.close()
    # resume=None (the default) resumes from whatever exists.
    shutil.copytree(moved[0], tmp_path / "run" / "checkpoints", dirs_exist_ok=True)
    hook = checkpoint_hook(config, tr, tmp_path / "run", log=said.append)
    state = hook.initial_state(tr, jax.random.key(0))
    assert hook.restored_step == 6 and int(state.step) == 6
    hook.manager.close()
    # --resume (resume=True) with nothing to resume from is bad input.
    with pytest.raises(pt.CheckpointError) as e:
        checkpoint_hook(config, tr, tmp_path / "fresh", resume=True)
    assert str(e.value) == f"--resume: no complete checkpoint in {tmp_path / 'fresh' / 'checkpoints'}"


@pytest.mark.slow
def test_sigterm_saves_before_exiting(tmp_path):
    """Preemption: SIGTERM stops after the current step, which is checkpointed before exit."""
    import signal
    import time

    cfg = tmp_path / "run.yaml"
    cfg.write_text(TRAIN.replace("steps: 6", "steps: 100000").replace("log_every: 3", "log_every: 1")
                   .replace("every: 3", "every: 0") + f"run_dir: {tmp_path / 'run'}\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen([sys.executable, "-m", "partitioning", "train", str(cfg), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
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


def test_train_resume_flag_without_checkpoint(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(TRAIN + f"run_dir: {tmp_path / 'run'}\n")
    r = run_cli("train", cfg, "--no-progress", "--resume")
    assert _one_line_error(r) == f"error: --resume: no complete checkpoint in {tmp_path / 'run' / 'checkpoints'}"
    r = run_cli("train", cfg, "--resume", "--no-resume")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
