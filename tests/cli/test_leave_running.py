"""The smaller things a fine-tuning run you leave running needs: a refused `train` leaves nothing behind (no lock
file), `generate` says when a RoPE model decodes past the positions it was trained on, and the config reference
documents the `model:` keys (`model.hf`, `model.lora`, `model.adapter`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from partitioning.errors import CheckpointError

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_train_refused_after_taking_its_lock_leaves_no_lock_behind(here, run_cli_in_process, monkeypatch):
    import partitioning.cli.train as train

    def unreadable(cfg, mesh):  # a weight that fails as it is read: after the pre-flight, the lock taken
        raise CheckpointError(f"{cfg.model_hf}/model.safetensors: unreadable tensor (a test)")

    monkeypatch.setattr(train, "hf_params_from_config", unreadable)
    Path("corpus.txt").write_text("def f(x):\n    return x\n" * 100)
    Path("run.yaml").write_text(
        f"model: {{hf: {LLAMA}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        "data: {path: corpus.txt}\ntrain: {steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}\n"
        "run_dir: runs/new/deep\n"
    )
    r = run_cli_in_process("train", "run.yaml", "--no-progress")
    assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith("unreadable tensor (a test)")
    assert sorted(p.name for p in here.iterdir()) == ["corpus.txt", "run.yaml"]  # no runs/new/deep/.lock


def test_a_refused_train_keeps_the_lock_file_of_a_run_that_was_there(here, run_cli_in_process, monkeypatch):
    import partitioning.cli.train as train

    monkeypatch.setattr(train, "hf_params_from_config", lambda cfg, mesh: (_ for _ in ()).throw(CheckpointError("x")))
    Path("corpus.txt").write_text("def f(x):\n    return x\n" * 100)
    Path("runs/old").mkdir(parents=True)
    Path("runs/old/notes.txt").write_text("mine")
    Path("run.yaml").write_text(
        f"model: {{hf: {LLAMA}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        "data: {path: corpus.txt}\ntrain: {steps: 2, batch_size: 8, seq_len: 16, eval_batches: 0}\nrun_dir: runs/old\n"
    )
    assert run_cli_in_process("train", "run.yaml", "--no-progress").returncode == 2
    assert Path("runs/old/notes.txt").read_text() == "mine"  # the user's folder stays as it was


def test_generate_warns_when_a_rope_model_decodes_past_its_trained_positions(here, run_cli_in_process):
    Path("g.yaml").write_text(
        f"model: {{hf: {LLAMA}, remat: none}}\nmesh: {{shape: {{data: 1, fsdp: -1}}, devices: 8}}\nrules: fsdp\n"
        "run_dir: runs/g\n"
    )
    r = run_cli_in_process("generate", "g.yaml", "--prompt", "def", "--max-tokens", "70", "--from-hf")
    assert r.returncode == 0, r.stderr
    warning = [x for x in r.stderr.splitlines() if x.startswith("warning: ")]
    assert warning == [
        "warning: --max-tokens 70 + 3 tokens of --prompt: sequence length 73 is past the model's 64 positions "
        f"(max_position_embeddings in {LLAMA / 'config.json'}): its rotary positions were never trained that far "
        "and the text may degrade; lower --max-tokens to at most 61"
    ]
    r = run_cli_in_process("generate", "g.yaml", "--prompt", "def", "--max-tokens", "8", "--from-hf")
    assert r.returncode == 0 and "warning" not in r.stderr


def test_the_config_reference_documents_the_model_keys():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from docs_hooks import config_reference
    finally:
        sys.path.remove(str(REPO / "tools"))
    page = config_reference()
    section = page[page.index("## `model:` {#model}") : page.index("## `data:`")]
    rows = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")}
    assert {"`name`", "`_target_`", "`hf`", "`lora`", "`adapter`", "`scan_layers`", "`attention`"} <= rows
    assert "a PEFT LoRA adapter folder" in section and "LoRA adapters on any of the three" in section
