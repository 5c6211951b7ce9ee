"""Gemma 4 checkpoints made by transformers (issue 37): global layers of their own head size and kv heads (values
from the keys), value norms, proportional RoPE, per-layer inputs, layer scalars; logits on fsdp, fsdp_tp and tp,
the round trip bit-exact, transformers' greedy tokens, the text tower of a multimodal checkpoint."""

import json
import os
import subprocess

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.models.hf.model import build
from tests.hf.conftest import MESHES, expected, fixture, logits, mesh_for, tensors_of
from tests.hf.test_families import count
from tests.hf.test_roundtrip import HF_PYTHON, same_bits


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_shared_kv_layers_logits_match_transformers(preset):
    # gemma4_shared: layers 3 and 4 reuse the keys and values of layers 2 and 1 (E2B / E4B's num_kv_shared_layers).
    mesh = mesh_for(preset)
    model, variables = pt.hf.load_hf(fixture("gemma4_shared"), mesh, preset)
    tokens, want = expected("gemma4_shared")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    p = pt.unbox(variables)["params"]
    assert set(p["block_3"]["attn"]) == {"q", "o", "q_norm"}  # no keys or values of its own
    assert p["block_3"]["mlp"]["wi_0"].shape == (64, 32)  # twice as wide (use_double_wide_mlp)
    assert p["block_2"]["mlp"]["wi_0"].shape == (32, 32)


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_the_31b_shape_with_biases_matches_transformers(preset):
    # gemma4_dense: no per-layer inputs, values from the keys on the global layers, q/k/v/o biases (the global
    # layers' values are their biased keys), untied logits, proportional RoPE with a factor of 2.
    mesh = mesh_for(preset)
    model, variables = pt.hf.load_hf(fixture("gemma4_dense"), mesh, preset)
    tokens, want = expected("gemma4_dense")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    p = pt.unbox(variables)["params"]
    assert "ple" not in p and "unembed" in p and "per_layer" not in p["block_0"]
    assert {k for k in p["block_1"]["attn"] if "bias" in k} == {"q_bias", "k_bias", "o_bias"}


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_logits_match_transformers(preset):
    mesh = mesh_for(preset)
    model, variables = pt.hf.load_hf(fixture("gemma4"), mesh, preset)
    tokens, want = expected("gemma4")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    p = variables["params"]
    table, gate = p["ple"]["per_layer_embedding"], p["block_0"]["per_layer"]["gate"]  # (vocab, layers, width)
    specs = {
        "fsdp": (P("fsdp", None, None), P(None, "fsdp")),
        "fsdp_tp": (P("tensor", None, None), P("tensor", "fsdp")),  # gate: (per_layer, embed)
        "tp": (P("tensor", None, None), P("tensor", None)),
    }
    assert (table.sharding.spec, gate.sharding.spec) == specs[preset]


def test_the_layers_and_their_options():
    model = pt.hf.hf_model(fixture("gemma4"))
    assert (model.scan_layers, model.head_dim, model.kv_heads) == (False, 8, 2)
    assert (model.global_head_dim, model.global_kv_heads, model.global_k_eq_v) == (16, 1, True)
    assert (model.per_layer_input, model.per_layer_vocab, model.v_norm, model.layer_scalar) == (8, 320, True, True)
    assert model.rope_scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    assert (model.rope_theta, model.local_rope_theta, model.attn_scale, model.final_softcap) == (1e6, 1e4, 1.0, 30.0)
    _, variables = pt.hf.load_hf(fixture("gemma4"))
    attn = pt.unbox(variables)["params"]["block_1"]["attn"]
    shapes = {k: v.shape for k, v in attn.items() if not isinstance(v, dict)}
    assert shapes == {"q": (4, 16, 32), "k": (1, 16, 32), "o": (32, 4, 16)}  # a global layer: no v
    assert pt.unbox(variables)["params"]["block_0"]["attn"]["v"].shape == (2, 8, 32)


def test_each_new_part_changes_the_logits():
    model, variables = pt.hf.load_hf(fixture("gemma4"))
    tokens, want = expected("gemma4")
    for change in (
        lambda p: p["ple"].update(per_layer_embedding=np.zeros_like(p["ple"]["per_layer_embedding"])),
        lambda p: p["block_2"].update(layer_scalar=np.ones_like(p["block_2"]["layer_scalar"])),
    ):
        other = pt.unbox(variables)
        other = {"params": {k: dict(v) if isinstance(v, dict) else v for k, v in other["params"].items()}}
        change(other["params"])
        assert np.abs(logits(model, other, tokens) - want).max() > 1e-2
    for option in ({"v_norm": False}, {"rope_scaling": None}):
        assert np.abs(logits(model.clone(**option), variables, tokens) - want).max() > 1e-2


@pytest.mark.parametrize("name", ["gemma4", "gemma4_shared", "gemma4_dense"])
def test_round_trip_is_bit_exact_and_transformers_reads_it(tmp_path, repo, name):
    model, variables = pt.hf.load_hf(fixture(name), mesh_for("fsdp"), "fsdp")
    out = pt.hf.save_hf(model, variables, tmp_path / name)
    want, got = tensors_of(fixture(name)), tensors_of(out)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)) for k in want)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Gemma4ForCausalLM"]
    _, again = pt.hf.load_hf(out)
    assert same_bits(again, variables)
    if HF_PYTHON:
        tool = str(repo / "tools" / "make_hf_fixtures.py")
        check = [tool, "--check", str(out), "--expect", str(fixture(name))]
        r = subprocess.run([HF_PYTHON, *check], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["gemma4", "gemma4_shared"])
def test_generate_gives_transformers_greedy_tokens(name):
    # fsdp: the fixtures' layers have one kv head, which a tensor axis of 2 cannot split in the cache.
    mesh = mesh_for("fsdp")
    model, variables = pt.hf.load_hf(fixture(name), mesh, "fsdp")
    prompt = [int(t) for t in np.load(fixture(name) / "tokens.npy")[0, :5]]
    want = np.load(fixture(name) / "greedy.npy").tolist()
    got = pt.decode.generate(model, variables["params"], prompt, mesh=mesh, rules="fsdp", max_tokens=len(want))
    assert got == want


@pytest.mark.parametrize(
    "change, message",
    [
        ({"enable_moe_block": True}, "enable_moe_block: mixture-of-experts layers"),
        ({"num_kv_shared_layers": 4}, "kv_shared_layers must be below layers"),
        ({"num_kv_shared_layers": 3}, "no earlier full_attention layer to share"),
        ({"per_layer_config": {"0": {"head_dim": 16}}}, "per_layer_config must give every full_attention layer"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "rope_type 'yarn' is not supported"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention: all is not supported"),
    ],
)
def test_what_is_refused_is_named(change, message):
    cfg = {**json.loads((fixture("gemma4") / "config.json").read_text()), **change}
    with pytest.raises(pt.ConfigError, match=message):
        build(cfg)


def test_the_text_tower_of_a_multimodal_checkpoint(tmp_path):
    mesh = mesh_for("fsdp_tp")
    model, variables = pt.hf.load_hf(fixture("gemma4_mm"), mesh, "fsdp_tp")
    tokens, want = expected("gemma4_mm")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "fsdp_tp"), want, atol=1e-4, rtol=0)
    assert (model.global_head_dim, model.global_kv_heads, model.global_k_eq_v) == (16, None, False)
    # Saved as the text model it is (the vision tower was never loaded): Gemma4ForCausalLM, model.* names.
    out = pt.hf.save_hf(model, variables, tmp_path / "text")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["model_type"], cfg["num_hidden_layers"]) == (
        ["Gemma4ForCausalLM"],
        "gemma4_text",
        2,
    )
    original, saved = tensors_of(fixture("gemma4_mm")), tensors_of(out)
    text = {k.replace("model.language_model.", "model."): v for k, v in original.items() if "language_model" in k}
    assert sorted(saved) == sorted(text)
    assert all(np.array_equal(saved[k].view(np.uint8), text[k].view(np.uint8)) for k in text)


def test_the_31b_config_gives_transformers_parameter_count(repo):
    # configs/hf/gemma-4-31b: the text_config fields public sources quote for google/gemma-4-31B (not a verbatim
    # download). transformers' Gemma4ForCausalLM of it has 30,697,345,280 parameters (the card's 30.7B): tied
    # 262,144 x 5,376 = 1,409,286,144 embedding ones; 50 sliding layers x 478,959,104 (q, k, v, o of 32 / 16 / 16
    # heads of 256, GeGLU 3 x 5,376 x 21,504, 4 norms, q/k norms) and 10 global ones x 534,009,856 (32 heads and
    # 4 kv heads of 512, values from the keys: no v) + the final norm = 29,288,059,136. Here each layer's scalar
    # (transformers' `layer_scalar` buffer, saved in the checkpoint) is a parameter too: 60 more.
    total = 1_409_286_144 + 50 * 478_959_104 + 10 * 534_009_856 + 5_376
    assert count(repo / "configs/hf/gemma-4-31b") == total + 60 == 30_697_345_280 + 60
    model = pt.hf.hf_model(repo / "configs/hf/gemma-4-31b")
    assert (model.global_kv_heads, model.global_k_eq_v, model.per_layer_input, model.sliding_window) == (
        4,
        True,
        None,
        1024,
    )


def test_plan_prints_the_31b_from_its_run_config(repo, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(repo)
    r = run_cli_in_process("plan", "configs/gemma4_31b_hf.yaml", "--no-compile")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(
        "hf/gemma-4-31b (30,697,345,340 parameters) on mesh {'data': 1, 'fsdp': 32, 'tensor': 4}"
    )


def test_explicit_axes_name_the_per_layer_inputs_gather_and_contraction():
    # On Explicit axes JAX cannot infer the per-layer table's gather (its vocab split over tensor) nor the
    # per-layer projection back to embed (its width split over tensor): both are named.
    mesh = pt.make_mesh(MESHES["fsdp_tp"], axis_types="explicit")
    model, variables = pt.hf.load_hf(fixture("gemma4_mm"), mesh, "fsdp_tp")
    tokens, want = expected("gemma4_mm")
    tokens, want = np.tile(tokens, (2, 1)), np.tile(want, (2, 1, 1))  # the batch splits over fsdp (4)
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "fsdp_tp"), want, atol=1e-4, rtol=0)
