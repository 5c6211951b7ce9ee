"""Every bad checkpoint is one CheckpointError line naming the file and the tensor or key; nothing is unpickled."""

import json
import pickle
import shutil
import sys

import numpy as np
import pytest

import partitioning as pt
from tests.hf.conftest import fixture, tensors_of


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and msg
    return msg


def config_copy(tmp_path, name: str, **changes) -> str:
    out = tmp_path / name
    shutil.copytree(fixture(name), out, ignore=shutil.ignore_patterns("v4"))
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_missing_tensor(damaged):
    path = damaged("llama", drop=["model.layers.1.mlp.up_proj.weight"])
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == (
        f"{path}: tensor 'model.layers.1.mlp.up_proj.weight' is missing (expected shape [64, 32] from config.json)"
    )


def test_extra_tensor(damaged):
    path = damaged("qwen2", add={"model.layers.2.self_attn.q_proj.weight": np.zeros((32, 32), np.float32)})
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == (
        f"{path / 'model.safetensors'}: unexpected tensor 'model.layers.2.self_attn.q_proj.weight': "
        "not part of the model config.json describes"
    )


def test_misshaped_tensor(damaged):
    path = damaged("gemma", replace={"model.layers.0.self_attn.k_proj.weight": np.zeros((24, 32), np.float32)})
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == (
        f"{path / 'model.safetensors'}: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [24, 32]; "
        "config.json implies [12, 32]"
    )


def test_tolerated_non_weights(damaged):
    # Buffers older transformers saved, a tied lm_head duplicate and GPT-2's files without the prefix.
    path = damaged("llama_tied", add={"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)})
    tensors = {"lm_head.weight": np.zeros((320, 32), np.float32)}
    pt.hf.load_hf(damaged("llama_tied", add=tensors))
    pt.hf.load_hf(path)
    # The GPT-2 release files say h.0..., wte...: no `transformer.` prefix.
    bare = {k.removeprefix("transformer."): v for k, v in tensors_of(fixture("gpt2")).items()}
    bare["h.0.attn.bias"] = np.ones((1, 1, 32, 32), np.float32)
    out = damaged("gpt2", drop=list(tensors_of(fixture("gpt2"))), add=bare)
    _, variables = pt.hf.load_hf(out)
    assert variables["params"]["pos_embedding"].shape == (32, 32)


def test_unknown_architecture(tmp_path):
    path = config_copy(tmp_path, "llama", architectures=["FalconForCausalLM"])
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == (
        f"{path / 'config.json'}: architecture 'FalconForCausalLM' is not supported; supported: "
        "DeepseekV3ForCausalLM, GPT2LMHeadModel, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, "
        "Gemma4ForCausalLM, Gemma4ForConditionalGeneration, GemmaForCausalLM, GptOssForCausalLM, LlamaForCausalLM, "
        "MistralForCausalLM, MixtralForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, Phi3ForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, "
        "SmolLM3ForCausalLM"
    )
    with pytest.raises(pt.CheckpointError, match="architecture 'FalconForCausalLM'"):
        pt.hf.hf_model(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "llama"
    shutil.copytree(fixture("llama"), path, ignore=shutil.ignore_patterns("v4"))
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    msg = one_line(e)
    assert msg.startswith(f"{path / 'model.safetensors'}: truncated: tensor 'model.norm.weight' ends at byte ")
    assert msg.endswith(f"but the file has {len(data) - 100} bytes")
    (path / "model.safetensors").write_bytes(data[:5])
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == f"{path / 'model.safetensors'}: not a safetensors file (truncated or damaged header)"


def test_a_missing_shard_of_an_index(tmp_path):
    path = tmp_path / "sharded"
    shutil.copytree(fixture("llama_sharded"), path)
    (path / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e).startswith(
        f"{path / 'model.safetensors.index.json'}: shard model-00003-of-00004.safetensors (tensor "
    )


def test_pickle_only_checkpoints_are_never_unpickled(tmp_path, monkeypatch):
    path = tmp_path / "pt"
    path.mkdir()
    shutil.copy(fixture("llama") / "config.json", path)
    (path / "pytorch_model.bin").write_bytes(pickle.dumps({"a": 1}))

    def never(*a, **k):
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "load", never)
    monkeypatch.setattr(pickle, "loads", never)
    monkeypatch.setattr(pickle, "Unpickler", never)
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e).startswith(f"{path} has PyTorch pickle weights (pytorch_model.bin) but no safetensors; convert")
    assert "torch" not in sys.modules


def test_missing_or_broken_config(tmp_path):
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(tmp_path / "nope")
    assert one_line(e).startswith(f"{tmp_path / 'nope'} does not exist")
    (tmp_path / "empty").mkdir()
    shutil.copy(fixture("llama") / "model.safetensors", tmp_path / "empty")
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(tmp_path / "empty")
    assert one_line(e).startswith(f"{tmp_path / 'empty'} has no config.json")
    (tmp_path / "empty" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n "x": }')
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.hf_model(tmp_path / "empty")
    assert one_line(e).startswith(f"{tmp_path / 'empty' / 'config.json'}:2: not valid JSON")


def test_no_weights_at_all(tmp_path):
    path = config_copy(tmp_path, "llama")
    for f in path.glob("*.safetensors"):
        f.unlink()
    assert pt.hf.hf_model(path).layers == 2  # config.json is enough to build (and plan) the model
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.load_hf(path)
    assert one_line(e) == f"{path} has no model.safetensors or model.safetensors.index.json"


@pytest.mark.parametrize(
    "name,changes,message",
    [
        (
            "llama",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}},
            "rope_parameters: rope_type 'dynamic' is not supported; supported: default, llama3, linear, yarn, longrope",
        ),
        (
            "llama",
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
            "rope_parameters: rope_scaling of type 'llama3' needs low_freq_factor, high_freq_factor",
        ),
        ("llama", {"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported; supported: silu"),
        (
            "qwen2",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "layer_types": None},
            "sliding windows on some layers only (layer_types / max_window_layers) are not supported",
        ),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx is not supported"),
        ("gemma", {"final_logit_softcapping": 30.0}, "final_logit_softcapping is not supported (a Gemma 2 option)"),
        (
            "phi3",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 1e4,
                    "short_factor": [1.0],
                    "long_factor": [1.0],
                }
            },
            "rope_parameters: longrope's short_factor and long_factor need 4 entries each (half of the 8 rotated "
            "features), got 1 and 1",
        ),
        (
            "llama",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}},
            "partial_rotary_factor 0.75 is not supported (only 1.0: rotate every feature)",
        ),
        (
            "gemma3",
            {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_type": "yarn"}}},
            "sliding_attention rope_parameters: rope_scaling of type 'yarn' needs factor",
        ),
        (
            "gemma3",
            {"use_bidirectional_attention": True},
            "use_bidirectional_attention is not supported (the decoder is causal)",
        ),
        (
            "gemma2",
            {"layer_types": ["sliding_attention", "chunked_attention"]},
            "layer_types must list full_attention or sliding_attention for each of the 2 layers",
        ),
        ("olmo2", {"hidden_act": "gelu_python"}, "hidden_act 'gelu_python' is not supported; supported: silu"),
    ],
)
def test_unsupported_config_fields(tmp_path, name, changes, message):
    path = config_copy(tmp_path, name, **changes)
    with pytest.raises(pt.CheckpointError) as e:
        pt.hf.hf_model(path)
    assert one_line(e).startswith(f"{path / 'config.json'}: {message}")


def test_bad_arguments_name_the_argument():
    with pytest.raises(pt.ConfigError) as e:
        pt.hf.hf_model(fixture("llama"), dtype="int8")
    assert e.value.arg == "dtype"
