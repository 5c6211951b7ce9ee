"""QLoRA through the CLI: a short NF4-base LoRA run on the tiny Llama fixture; export-hf writes the adapters
(PEFT, as over a float base) and ``--merge`` the dequantized weights merged; bad options are one line."""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import partitioning as pt
from partitioning.config.build import abstract_model
from partitioning.finetune.quantize import dequantize

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"
MESH = "mesh: {shape: {data: 1, fsdp: -1, tensor: 2}, devices: 8}\nrules: fsdp_tp\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "llama").symlink_to(LLAMA)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(folder: Path, lora: str, extra: str = "") -> None:
    (folder / "run.yaml").write_text(f"model:\n  hf: llama\n  remat: none\n  lora: {lora}\n{MESH}{extra}")


def test_an_nf4_base_trains_its_adapters_and_exports_them_and_the_merged_weights(folder, run_cli_in_process):
    (folder / "text.txt").write_text("def add(x, y):\n    return x + y\n" * 200)
    write(
        folder,
        "{rank: 4, alpha: 8, targets: ['attn/(q|v)$'], base_dtype: nf4, base_block: 8}",
        "data: {path: text.txt, cache_dir: cache, eval_fraction: 0.2}\n"
        "optimizer: {lr: 0.05, warmup_steps: 0}\n"
        "train: {steps: 8, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 0, eval_batches: 0,"
        " tracker: [jsonl]}\ncheckpoint: {async: false}\nrun_dir: runs/qlora\n",
    )
    r = run_cli_in_process("train", "run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = (folder / "runs/qlora/metrics.jsonl").read_text().splitlines()
    losses = [json.loads(x)["loss"] for x in rows if '"loss"' in x]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses

    r = run_cli_in_process("ckpt", "export-hf", "runs/qlora", "out/adapter")
    assert r.returncode == 0, r.stderr[-2000:]
    adapter = load_file(folder / "out/adapter/adapter_model.safetensors")
    prefix = "base_model.model.model.layers.0.self_attn."
    assert len(adapter) == 8 and adapter[prefix + "q_proj.lora_A.weight"].shape == (4, 32)
    assert adapter[prefix + "v_proj.lora_B.weight"].shape == (16, 4)
    assert json.loads((folder / "out/adapter/adapter_config.json").read_text())["r"] == 4

    r = run_cli_in_process("ckpt", "export-hf", "runs/qlora", "out/merged", "--merge")
    assert r.returncode == 0, r.stderr[-2000:]
    merged = load_file(folder / "out/merged/model.safetensors")
    # The run's layout: the scales' blocked embed axis (32 / 8 = 4 blocks) splits 4 ways, not 8.
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    params = pt.restore_checkpoint(folder / "runs/qlora/checkpoints", mesh=mesh, rules="fsdp_tp", params_only=True)
    attn = params.get("params", params)["blocks"]["attn"]
    assert attn["q"].dtype == np.uint8 and attn["q"].shape == (2, 4, 8, 16) and attn["q_qscale"].shape == (2, 4, 8, 4)
    for name, adapted in (("q", True), ("k", False)):
        w = np.asarray(dequantize(attn[name], attn[name + "_qscale"], "nf4", 8))  # (layers, heads, kv, embed)
        if adapted:
            a, b = np.asarray(attn[name + "_lora_a"]), np.asarray(attn[name + "_lora_b"])  # (l, r, e), (l, h, k, r)
            w = w + 2.0 * np.einsum("lhkr,lre->lhke", b, a)
            assert np.abs(b).max() > 0
        want = w[1].reshape(-1, 32)
        np.testing.assert_allclose(merged[f"model.layers.1.self_attn.{name}_proj.weight"], want, atol=1e-6)


@pytest.mark.parametrize(
    "model, message",
    [
        (
            "  hf: llama\n  base_dtype: nf4\n",
            "run.yaml:3: model.base_dtype: unknown key (valid: hf, scan_layers, remat, dtype, param_dtype, lora, "
            "adapter, capacity_factor, attention, context_parallel); a quantized base is a LoRA option: set "
            "model.lora.base_dtype (the base is frozen under LoRA)",
        ),
        (
            "  hf: llama\n  lora: {rank: 4, targets: [attn/q], base_dtype: nf4}\n",
            "run.yaml:3: model.lora.base_block: blocks/attn/q's last axis (embed) has 32 values, not a multiple "
            "of the block 64: set model.lora.base_block to an even divisor of it (e.g. 32)",
        ),
        (
            "  hf: llama\n  lora: {rank: 4, targets: [attn/q], base_dtype: nf8}\n",
            "run.yaml:3: model.lora.base_dtype: must be one of int8, nf4 (or unset: the model's param dtype), "
            "got 'nf8'; did you mean 'nf4'?",
        ),
        (
            "  name: mlp\n  lora: {rank: 2, targets: [wi_0], base_dtype: int8}\n",
            "run.yaml:3: model.lora.base_dtype: a quantized base (int8) needs layers that dequantize their own "
            "kernels, which only the reference models have (gpt and the Hugging Face families); drop base_dtype",
        ),
    ],
)
def test_bad_quantized_bases_are_one_line(folder, run_cli_in_process, model, message):
    (folder / "run.yaml").write_text(f"model:\n{model}{MESH}train: {{batch_size: 8, seq_len: 16}}\n")
    with pytest.raises(pt.ConfigError) as e:
        abstract_model(pt.load_config("run.yaml"))
    assert str(e.value) == message
    r = run_cli_in_process("plan", "run.yaml", "--no-compile")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: {message}"
