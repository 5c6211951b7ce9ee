"""PEFT LoRA adapters made by `peft` itself (tools/make_peft_fixtures.py) load onto fsdp and fsdp_tp meshes with
PeftModel's logits; written back they are the same bytes; merged they give merge_and_unload's logits."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.hf.files import read_header, write_safetensors
from tests.hf.conftest import FIXTURES, fixture, logits, mesh_for

PEFT = FIXTURES.parent / "peft"
CASES = [
    ("llama", "llama", "fsdp", True),
    ("llama", "llama", "fsdp_tp", True),
    ("llama_rslora", "llama", "fsdp", False),
]
CASES += [("qwen2", "qwen2", "fsdp_tp", True)]
# Issue 37's families: NoPE and sliding layers, the post-norm block, Phi-4's unfused projections, GPT-OSS's attention.
CASES += [("olmo3", "olmo3", "fsdp_tp", True), ("smollm3", "smollm3", "fsdp", True)]
CASES += [("phi4", "phi4", "fsdp_tp", True), ("gpt_oss", "gpt_oss", "fsdp_tp", True)]
# Gemma 4 (its layers are never scanned): the global layers' values are the adapted keys.
CASES += [("gemma4", "gemma4", "fsdp", False)]


def tensors(file) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file, read plainly (not by the reader under test)."""
    out = {}
    for name, s in read_header(Path(file)).items():
        with open(s.file, "rb") as f:
            f.seek(s.start)
            out[name] = np.frombuffer(f.read(int(np.prod(s.shape)) * s.dtype.itemsize), s.dtype).reshape(s.shape)
    return out


@pytest.fixture(scope="module")
def llama():
    """The llama adapter on fsdp_tp (shared by the round trips)."""
    mesh = mesh_for("fsdp_tp")
    model, variables = pt.hf.load_hf(fixture("llama"), mesh, "fsdp_tp", adapter=PEFT / "llama")
    return mesh, model, variables


@pytest.mark.parametrize(
    "adapter,base,preset,scan", CASES, ids=[f"{a}-{p}-{'scan' if s else 'blocks'}" for a, _, p, s in CASES]
)
def test_adapter_logits_equal_peft(adapter, base, preset, scan):
    mesh = mesh_for(preset)
    model, variables = pt.hf.load_hf(fixture(base), mesh, preset, adapter=PEFT / adapter, scan_layers=scan)
    want = np.load(PEFT / adapter / "logits.npy")
    got = logits(model, variables, np.load(fixture(base) / "tokens.npy"), mesh, preset)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
    # The adapter moved the logits far from the base model's: the test sees a wrong or missing adapter.
    assert np.abs(want - np.load(fixture(base) / "logits.npy")).max() > 1.0
    assert model.lora.rank == 4 and model.lora.rslora == (adapter == "llama_rslora")


def test_adapters_are_laid_out_by_the_rules(llama):
    _, model, variables = llama
    attn = variables["params"]["blocks"]["attn"]
    assert attn["q_lora_a"].shape == (2, 4, 32)  # (layers, lora, embed): PEFT's lora_A (r, in) per layer
    assert attn["q_lora_b"].shape == (2, 4, 8, 4)  # (layers, heads, kv, lora): lora_B (out, r)
    assert attn["q_lora_a"].sharding.spec == P(None, None, "fsdp")
    assert attn["q_lora_b"].sharding.spec == P(None, "tensor", None, None)
    assert sorted(variables["params"]["blocks"]["mlp"]) == [
        "wi_0", "wi_0_lora_a", "wi_0_lora_b", "wi_1", "wi_1_lora_a", "wi_1_lora_b", "wo", "wo_lora_a", "wo_lora_b"
    ]  # fmt: skip


def test_export_is_bit_exact_and_merge_equals_merge_and_unload(llama, tmp_path):
    mesh, model, variables = llama
    out = pt.hf.save_peft(model, variables, tmp_path / "adapter", base="tests/fixtures/hf/llama")
    assert sorted(f.name for f in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    got, want = tensors(out / "adapter_model.safetensors"), tensors(PEFT / "llama" / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and len(got) == 28
    for name in want:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    cfg, ref = (
        json.loads((out / "adapter_config.json").read_text()),
        json.loads((PEFT / "llama/adapter_config.json").read_text()),
    )
    for key in ("peft_type", "task_type", "r", "lora_alpha", "use_rslora", "bias", "base_model_name_or_path"):
        assert cfg[key] == ref[key], key
    assert sorted(cfg["target_modules"]) == sorted(ref["target_modules"])
    # Read back: the same model.
    again_model, again = pt.hf.load_hf(fixture("llama"), mesh, "fsdp_tp", adapter=out)
    assert again_model.lora == model.lora
    # Merged: a plain checkpoint whose logits are merge_and_unload's.
    with pytest.raises(pt.ConfigError, match="the model has LoRA adapters: save_peft"):
        pt.hf.save_hf(model, variables, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
    merged_dir = pt.hf.save_hf(model, variables, tmp_path / "merged", merge=True)
    assert sorted(f.name for f in merged_dir.iterdir()) == ["config.json", "model.safetensors"]
    assert not any("lora" in n for n in read_header(merged_dir / "model.safetensors"))
    merged_model, merged = pt.hf.load_hf(merged_dir, mesh, "fsdp_tp")
    assert merged_model.lora is None
    got = logits(merged_model, merged, np.load(fixture("llama") / "tokens.npy"), mesh, "fsdp_tp")
    assert np.abs(got - np.load(PEFT / "llama" / "merged_logits.npy")).max() <= 1e-4


def test_per_block_params_export_bit_exact(tmp_path):
    """scan_layers false: block_0, block_1 ... hold the adapters; the file is the same (no compile: cheap)."""
    model, variables = pt.hf.load_hf(fixture("llama"), adapter=PEFT / "llama_rslora", scan_layers=False)
    assert variables["params"]["block_1"]["mlp"]["wo_lora_a"].shape == (4, 64)
    out = pt.hf.save_peft(model, variables, tmp_path / "a")
    got, want = tensors(out / "adapter_model.safetensors"), tensors(PEFT / "llama_rslora/adapter_model.safetensors")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["down_proj", "o_proj", "q_proj", "v_proj"] and cfg["use_rslora"] is True
    assert cfg["base_model_name_or_path"] is None
    with pytest.raises(pt.ConfigError, match="has no LoRA adapters"):
        pt.hf.save_peft(*pt.hf.load_hf(fixture("llama")), tmp_path / "b")
    assert not (tmp_path / "b").exists()


def copy_adapter(tmp_path, name="llama", config=None, drop=(), replace=None):
    out = tmp_path / f"{name}-copy"
    shutil.copytree(PEFT / name, out)
    if config is not None:
        cfg = json.loads((out / "adapter_config.json").read_text())
        cfg.update(config)
        (out / "adapter_config.json").write_text(json.dumps(cfg))
    if drop or replace:
        ts = {k: v for k, v in tensors(out / "adapter_model.safetensors").items() if k not in drop}
        ts.update(replace or {})
        write_safetensors(
            out / "adapter_model.safetensors", [(k, v.dtype, v.shape) for k, v in ts.items()], ts.values()
        )
    return out


QA = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"
KB = "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"


@pytest.mark.parametrize(
    "config,message",
    [
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported; only LORA adapters load"),
        ({"bias": "all"}, "bias 'all' is not supported; only \"none\" (no trained biases)"),
        ({"use_dora": True}, "use_dora (DoRA (weight-decomposed LoRA)) is not supported; got True"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save (fully trained extra modules) is not supported"),
        ({"rank_pattern": {"q_proj": 8}}, "rank_pattern (per-module ranks) is not supported"),
        ({"layers_to_transform": [0]}, "layers_to_transform (adapters on some layers only)"),
        ({"target_modules": ["q_proj", "c_attn"]}, "target_modules 'c_attn' matches no linear layer of the llama"),
        ({"target_modules": ["embed_tokens"]}, "target_modules selects model.embed_tokens, which is not a linear"),
        (
            {"target_modules": r"model\.layers\.0\..*q_proj"},
            "target_modules selects model.layers.0.self_attn.q_proj but not model.layers.1.self_attn.q_proj",
        ),
        ({"r": 0}, "r must be a positive integer, got 0"),
    ],
)  # fmt: skip
def test_bad_adapter_configs_are_one_line_naming_the_key(tmp_path, config, message):
    adapter = copy_adapter(tmp_path, config=config)
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(fixture("llama"), adapter=adapter)
    assert str(e.value).startswith(f"{adapter / 'adapter_config.json'}: {message}")
    assert "\n" not in str(e.value)


def test_bad_adapter_weights_name_the_file_and_tensor(tmp_path):
    # An adapter for another base: Gemma's q_proj is (48, 32), the llama adapter's lora_B (32, 4).
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(fixture("gemma"), adapter=PEFT / "llama")
    assert str(e.value) == (
        f"{PEFT / 'llama/adapter_model.safetensors'}: tensor 'base_model.model.model.layers.0.self_attn.q_proj."
        f"lora_B.weight' has shape [32, 4]; {fixture('gemma')}/config.json and r=4 imply [48, 4] "
        f"(an adapter made for another base model?)"
    )
    missing = copy_adapter(tmp_path, drop=[QA])
    with pytest.raises(pt.CheckpointError, match=f"adapter_model.safetensors: tensor '{QA}' is missing"):
        pt.hf.load_hf(fixture("llama"), adapter=missing)
    extra = copy_adapter(tmp_path, "llama_rslora", replace={KB: np.zeros((16, 4), np.float32)})
    with pytest.raises(pt.CheckpointError, match=f"unexpected tensor '{KB}': not a LoRA weight of the modules"):
        pt.hf.load_hf(fixture("llama"), adapter=extra)
    with pytest.raises(pt.CheckpointError, match="has no adapter_config.json: a PEFT adapter is a folder with"):
        pt.hf.load_hf(fixture("llama"), adapter=fixture("llama"))
