"""`partitioning train` with `train.trainable`: frozen params saved once, a resume reads them back, `ckpt inspect`."""

import json

import pytest

from partitioning.checkpoint.disk import list_steps

CONFIG = """\
model: {name: gpt, vocab_size: 256, embed: 32, heads: 4, mlp: 64, layers: 2, remat: none}
mesh:
  shape: {data: 1, fsdp: -1}
  devices: 8
rules: fsdp
optimizer: {name: adamw, lr: 0.01}
train:
  steps: 2
  batch_size: 8
  seq_len: 32
  log_every: 1
  eval_every: 0
  tracker: [jsonl]
  trainable: [blocks/mlp/wo]
checkpoint: {every: 1, keep: 1}
run_dir: RUN_DIR
"""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see tests/checkpoint
def test_train_resume_and_inspect_a_frozen_subset_run(write, tmp_path, run_cli_in_process):
    cfg = write("run.yaml", CONFIG.replace("RUN_DIR", str(tmp_path / "run")))
    r = run_cli_in_process("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr
    ckdir = tmp_path / "run" / "checkpoints"
    assert [s.step for s in list_steps(ckdir)] == [2]
    assert sorted(p.name for p in (ckdir / "frozen").iterdir()) == ["1"]  # written at the first save only
    r = run_cli_in_process("train", cfg, "--no-progress", "--set", "train.steps=3")
    assert r.returncode == 0, r.stderr
    assert f"checkpoint: resumed from step 2 ({ckdir})" in r.stdout
    assert [s.step for s in list_steps(ckdir)] == [3]
    assert sorted(p.name for p in (ckdir / "frozen").iterdir()) == ["1"]  # the resumed run refers to it too
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[2] < losses[0]
    r = run_cli_in_process("ckpt", "inspect", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert f"frozen params: 11 arrays in {ckdir / 'frozen' / '1'} (written once per run;" in r.stdout
    assert "files: OK" in r.stdout
