"""Issue 27's dense families beyond test_logits / test_roundtrip (which cover them with the others): the tp
mesh, mixed local/global layers scanned and pipelined, each family's quirks, the text tower of a multimodal
checkpoint, the published configs' parameter counts, and the docs' generated table."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.models.hf import build
from partitioning.models.hf.catalog import families_markdown, section
from tests.hf.conftest import NEW_FAMILIES, expected, fixture, logits, mesh_for, tensors_of
from tests.hf.test_logits import check_logits
from tests.hf.test_roundtrip import same_bits

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_logits_on_a_tensor_parallel_mesh(name):
    params = check_logits(name, "tp", True)
    if name == "olmo2":  # the q/k norm spans every head: its scale splits with the heads, its mean crosses shards
        assert params["blocks"]["attn"]["q_norm"]["scale"].sharding.spec == P(None, "tensor", None)
    if name == "qwen3":  # per-head: one (kv,) scale every head shares, replicated
        assert params["blocks"]["attn"]["q_norm"]["scale"].sharding.spec == P(None, None)


def test_mixed_layers_run_pipelined_with_their_kinds_as_data():
    # gemma3: sliding, sliding, full, sliding over 2 stages: each stage indexes the layer kinds by layer.
    check_logits("gemma3", "pp", True)


def test_gemma3_reads_its_layer_kinds_and_their_ropes():
    model = pt.hf.hf_model(fixture("gemma3"))
    assert model.layer_types == ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")
    assert (model.sliding_window, model.local_rope_theta, model.local_rope_scaling) == (5, 100.0, None)
    assert (model.rope_theta, model.rope_scaling) == (1e6, {"rope_type": "linear", "factor": 4.0})
    assert (model.qk_norm, model.norm_placement, model.norm, model.attn_scale) == (
        "head",
        "pre_post",
        "rms_offset",
        0.25,
    )
    # The 4.x dialect of the same model: rope_theta + rope_scaling global, rope_local_base_freq local.
    cfg = json.loads((fixture("gemma3") / "config.json").read_text())
    del cfg["rope_parameters"], cfg["layer_types"]
    cfg.update(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 4.0}, rope_local_base_freq=100.0)
    again = build(cfg)
    for key in ("layer_types", "local_rope_theta", "rope_theta", "rope_scaling", "sliding_window"):
        assert getattr(again, key) == getattr(model, key), key


def test_gemma2_soft_caps_change_the_logits():
    # The fixture's attention cap bites: without it, the logits are not transformers' (the final cap, 2.5,
    # bites visibly: the logits' spread is below it).
    model, variables = pt.hf.load_hf(fixture("gemma2"))
    tokens, want = expected("gemma2")
    assert np.abs(logits(model.clone(attn_softcap=None), variables, tokens) - want).max() > 0.05
    assert np.abs(want).max() < 2.5
    assert (model.attn_softcap, model.final_softcap, model.layer_types) == (
        3.0,
        2.5,
        ("sliding_attention", "full_attention"),
    )


def test_phi3_fused_projections_split_per_shard():
    _, variables = pt.hf.load_hf(fixture("phi3"), mesh_for("fsdp_tp"), "fsdp_tp")
    attn, mlp = variables["params"]["blocks"]["attn"], variables["params"]["blocks"]["mlp"]
    assert attn["k"].sharding.spec == P(None, "tensor", None, "fsdp")  # (layers, kv_heads, kv, embed)
    assert mlp["wi_1"].sharding.spec == P(None, "tensor", "fsdp")  # (layers, mlp, embed)
    fused = tensors_of(fixture("phi3"))["model.layers.1.self_attn.qkv_proj.weight"]  # (3 * 4 * 8, 32)
    np.testing.assert_array_equal(np.asarray(attn["k"][1]).reshape(32, 32), fused[32:64])
    up = tensors_of(fixture("phi3"))["model.layers.0.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(np.asarray(mlp["wi_1"][0]), up[64:])


def test_the_text_tower_of_a_multimodal_checkpoint(tmp_path):
    model, variables = pt.hf.load_hf(fixture("gemma3_mm"), mesh_for("fsdp_tp"), "fsdp_tp")
    tokens, want = expected("gemma3_mm")
    np.testing.assert_allclose(
        logits(model, variables, tokens, mesh_for("fsdp_tp"), "fsdp_tp"), want, atol=1e-4, rtol=0
    )
    # Saved as the text model it is (the vision tower was never loaded): Gemma3ForCausalLM, model.* names.
    out = pt.hf.save_hf(model, variables, tmp_path / "text")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["model_type"], cfg["num_hidden_layers"]) == (
        ["Gemma3ForCausalLM"],
        "gemma3_text",
        2,
    )
    original, saved = tensors_of(fixture("gemma3_mm")), tensors_of(out)
    text = {k.replace("language_model.model.", "model."): v for k, v in original.items() if k.startswith("language_")}
    assert sorted(saved) == sorted(text)
    assert all(np.array_equal(saved[k].view(np.uint8), text[k].view(np.uint8)) for k in text)
    _, again = pt.hf.load_hf(out)
    assert same_bits(again, variables)


def count(path: str) -> int:
    model = pt.hf.hf_model(path, dtype="bfloat16")
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(pt.unbox(shapes)))


def test_published_configs_give_the_model_cards_parameter_counts(repo):
    # Qwen3-8B's card: 8.2B parameters, 6.95B without embeddings. Untied: 2 x 151,936 x 4,096 = 1,244,659,712
    # embedding parameters; 36 layers x 192,946,432 (q 4096x4096, k/v 4096x1024, o, SwiGLU 3 x 4096 x 12288,
    # 2 norms, q/k norms 2 x 128) + the final norm = 6,946,075,648.
    assert count(repo / "configs/hf/qwen3-8b") == 1_244_659_712 + 6_946_075_648 == 8_190_735_360
    # Gemma 3 27B's text tower (the vision tower is not built): 262,208 x 5,376 = 1,409,630,208 tied embedding
    # parameters (the report's 1,416M also counts the 6.2M multimodal projector) and 62 layers x 412,898,560
    # (4 norms, q/k norms of 128) + 5,376 = 25,599,716,096 non-embedding (the report: 25,600M).
    assert count(repo / "configs/hf/gemma-3-27b") == 1_409_630_208 + 25_599_716_096 == 27_009_346_304


def test_phi4_published_config_gives_its_parameter_count(repo):
    # Phi-4 (14.7B): untied 2 x 100,352 x 5,120 = 1,027,604,480 embedding parameters; 40 layers x 340,797,440
    # (qkv_proj 5,120 x (40 + 2 x 10) x 128, o_proj 5,120^2, gate_up_proj 2 x 17,920 x 5,120, down_proj, 2 norms)
    # + the final norm = 13,631,902,720.
    assert count(repo / "configs/hf/phi-4") == 1_027_604_480 + 13_631_902_720 == 14_659_507_200


def test_plan_prints_them_from_the_run_configs(repo, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(repo)
    r = run_cli_in_process("plan", "configs/qwen3_8b_hf.yaml", "--no-compile")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("hf/qwen3-8b (8,190,735,360 parameters) on mesh {'data': 1, 'fsdp': 16, 'tensor': 4}")
    r = run_cli_in_process("plan", "configs/gemma3_27b_hf.yaml", "--no-compile")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(
        "hf/gemma-3-27b (27,009,346,304 parameters) on mesh {'data': 1, 'fsdp': 32, 'tensor': 8}"
    )


def test_the_docs_list_the_families_the_tables_define(repo):
    text = (repo / "docs" / "pretrained.md").read_text()
    start, end = section(text)
    # Regenerate with: python -m partitioning.models.hf.catalog docs/pretrained.md
    assert text[start:end].strip() == families_markdown().strip()
    assert "| `Gemma3ForCausalLM`, `Gemma3ForConditionalGeneration` | gemma3 |" in text


def test_the_new_options_are_checked_and_never_exported_as_llama():
    from partitioning.models import GPT
    from partitioning.models.hf import export_config

    with pytest.raises(pt.ConfigError) as e:
        GPT(layers=2, layer_types=["sliding_attention"], sliding_window=4)
    assert e.value.arg == "layer_types"
    assert "one of full_attention, sliding_attention per layer (2)" in str(e.value)
    with pytest.raises(pt.ConfigError) as e:
        GPT(layers=2, qk_norm="heads")
    assert e.value.arg == "qk_norm"
    with pytest.raises(pt.ConfigError) as e:
        GPT(layers=2, local_rope_theta=10.0)
    assert e.value.arg == "local_rope_theta"
    for option in ({"qk_norm": "head"}, {"norm_placement": "post"}, {"final_softcap": 30.0}):
        with pytest.raises(pt.ConfigError) as e:
            export_config(GPT(layers=2, **option))
        assert e.value.arg == next(iter(option))


def test_phi4_fused_qkv_splits_heads_then_kv_heads():
    # qkv_proj rows are [heads*d, kv*d, kv*d] = [32, 16, 16] (4 heads, 2 kv heads of 8): each shard reads its rows.
    model, variables = pt.hf.load_hf(fixture("phi4"), mesh_for("fsdp_tp"), "fsdp_tp")
    attn = variables["params"]["blocks"]["attn"]
    assert (model.heads, model.kv_heads, model.rope_theta) == (4, 2, 250000.0)
    assert attn["k"].sharding.spec == P(None, "tensor", None, "fsdp")  # (layers, kv_heads, kv, embed)
    fused = tensors_of(fixture("phi4"))["model.layers.1.self_attn.qkv_proj.weight"]
    assert fused.shape == (64, 32)
    np.testing.assert_array_equal(np.asarray(attn["q"][1]).reshape(32, 32), fused[:32])
    np.testing.assert_array_equal(np.asarray(attn["k"][1]).reshape(16, 32), fused[32:48])
    np.testing.assert_array_equal(np.asarray(attn["v"][1]).reshape(16, 32), fused[48:])


def test_phi4_mini_rotates_part_of_each_head_with_longrope():
    model = pt.hf.hf_model(fixture("phi4_mini"))
    assert model.partial_rotary_factor == 0.75 and model.rope_scaling["rope_type"] == "longrope"
    assert model.rope_scaling["long_factor"] == [1.0, 4.0, 16.0]
    _, variables = pt.hf.load_hf(fixture("phi4_mini"))
    tokens, want = expected("phi4_mini")
    long_as_short = {**model.rope_scaling, "long_factor": [1.0, 1.5, 2.0]}
    # Plain RoPE, every feature rotated, or the short factors past the original 8 positions: other models.
    for wrong in (
        model.clone(rope_scaling=None),
        model.clone(rope_scaling=None, partial_rotary_factor=1.0),
        model.clone(rope_scaling=long_as_short),
    ):
        assert np.abs(logits(wrong, variables, tokens) - want).max() > 0.05
    # A sequence of 8 (the original length) takes the short factors.
    np.testing.assert_allclose(
        logits(model, variables, tokens[:, :8]),
        logits(model.clone(rope_scaling=long_as_short), variables, tokens)[:, :8],
        atol=1e-5,
    )


def test_olmo3_mixes_sliding_and_full_layers_with_yarn_on_the_full_ones():
    model = pt.hf.hf_model(fixture("olmo3"))
    assert model.layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert (model.sliding_window, model.norm_placement, model.qk_norm) == (5, "post", "all")
    assert model.rope_scaling["rope_type"] == "yarn" and model.rope_scaling["factor"] == 4.0
    assert (model.local_rope_theta, model.local_rope_scaling) == (10000.0, None)  # the sliding layers: plain RoPE


def test_smollm3_leaves_rope_off_its_nope_layers():
    model = pt.hf.hf_model(fixture("smollm3"))
    assert model.nope_layers == (1, 3) and model.layer_types == ("full_attention", "sliding_attention") * 2
    assert (model.rope_theta, model.tie_embeddings, model.sliding_window) == (2000000.0, True, 5)
    _, variables = pt.hf.load_hf(fixture("smollm3"))
    tokens, want = expected("smollm3")
    assert np.abs(logits(model.clone(nope_layers=None), variables, tokens) - want).max() > 0.05
    # Unscanned, each block gets its flags as Python values: the same logits.
    blocks, variables = pt.hf.load_hf(fixture("smollm3"), scan_layers=False)
    np.testing.assert_allclose(logits(blocks, variables, tokens), want, atol=1e-4, rtol=0)
    with pytest.raises(pt.ConfigError) as e:
        build({**json.loads((fixture("smollm3") / "config.json").read_text()), "no_rope_layers": [1, 0]})
    assert str(e.value) == "no_rope_layers must have one 0 or 1 for each of the 4 layers"
