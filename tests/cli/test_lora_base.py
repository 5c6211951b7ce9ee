"""A step knows its base: each step of a LoRA run records the digest of its frozen params' checksums, and every
reader (`ckpt ls`, `ckpt inspect`, `train` resuming, `check`, `generate`, `restore_checkpoint`, `export-hf
--merge`) refuses a base that is missing or another run's, in one line with advice that works; `export-hf` of
the adapters needs no base, and `restore_checkpoint(..., frozen=False)` reads a step's own arrays."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import pytest

import partitioning as pt

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
model: {{name: gpt, vocab_size: 256, embed: 32, heads: 4, mlp: 64, layers: 1, remat: none,
        lora: {{rank: 2, targets: ["attn/(q|v)$"]}}}}
mesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}
rules: fsdp
data: {{path: corpus.txt}}
optimizer: {{name: adamw, lr: 0.01}}
train: {{steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0, tracker: [jsonl], seed: {seed}}}
checkpoint: {{every: 1, keep: 3}}
run_dir: runs/{name}
"""
MISSING = "its frozen params runs/a/checkpoints/frozen/1 are missing (written once per run, every step refers to them)"
# What a command that reads a step (generate, inspect, export-hf --merge) advises when the base is wrong.
READ_ADVICE = (
    "; not restored; no earlier good step to read: put back the run's own frozen params, or export the adapters, "
    "which need no base (ckpt export-hf without --merge)"
)


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip() and not x.startswith("simulating ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, run_cli_subprocess):
    """Two LoRA runs of one model, each with its own random base: runs/a and runs/b, at step 2."""
    d = tmp_path_factory.mktemp("lora_runs")
    (d / "corpus.txt").write_text("def f(x):\n    return x * 2\n" * 400)
    for name, seed in (("a", 0), ("b", 1)):
        (d / f"{name}.yaml").write_text(CONFIG.format(name=name, seed=seed))
        r = run_cli_subprocess("train", f"{name}.yaml", "--no-progress", cwd=d)
        assert r.returncode == 0, r.stderr
    return d


@pytest.fixture
def here(runs, tmp_path, monkeypatch):
    shutil.copytree(runs, tmp_path / "w")
    monkeypatch.chdir(tmp_path / "w")
    return tmp_path / "w"


def foreign_base(folder: Path) -> None:
    """runs/b's frozen/1 copied over runs/a's: same shapes, another run's weights."""
    shutil.rmtree(folder / "runs/a/checkpoints/frozen/1")
    shutil.copytree(folder / "runs/b/checkpoints/frozen/1", folder / "runs/a/checkpoints/frozen/1")


def test_each_step_records_its_base_by_the_digest_of_its_checksums(here):
    meta = json.loads(Path("runs/a/checkpoints/2/meta/metadata").read_text())
    from partitioning.checkpoint.base import base_digest

    assert meta["frozen"]["digest"] == base_digest(Path("runs/a/checkpoints/frozen/1"))
    assert meta["frozen"]["digest"] != base_digest(Path("runs/b/checkpoints/frozen/1"))


def test_ls_and_inspect_call_a_step_with_a_foreign_base_damaged(here, run_cli_in_process):
    foreign_base(here)
    r = run_cli_in_process("ckpt", "ls", "runs/a")
    assert r.returncode == 0 and "DAMAGED" in r.stdout and "latest complete step: none" in r.stdout
    r = run_cli_in_process("ckpt", "inspect", "runs/a")
    assert r.returncode == 2 and lines(r.stderr)[-1].startswith(
        "error: checkpoint step 2 (runs/a/checkpoints/2) is damaged: its frozen params runs/a/checkpoints/frozen/1 "
        "are not the ones it was saved with (the digest of their checksums is "
    )
    assert lines(r.stderr)[-1].endswith(": copied from another run?)" + READ_ADVICE)
    r = run_cli_in_process("ckpt", "inspect", "runs/a/checkpoints/1")  # a step named directly: shown, DAMAGED
    assert r.returncode == 2 and "files: DAMAGED: its frozen params runs/a/checkpoints/frozen/1 are not" in r.stdout
    r = run_cli_in_process("check", "a.yaml", "--set", "train.steps=3")  # train would resume from step 2
    assert r.returncode == 2 and lines(r.stderr)[0].endswith(
        ": copied from another run?); not restored; no earlier good step: start over with --no-resume"
    )


def test_train_and_check_refuse_to_resume_onto_a_missing_base_and_no_resume_works(here, run_cli_in_process):
    shutil.rmtree("runs/a/checkpoints/frozen")
    r = run_cli_in_process("ckpt", "ls", "runs/a")  # not "complete"
    assert r.returncode == 0 and r.stdout.count("DAMAGED") == 2 and "latest complete step: none" in r.stdout
    for argv in (("check",), ("train", "--no-progress")):
        r = run_cli_in_process(*argv, "a.yaml", "--set", "train.steps=3")
        assert r.returncode == 2, r.stderr
        assert lines(r.stderr)[0] == (
            f"error: checkpoint step 2 (runs/a/checkpoints/2) is damaged: {MISSING}; not restored; no earlier good "
            "step: start over with --no-resume"
        )
    r = run_cli_in_process("train", "a.yaml", "--set", "train.steps=3", "--no-resume", "--no-progress")
    assert r.returncode == 0, r.stderr  # the advice works


def test_generate_refuses_a_foreign_base_naming_its_step_flag(here, run_cli_in_process):
    foreign_base(here)
    r = run_cli_in_process("generate", "a.yaml", "--prompt", "def", "--max-tokens", "2")
    assert r.returncode == 2, r.stderr
    line = lines(r.stderr)[-1]
    assert line.startswith("error: checkpoint step 2 (runs/a/checkpoints/2) is damaged: its frozen params ")
    assert line.endswith(READ_ADVICE) and "--resume-from" not in line


def test_restore_refuses_a_missing_base_and_frozen_false_reads_the_steps_own_arrays(here):
    shutil.rmtree("runs/a/checkpoints/frozen")
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    with pytest.raises(pt.CheckpointError) as e:
        pt.restore_checkpoint("runs/a", mesh=mesh, rules="fsdp")
    assert str(e.value) == (
        f"checkpoint step 2 (runs/a/checkpoints/2) is damaged: {MISSING}; not restored; no earlier good step: start "
        "over with --no-resume"
    )
    own = pt.restore_checkpoint("runs/a", mesh=mesh, rules="fsdp", frozen=False)
    adapters = sorted(jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(own["params"])[0])
    assert adapters and all("lora" in p for p in adapters)
    assert int(own["step"]) == 2


def test_restore_frozen_false_with_a_whole_target_returns_the_steps_own_params(here):
    from partitioning.config import load_config
    from partitioning.config.build import mesh_from_config, trainer_from_config

    cfg = load_config("a.yaml")
    trainer = trainer_from_config(cfg, mesh_from_config(cfg))
    target = pt.abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
    state = pt.restore_checkpoint("runs/a", target, frozen=False)
    flat = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(state.params)[0]]
    assert flat and all("lora" in p for p in flat)
    whole = pt.restore_checkpoint("runs/a", target)
    assert "embedding" in whole.params


HF_CONFIG = f"""\
model: {{hf: {REPO}/tests/fixtures/hf/llama, remat: none, lora: {{rank: 2, targets: ["attn/(q|v)$"]}}}}
mesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}
rules: fsdp
data: {{path: corpus.txt}}
train: {{steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0, tracker: [jsonl]}}
checkpoint: {{every: 1, keep: 3}}
run_dir: runs/hf
"""


def test_export_hf_writes_the_adapters_without_the_base_and_merge_refuses_naming_step(here, run_cli_in_process):
    Path("hf.yaml").write_text(HF_CONFIG)
    r = run_cli_in_process("train", "hf.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr
    shutil.rmtree("runs/hf/checkpoints/frozen")
    r = run_cli_in_process("ckpt", "export-hf", "runs/hf", "adapter")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "exported step 2 of runs/hf to adapter (PEFT adapter): adapter_config.json, adapter_model.safetensors"
    )
    r = run_cli_in_process("ckpt", "export-hf", "runs/hf", "merged", "--merge")
    assert r.returncode == 2 and not Path("merged").exists()
    assert lines(r.stderr)[-1] == (
        "error: checkpoint step 2 (runs/hf/checkpoints/2) is damaged: its frozen params runs/hf/checkpoints/frozen/1 "
        "are missing (written once per run, every step refers to them)" + READ_ADVICE
    )


def test_export_hf_advice_names_step_not_resume_from(here, run_cli_in_process):
    Path("hf.yaml").write_text(HF_CONFIG)
    assert run_cli_in_process("train", "hf.yaml", "--no-progress").returncode == 0
    Path("runs/hf/checkpoints/2/meta/checksums.0.json").unlink()
    r = run_cli_in_process("ckpt", "export-hf", "runs/hf", "out")
    assert r.returncode == 2
    assert lines(r.stderr)[-1].endswith("; not restored; the latest good step is 1: choose it with --step 1")
    r = run_cli_in_process("ckpt", "export-hf", "runs/hf", "out", "--step", "1")
    assert r.returncode == 0, r.stderr  # the advice works
