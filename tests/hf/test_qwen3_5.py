"""Qwen3.5 checkpoints made by transformers (issue 37): linear-attention layers (the gated delta rule as a chunked
scan, its state and convolution cached for generation) between gated full-attention layers; logits on fsdp,
fsdp_tp and tp, the round trip bit-exact, transformers' greedy tokens."""

import json
import os
import subprocess

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from tests.hf.conftest import expected, fixture, logits, mesh_for, tensors_of
from tests.hf.test_roundtrip import HF_PYTHON, same_bits


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_logits_match_transformers(preset):
    mesh = mesh_for(preset)
    model, variables = pt.hf.load_hf(fixture("qwen3_5"), mesh, preset)
    tokens, want = expected("qwen3_5")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    p = variables["params"]
    if (
        preset == "fsdp_tp"
    ):  # the full layers' heads (and their gates) split over tensor; the fused q/k/v channels whole
        assert p["block_1"]["attn"]["q_gate"].sharding.spec == P("tensor", None, "fsdp")  # (heads, kv, embed)
        assert p["block_0"]["attn"]["qkv"].sharding.spec == P(None, "fsdp")  # (linear_qkv, embed)
        assert p["block_0"]["attn"]["conv"].sharding.spec == P(None, None)  # (linear_qkv, conv)


def test_the_layers_and_their_options():
    model = pt.hf.hf_model(fixture("qwen3_5"))
    assert (model.linear_layers, model.scan_layers, model.attn_gate) == ((0, 2), False, True)
    assert model.linear_attn == {"key_heads": 2, "value_heads": 4, "key_dim": 8, "value_dim": 8, "conv_kernel": 4}
    assert (model.partial_rotary_factor, model.norm, model.qk_norm) == (0.25, "rms_offset", "head")


def test_the_chunk_size_changes_nothing():
    # 16 tokens in chunks of 4: the state crosses three chunk boundaries, and the logits are the one chunk's.
    model, variables = pt.hf.load_hf(fixture("qwen3_5"))
    tokens, want = expected("qwen3_5")
    chunked = model.clone(linear_attn={**model.linear_attn, "chunk": 4})
    np.testing.assert_allclose(logits(chunked, variables, tokens), want, atol=1e-4, rtol=0)
    # Without the output gate, another model.
    gated = jax.tree.map(lambda x: x, variables)
    for i in (1, 3):
        gated["params"][f"block_{i}"]["attn"]["q_gate"] = np.full_like(gated["params"]["block_1"]["attn"]["q_gate"], 0)
    assert np.abs(logits(model, gated, tokens) - want).max() > 0.05


def test_round_trip_is_bit_exact_and_transformers_reads_it(tmp_path, repo):
    model, variables = pt.hf.load_hf(fixture("qwen3_5"), mesh_for("fsdp"), "fsdp")
    out = pt.hf.save_hf(model, variables, tmp_path / "qwen3_5")
    want, got = tensors_of(fixture("qwen3_5")), tensors_of(out)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)) for k in want)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]
    _, again = pt.hf.load_hf(out, scan_layers=False)
    assert same_bits(again, variables)
    if HF_PYTHON:
        tool = str(repo / "tools" / "make_hf_fixtures.py")
        check = [tool, "--check", str(out), "--expect", str(fixture("qwen3_5"))]
        r = subprocess.run([HF_PYTHON, *check], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
        assert r.returncode == 0, r.stdout + r.stderr


def test_generate_carries_the_state_and_gives_transformers_greedy_tokens():
    mesh = mesh_for("fsdp_tp")
    model, variables = pt.hf.load_hf(fixture("qwen3_5"), mesh, "fsdp_tp")
    prompt = [int(t) for t in np.load(fixture("qwen3_5") / "tokens.npy")[0, :5]]
    want = np.load(fixture("qwen3_5") / "greedy.npy").tolist()
    got = pt.decode.generate(model, variables["params"], prompt, mesh=mesh, rules="fsdp_tp", max_tokens=len(want))
    assert got == want
    # The linear layers cache their state and the convolution's last 3 inputs, whatever the length.
    cache = jax.eval_shape(model.clone(decode=True).init, jax.random.key(0), np.zeros((1, 12), np.int32))["cache"]
    linear = pt.unbox(cache)["block_0"]["attn"]
    assert {k: v.shape for k, v in linear.items()} == {"conv_state": (1, 3, 64), "recurrent_state": (1, 4, 8, 8)}
    assert pt.unbox(cache)["block_1"]["attn"]["cached_key"].shape == (1, 12, 2, 16)


def test_packed_rows_are_refused_in_linear_layers():
    model, variables = pt.hf.load_hf(fixture("qwen3_5"))
    tokens = np.zeros((1, 8), np.int32)
    with pytest.raises(pt.ConfigError, match="packed rows"):
        model.apply(variables, tokens, segment_ids=np.ones((1, 8), np.int32))


def test_the_text_tower_of_a_multimodal_checkpoint(tmp_path):
    mesh = mesh_for("fsdp_tp")
    model, variables = pt.hf.load_hf(fixture("qwen3_5_mm"), mesh, "fsdp_tp")
    tokens, want = expected("qwen3_5_mm")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "fsdp_tp"), want, atol=1e-4, rtol=0)
    # Saved as the text model it is (the vision tower was never loaded): Qwen3_5ForCausalLM, model.* names.
    out = pt.hf.save_hf(model, variables, tmp_path / "text")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["model_type"], cfg["num_hidden_layers"]) == (
        ["Qwen3_5ForCausalLM"],
        "qwen3_5_text",
        2,
    )
    original, saved = tensors_of(fixture("qwen3_5_mm")), tensors_of(out)
    text = {k.replace("model.language_model.", "model."): v for k, v in original.items() if "visual" not in k}
    assert sorted(saved) == sorted(text)
    assert all(np.array_equal(saved[k].view(np.uint8), text[k].view(np.uint8)) for k in text)
