"""`model: {hf: BASE, adapter: DIR}` from YAML, and `ckpt export-hf` of a LoRA run: a PEFT adapter, or merged."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import partitioning as pt
from partitioning.config import load_config
from partitioning.config.build import mesh_from_config, model_from_config
from partitioning.config.hf import hf_options, hf_params_from_config, hf_record
from partitioning.hf.files import discover, read_header

CONFIG = """\
model: {hf: base, adapter: adapter}
mesh: {shape: {data: 1, fsdp: 4, tensor: 2}, devices: 8}
rules: fsdp_tp
run_dir: runs/lora
"""
PREFIX = "base_model.model.model.layers.0."


def tensors(file) -> dict[str, np.ndarray]:
    out = {}
    for name, s in (read_header(Path(file)) if Path(file).is_file() else discover(file)).items():
        with open(s.file, "rb") as f:
            f.seek(s.start)
            out[name] = np.frombuffer(f.read(int(np.prod(s.shape)) * s.dtype.itemsize), s.dtype).reshape(s.shape)
    return out


@pytest.fixture
def lora_run(repo, tmp_path, monkeypatch):
    """A run dir whose checkpoint holds the llama base + the PEFT fixture adapter (as a LoRA run would save it)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(repo / "tests/fixtures/hf/llama", "base", ignore=shutil.ignore_patterns("v4"))
    shutil.copytree(repo / "tests/fixtures/peft/llama_rslora", "adapter")
    Path("lora.yaml").write_text(CONFIG)
    cfg = load_config("lora.yaml")
    params = hf_params_from_config(cfg, mesh_from_config(cfg))
    pt.save_checkpoint("runs/lora/checkpoints", 3, {"params": params}, rules=cfg.rules, extra={"hf": hf_record(cfg)})
    return cfg, params


def test_adapter_from_yaml_sets_the_lora_and_exports_back_bit_exact(lora_run, run_cli_in_process):
    cfg, params = lora_run
    lora = hf_options(cfg)["lora"]
    assert (lora["rank"], lora["alpha"], lora["rslora"]) == (4, 8.0, True)
    assert model_from_config(cfg).lora.targets == tuple(lora["targets"])
    attn = sorted(params["blocks"]["attn"])
    assert attn == ["k", "o", "o_lora_a", "o_lora_b", "q", "q_lora_a", "q_lora_b", "v", "v_lora_a", "v_lora_b"]
    r = run_cli_in_process("ckpt", "export-hf", "runs/lora", "out")
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.strip()
        == "exported step 3 of runs/lora to out (PEFT adapter): adapter_config.json, adapter_model.safetensors"
    )
    got, want = tensors("out/adapter_model.safetensors"), tensors("adapter/adapter_model.safetensors")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    exported = json.loads(Path("out/adapter_config.json").read_text())
    assert exported["base_model_name_or_path"] == str(Path("base").resolve())
    assert (exported["r"], exported["lora_alpha"], exported["use_rslora"]) == (4, 8, True)
    assert exported["target_modules"] == ["down_proj", "o_proj", "q_proj", "v_proj"]
    # --merge: a plain checkpoint, each adapted weight W + alpha / sqrt(r) * B A.
    r = run_cli_in_process("ckpt", "export-hf", "runs/lora", "merged", "--merge")
    assert r.returncode == 0, r.stderr
    assert "exported step 3 of runs/lora to merged (LoRA merged): config.json, generation_config.json" in r.stdout
    merged, base = tensors("merged"), tensors("base")
    name = "model.layers.0.self_attn.q_proj.weight"
    a, b = want[PREFIX + "self_attn.q_proj.lora_A.weight"], want[PREFIX + "self_attn.q_proj.lora_B.weight"]
    np.testing.assert_allclose(merged[name], base[name] + 8 / 2 * b @ a, rtol=1e-6, atol=1e-6)
    assert np.array_equal(
        merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"]
    )
    assert sorted(merged) == sorted(base)


def test_bad_adapter_keys_are_one_line_at_the_key(repo, tmp_path, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(repo / "tests/fixtures/hf/gemma", "base")
    shutil.copytree(repo / "tests/fixtures/peft/llama", "adapter")
    Path("lora.yaml").write_text(CONFIG.replace("fsdp: 4, tensor: 2", "fsdp: 8").replace("fsdp_tp", "fsdp"))
    # An adapter made for another base: found when the weights are read (train, generate).
    r = run_cli_in_process("generate", "lora.yaml", "--prompt", "x", "--from-hf")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1] == (
        "error: lora.yaml:1: model.adapter: adapter/adapter_model.safetensors: tensor 'base_model.model.model.layers.0."
        "self_attn.q_proj.lora_B.weight' has shape [32, 4]; base/config.json and r=4 imply [48, 4] (an adapter made "
        "for another base model?)"
    )
    Path("lora.yaml").write_text(CONFIG.replace("adapter: adapter}", "adapter: nowhere}"))
    r = run_cli_in_process("plan", "lora.yaml")
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith(
        "error: lora.yaml:1: model.adapter: no such adapter folder 'nowhere' (looked in"
    )
    Path("lora.yaml").write_text(
        CONFIG.replace("adapter: adapter}", "adapter: adapter, lora: {rank: 2, targets: [attn]}}")
    )
    r = run_cli_in_process("plan", "lora.yaml")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "error: lora.yaml:1: model.lora: model.adapter sets the LoRA (its adapter_config.json); drop model.lora"
    )
