"""config.json in both transformers dialects, class defaults for missing keys, family quirks; the name map engine."""

import json

import numpy as np
import pytest

import partitioning as pt
from partitioning.hf import read as hf_read
from partitioning.hf.files import discover, parse_size, plan_shards
from partitioning.hf.pattern import Pattern
from partitioning.hf.read import Reader, pieces
from partitioning.models.hf import build
from tests.hf.conftest import FAMILIES, fixture, tensors_of

OPTIONS = ("embed", "heads", "kv_heads", "head_dim", "mlp", "layers", "norm", "norm_eps", "tie_embeddings")


def options(model, names=OPTIONS + ("rope_theta", "rope_scaling", "sliding_window", "qkv_bias", "mlp_act")):
    return {k: getattr(model, k) for k in names}


def test_family_names_and_relative_paths(monkeypatch):
    assert [pt.hf.hf_family(fixture(n)) for n in FAMILIES] == [
        *("llama", "llama", "mistral", "qwen2", "gemma", "gpt2"),
        *("qwen3", "gemma2", "gemma3", "phi3", "olmo2"),
        *("phi3", "phi3", "olmo3", "smollm3"),
    ]
    assert pt.hf.hf_family(fixture("gemma3_mm")) == "gemma3"
    monkeypatch.chdir(fixture("gpt2").parent)
    assert pt.hf.hf_family("qwen2/config.json") == "qwen2"
    _, variables = pt.hf.load_hf("gpt2/config.json")
    assert variables["params"]["pos_embedding"].shape == (32, 32)


def test_transformers_4_dialect_is_the_same_model():
    # rope_theta + rope_scaling + torch_dtype (4.x) vs rope_parameters + dtype (5.x): transformers 5 gives
    # both the same logits (tools/make_hf_fixtures.py checks it), and so must we.
    v4, v5 = pt.hf.hf_model(fixture("llama") / "v4"), pt.hf.hf_model(fixture("llama"))
    assert options(v4) == options(v5)
    assert v5.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8.0,
    }
    _, variables = pt.hf.load_hf(fixture("llama") / "v4")
    assert variables["params"]["unembed"].shape == (320, 32)  # (vocab, embed), as lm_head


def test_missing_keys_take_the_transformers_class_defaults():
    llama = build({"architectures": ["LlamaForCausalLM"]})
    assert (llama.embed, llama.heads, llama.kv_heads, llama.layers, llama.vocab_size) == (4096, 32, 32, 32, 32000)
    assert (llama.norm_eps, llama.rope_theta, llama.tie_embeddings) == (1e-6, 10000.0, False)
    assert build({"architectures": ["MistralForCausalLM"]}).sliding_window == 4096
    assert build({"architectures": ["MistralForCausalLM"], "sliding_window": None}).sliding_window is None
    gemma = build({"architectures": ["GemmaForCausalLM"], "num_attention_heads": 2, "num_key_value_heads": 1})
    assert (gemma.head_dim, gemma.tie_embeddings, gemma.mlp_act) == (256, True, "gelu_tanh")
    gpt2 = build({"architectures": ["GPT2LMHeadModel"]})
    assert (gpt2.embed, gpt2.mlp, gpt2.max_positions, gpt2.norm_eps) == (768, 3072, 1024, 1e-5)


def test_family_quirks():
    # Gemma's legacy `gelu` is the tanh approximation; 4.x configs say hidden_activation.
    g = {
        "architectures": ["GemmaForCausalLM"],
        "hidden_act": "gelu",
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    assert build(g).mlp_act == "gelu_tanh"
    assert build({**g, "hidden_activation": "gelu_pytorch_tanh"}).mlp_act == "gelu_tanh"
    assert build({**g, "query_pre_attn_scalar": 144}).attn_scale == 144**-0.5
    # GPT-2 under transformers' attribute_map names; unscaled attention.
    gpt2 = build({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64, "num_hidden_layers": 3, "n_head": 4})
    assert (gpt2.embed, gpt2.layers, gpt2.heads) == (64, 3, 4)
    assert build({"architectures": ["GPT2LMHeadModel"], "scale_attn_weights": False}).attn_scale == 1.0
    # Qwen2: a window only when use_sliding_window and every layer slides.
    q = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "sliding_window": 8}
    assert build(q).sliding_window is None
    assert build({**q, "use_sliding_window": True, "max_window_layers": 0}).sliding_window == 8
    assert build({**q, "use_sliding_window": True, "max_window_layers": 2}).sliding_window is None
    # Llama's attention_bias is q, k, v and o; Qwen2's q, k, v only.
    assert (build({"architectures": ["LlamaForCausalLM"], "attention_bias": True}).out_bias, build(q).out_bias) == (
        True,
        False,
    )


def test_config_options_and_dtypes_pass_through():
    model = pt.hf.hf_model(fixture("gemma") / "config.json", dtype="bfloat16", scan_layers=False, remat="full")
    assert (model.dtype, model.param_dtype, model.scan_layers, model.remat) == ("bfloat16", "float32", False, "full")
    assert json.loads(model.hf_config) == json.loads((fixture("gemma") / "config.json").read_text())
    _, variables = pt.hf.load_hf(fixture("llama_bf16"), param_dtype="bfloat16")
    q = variables["params"]["blocks"]["attn"]["q"]
    assert q.dtype == np.dtype("bfloat16")
    raw = tensors_of(fixture("llama_bf16"))["model.layers.1.self_attn.q_proj.weight"]  # (h k, d)
    assert np.array_equal(np.asarray(q[1]).reshape(32, 32).view(np.uint16), raw.view(np.uint16))  # (h, k, d)


def test_patterns():
    p = Pattern.parse("d (3 h k) -> d h k")
    assert p.file_shape((32, 4, 8)) == (32, 96)
    assert p.atom_box(((0, 32), (2, 4), (0, 8)), part=1) == ((0, 32), (1, 2), (2, 4), (0, 8))
    q, k, v = (np.random.default_rng(i).normal(size=(32, 4, 8)) for i in range(3))
    fused = p.to_file([q, k, v])
    assert np.array_equal(fused[:, 32:64].reshape(32, 4, 8), k)
    with pytest.raises(ValueError, match="named axes"):
        Pattern.parse("(h k) d -> d h")


def test_a_shard_reads_only_its_bytes():
    s = discover(fixture("llama"))["model.layers.0.self_attn.q_proj.weight"]  # (h k, d) = (32, 32) float32
    full = tensors_of(fixture("llama"))[s.name].reshape(4, 8, 32).transpose(2, 0, 1)  # (d, h, k)
    box = ((0, 16), (0, 2), (0, 8))  # half of embed (fsdp) x half of the heads (tensor)
    buf = np.empty((16, 2, 8), np.float32)
    with Reader() as reader:
        reader.tensor(s, Pattern.parse("(h k) d -> d h k"), None, (32, 4, 8), [(box, buf)])
    assert np.array_equal(buf, full[:16, :2])
    assert reader.bytes_read == 15 * 128 + 64  # rows 0..15 of the file, the first half of the last one
    # Split for bounded memory: every piece within the limit, together the box.
    parts = list(pieces(((0, 16), (0, 8), (0, 32)), (1024, 128, 4), 4, limit=600))
    assert all((b[0][1] - b[0][0] - 1) * 1024 + (b[1][1] - b[1][0] - 1) * 128 + 128 <= 600 for b in parts)
    assert sum((b[0][1] - b[0][0]) * (b[1][1] - b[1][0]) for b in parts) == 16 * 8


def test_shard_sizes_as_transformers_counts_them():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 * 2**20 and parse_size(7) == 7
    with pytest.raises(pt.CheckpointError, match="max_shard_size '5 parsecs'"):
        parse_size("5 parsecs")
    assert plan_shards([("a", 4), ("b", 4), ("c", 9), ("d", 2), ("e", 7)], 8) == [["c"], ["a", "b"], ["d"], ["e"]]


def test_long_runs_are_read_without_the_gaps_between_them(monkeypatch):
    # A multi-process FSDP shard holds part of every row: with runs long enough, only they are read.
    monkeypatch.setattr(hf_read, "MIN_RUN", 64)
    s = discover(fixture("llama"))["model.layers.0.self_attn.q_proj.weight"]  # (h k, d) = (32, 32) float32
    full = tensors_of(fixture("llama"))[s.name].reshape(4, 8, 32).transpose(2, 0, 1)  # (d, h, k)
    box = ((0, 16), (0, 2), (0, 8))
    buf = np.empty((16, 2, 8), np.float32)
    with Reader() as reader:
        reader.tensor(s, Pattern.parse("(h k) d -> d h k"), None, (32, 4, 8), [(box, buf)])
    assert np.array_equal(buf, full[:16, :2])
    assert reader.bytes_read == 16 * 64  # 16 rows x the first 16 of their 32 floats
    assert hf_read.runs(((0, 2), (0, 8), (0, 16)), (4, 8, 32), (1024, 128, 4), 4)[:2] == [(0, 64), (128, 64)]
