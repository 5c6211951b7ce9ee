"""``model.lora:`` from YAML: the reference GPT, a Hugging Face checkpoint, a user's ``_target_`` model;
errors at their file:line; a short LoRA fine-tune of the tiny Llama fixture through ``partitioning train``."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import partitioning as pt
from partitioning.config.build import abstract_model, model_from_config
from partitioning.models import GPT

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MESH = "mesh: {shape: {data: 1, fsdp: -1, tensor: 2}, devices: 8}\nrules: fsdp_tp\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A work folder with the tiny Llama checkpoint at ``llama`` (paths in the configs are relative, as users write)."""
    (tmp_path / "llama").symlink_to(LLAMA)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(folder: Path, model: str, extra: str = "") -> pt.Config:
    (folder / "run.yaml").write_text(f"model:\n{model}{MESH}{extra}")
    return pt.load_config("run.yaml")


def test_the_reference_gpt_and_an_hf_checkpoint_take_model_lora(folder):
    lora = "  lora: {rank: 4, targets: ['attn/(q|v)$']}\n"
    gpt = model_from_config(config(folder, f"  name: gpt\n  layers: 2\n{lora}"))
    assert isinstance(gpt, GPT) and gpt.lora == {"rank": 4, "targets": ["attn/(q|v)$"]}
    cfg = config(folder, f"  hf: llama\n{lora}", "train: {batch_size: 8, seq_len: 16}\n")
    model, abstract = abstract_model(cfg)
    assert pt.finetune.LoRA.parse(model.lora) == pt.finetune.LoRA(rank=4, targets=("attn/(q|v)$",))
    assert pt.logical_names(abstract)["params"]["blocks"]["attn"]["v_lora_b"] == ("layers", "kv_heads", "kv", "lora")
    assert "k_lora_a" not in abstract["params"]["blocks"]["attn"]


def test_a_users_target_model_gets_the_weight_path(folder):
    model = "  _target_: tests.byom.models.constrained_linen.MaxTextStyleLM\n  vocab: 64\n"
    model += "  lora: {rank: 2, targets: ['^wi$']}\n"
    import sys

    sys.path.insert(0, str(REPO))  # `tests.` importable from the work folder, as a user's package would be
    try:
        cfg = config(folder, model, "train: {batch_size: 8, seq_len: 16}\n")
        built, abstract = abstract_model(cfg)
    finally:
        sys.path.remove(str(REPO))
    assert isinstance(built, pt.finetune.LoRAModel) and built.lora == pt.finetune.LoRA(rank=2, targets=("^wi$",))
    names = pt.logical_names(abstract)["params"]
    assert names["wi_lora_a"] == ("embed", "lora") and names["wi_lora_b"] == ("lora", "mlp")
    assert "wo_lora_a" not in names


@pytest.mark.parametrize(
    "model, line, message",
    [
        (
            "  name: gpt\n  layers: 2\n  lora:\n    rank: 4\n    targets: [attn/qq]\n",
            6,
            "model.lora.targets: 'attn/qq' matches no weight LoRA can adapt; did you mean 'blocks/attn/q'? (the 8 it "
            "can: blocks/attn/q, blocks/attn/k, blocks/attn/v, blocks/attn/o, blocks/mlp/wi_0, blocks/mlp/wi_1, "
            "blocks/mlp/wo, unembed)",
        ),
        ("  hf: llama\n  lora:\n    rank: 0\n    targets: [q]\n", 4, "model.lora.rank: must be an integer >= 1, got 0"),
        ("  hf: llama\n  lora: {rank: 4, targets: [q], dropuot: 0.1}\n", 3, "model.lora.dropuot: unknown lora option"),
        ("  name: mlp\n  lora: {rank: 2, targets: [wii]}\n", 3, "model.lora.targets: 'wii' matches no parameter"),
        (
            "  name: mlp\n  lora: {rank: 2, targets: [wi_0], dropout: 0.1}\n",
            3,
            "model.lora.dropout: must be 0 for this model, got 0.1: dropout on",
        ),
    ],
)
def test_bad_lora_from_yaml_is_one_line_at_its_key(folder, model, line, message):
    cfg = config(folder, model, "train: {batch_size: 8, seq_len: 16}\n")
    with pytest.raises(pt.ConfigError) as e:
        abstract_model(cfg)
    assert str(e.value).startswith(f"run.yaml:{line}: {message}"), str(e.value)


def test_the_cli_says_it_in_one_line_and_exits_2(folder, run_cli_in_process):
    config(folder, "  hf: llama\n  lora: {rank: 4, targets: [nothing]}\n")
    r = run_cli_in_process("plan", "run.yaml", "--no-compile")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: run.yaml:3: model.lora.targets: 'nothing' matches no weight LoRA can adapt (the 8 it can: "
        "blocks/attn/q, blocks/attn/k, blocks/attn/v, blocks/attn/o, blocks/mlp/wi_0, blocks/mlp/wi_1, blocks/mlp/wo, "
        "unembed)"
    )


def test_a_short_lora_fine_tune_from_yaml(folder, run_cli_in_process):
    (folder / "text.txt").write_text("def add(x, y):\n    return x + y\n" * 200)
    config(
        folder,
        "  hf: llama\n  remat: none\n  lora: {rank: 4, alpha: 8, targets: ['attn/(q|v)$']}\n",
        "data: {path: text.txt, cache_dir: cache, eval_fraction: 0.2}\n"
        "optimizer: {lr: 0.01, warmup_steps: 0}\n"
        "train: {steps: 3, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 0, eval_batches: 0,"
        " tracker: [jsonl]}\n"
        "checkpoint: {async: false}\nrun_dir: runs/lora\n",
    )
    r = run_cli_in_process("train", "run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    losses = [
        json.loads(x)["loss"] for x in (folder / "runs/lora/metrics.jsonl").read_text().splitlines() if "loss" in x
    ]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    meta = pt.checkpoint.checkpoint_metadata(folder / "runs/lora/checkpoints")
    assert meta["arrays"]["params/blocks/attn/q_lora_a"]["names"] == ["layers", "lora", "embed"]
    assert meta["arrays"]["params/blocks/attn/v_lora_b"]["names"] == ["layers", "kv_heads", "kv", "lora"]
    # The adapters trained: lora_b left zero.
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    params = pt.restore_checkpoint(folder / "runs/lora/checkpoints", mesh=mesh, rules="fsdp", params_only=True)
    params = params.get("params", params)
    assert np.abs(np.asarray(params["blocks"]["attn"]["q_lora_b"])).max() > 0
