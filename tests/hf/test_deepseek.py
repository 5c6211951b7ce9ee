"""DeepSeek-V3 checkpoints made by transformers (issue 37): multi-head latent attention and its latent cache,
group-limited sigmoid routing with a correction bias, a shared expert, dense layers first; logits on fsdp,
fsdp_tp, tp and ep, the round trip bit-exact, transformers' greedy tokens, the published parameter counts."""

import json
import os
import subprocess

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from tests.hf.conftest import expected, fixture, logits, tensors_of
from tests.hf.test_roundtrip import HF_PYTHON, same_bits

MESHES = {
    "fsdp": {"data": 1, "fsdp": 8},
    "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
    "tp": {"data": 4, "tensor": 2},
    "ep": {"data": 1, "fsdp": 2, "expert": 4},
}


@pytest.fixture(scope="module")
def ep():
    mesh = pt.make_mesh(MESHES["ep"])
    model, variables = pt.hf.load_hf(fixture("deepseek_v3"), mesh, "ep")
    return mesh, model, variables


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_logits_match_transformers(preset):
    mesh = pt.make_mesh(MESHES[preset])
    model, variables = pt.hf.load_hf(fixture("deepseek_v3"), mesh, preset)
    tokens, want = expected("deepseek_v3")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    if preset == "fsdp_tp":  # the latents are never split; the heads of q_b / kv_b over tensor, as every head
        attn = variables["params"]["block_1"]["attn"]
        assert attn["kv_a"].sharding.spec == P(None, "fsdp")  # (kv_lora, embed)
        assert attn["kv_b"].sharding.spec == P("tensor", None, None)  # (heads, kv, kv_lora)
        assert attn["q_a_norm"]["scale"].sharding.spec == P(None)  # (q_lora,)


def test_logits_on_expert_parallel_and_the_options(ep):
    mesh, model, variables = ep
    tokens, want = expected("deepseek_v3")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "ep"), want, atol=1e-4, rtol=0)
    assert model.mla == {
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 12,
        "rope_interleave": True,
    }
    moe = model.moe
    assert (moe["routing"], moe["groups"], moe["topk_groups"], moe["routed_scaling"]) == ("sigmoid_group", 4, 2, 2.5)
    assert (moe["shared_mlp"], moe["mlp"], model.moe_layers, model.scan_layers) == (16, 16, (1, 2), False)
    p = variables["params"]
    assert p["block_0"]["mlp"]["wi_0"].shape == (48, 32)  # the dense layer: intermediate_size
    assert p["block_1"]["mlp"]["wi_0"].sharding.spec[0] == "expert"  # (expert, embed, mlp)
    assert p["block_1"]["mlp"]["shared"]["wi_0"].shape == (32, 16)


def test_the_fused_latent_and_rope_rows_are_read_apart(ep):
    _, _, variables = ep
    attn = variables["params"]["block_2"]["attn"]
    fused = tensors_of(fixture("deepseek_v3"))["model.layers.2.self_attn.kv_a_proj_with_mqa.weight"]  # (16 + 8, 32)
    np.testing.assert_array_equal(np.asarray(attn["kv_a"]), fused[:16])
    np.testing.assert_array_equal(np.asarray(attn["k_rope"]), fused[16:])


def test_routing_and_the_shared_expert_change_the_logits():
    model, variables = pt.hf.load_hf(fixture("deepseek_v3"))
    tokens, want = expected("deepseek_v3")
    wrong = [{"topk_groups": 4}, {"routed_scaling": 1.0}, {"shared_mlp": None}]
    no_correction = jax.tree.map(lambda x: x, variables)
    for i in (1, 2):
        no_correction["params"][f"block_{i}"]["mlp"]["router_correction"] = np.zeros(8, np.float32)
    assert np.abs(logits(model, no_correction, tokens) - want).max() > 0.01
    for change in wrong:
        m = model.clone(moe={**model.moe, **change})
        v = variables
        if change.get("shared_mlp", 1) is None:
            v = jax.tree.map(lambda x: x, variables)
            for i in (1, 2):
                del v["params"][f"block_{i}"]["mlp"]["shared"]
        assert np.abs(logits(m, v, tokens) - want).max() > 0.01, change


def test_round_trip_is_bit_exact_and_transformers_reads_it(ep, tmp_path, repo):
    _, model, variables = ep
    out = pt.hf.save_hf(model, variables, tmp_path / "deepseek_v3")
    want, got = tensors_of(fixture("deepseek_v3")), tensors_of(out)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)) for k in want)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DeepseekV3ForCausalLM"]
    _, again = pt.hf.load_hf(out, scan_layers=False)
    assert same_bits(again, variables)
    if HF_PYTHON:
        tool = str(repo / "tools" / "make_hf_fixtures.py")
        check = [tool, "--check", str(out), "--expect", str(fixture("deepseek_v3"))]
        r = subprocess.run([HF_PYTHON, *check], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
        assert r.returncode == 0, r.stdout + r.stderr


def test_generate_caches_the_latent_and_gives_transformers_greedy_tokens():
    mesh = pt.make_mesh(MESHES["fsdp_tp"])
    model, variables = pt.hf.load_hf(fixture("deepseek_v3"), mesh, "fsdp_tp")
    prompt = [int(t) for t in np.load(fixture("deepseek_v3") / "tokens.npy")[0, :5]]
    want = np.load(fixture("deepseek_v3") / "greedy.npy").tolist()
    got = pt.decode.generate(model, variables["params"], prompt, mesh=mesh, rules="fsdp_tp", max_tokens=len(want))
    assert got == want
    # The cache holds each layer's latent (kv_lora 16) and shared rotated key part (8), not 4 heads' keys and values.
    cache = jax.eval_shape(model.clone(decode=True).init, jax.random.key(0), np.zeros((1, 12), np.int32))["cache"]
    attn = pt.unbox(cache)["block_1"]["attn"]
    assert {k: v.shape for k, v in attn.items()} == {
        "cache_index": (),
        "cached_latent": (1, 12, 16),
        "cached_rope": (1, 12, 8),
    }
    assert pt.logical_names(cache)["block_1"]["attn"]["cached_latent"] == ("batch", "length", "kv_lora")


def test_the_published_config_gives_671b(repo):
    """DeepSeek-V3's 671B (and 37B active) from its config.json: 61 layers, 3 dense then 58 with 256 routed experts.

    A layer's attention: q_a 7,168 x 1,536 + norm 1,536 + q_b 1,536 x 128 x 192 + kv_a 7,168 x 576 + norm 512
    + kv_b 512 x 128 x 256 + o 128 x 128 x 7,168 = 187,107,328, 2 norms of 7,168; a dense MLP 3 x 7,168 x 18,432;
    a sparse one: router 7,168 x 256 + 256 correction biases, 256 + 1 shared experts of 3 x 7,168 x 2,048.
    Embedding and lm_head 2 x 129,280 x 7,168, the final norm. The checkpoint's 685B also hold the
    multi-token-prediction module (`num_nextn_predict_layers`: layer 61, one more MoE layer with its eh_proj,
    norms and own copies of the embedding and head, about 13.5B), which the causal LM neither builds nor reads.
    """
    from tests.hf.test_families import count

    attention, norms, dense, expert = 187_107_328, 2 * 7_168, 3 * 7_168 * 18_432, 3 * 7_168 * 2_048
    router, embeddings = 7_168 * 256 + 256, 2 * 129_280 * 7_168
    sparse = attention + norms + router + 257 * expert
    total = 3 * (attention + norms + dense) + 58 * sparse + embeddings + 7_168
    assert count(repo / "configs/hf/deepseek-v3") == total == 671_026_419_200
    active = total - 58 * 248 * expert  # 8 of 256 routed experts a token (the shared one always)
    assert active == 37_552_297_472  # the card's 37B; 36.6B without the embedding table


def test_fused_experts_as_transformers_5_holds_them(tmp_path):
    """save_pretrained(save_original_format=False) fuses each layer's routed experts: read too, saved per expert."""
    mesh = pt.make_mesh(MESHES["ep"])
    model, variables = pt.hf.load_hf(fixture("deepseek_v3_fused"), mesh, "ep")
    tokens, want = expected("deepseek_v3_fused")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "ep"), want, atol=1e-4, rtol=0)
    fused = tensors_of(fixture("deepseek_v3_fused"))
    out = tensors_of(pt.hf.save_hf(model, variables, tmp_path / "per_expert"))
    gate_up = fused["model.layers.2.mlp.experts.gate_up_proj"]  # (experts, 2 mlp, embed): gate, then up
    assert np.array_equal(out["model.layers.2.mlp.experts.5.gate_proj.weight"], gate_up[5, :16])
    assert np.array_equal(out["model.layers.2.mlp.experts.5.up_proj.weight"], gate_up[5, 16:])
    assert np.array_equal(
        out["model.layers.2.mlp.experts.5.down_proj.weight"], fused["model.layers.2.mlp.experts.down_proj"][5]
    )


def test_without_a_query_latent_every_layer_sparse_and_scanned():
    # q_lora_rank null: q_proj straight from the hidden state; first_k_dense_replace 0: every layer alike, scanned.
    mesh = pt.make_mesh(MESHES["ep"])
    model, variables = pt.hf.load_hf(fixture("deepseek_v3_noq"), mesh, "ep")
    assert model.scan_layers and model.moe_layers is None and model.mla["q_lora_rank"] is None
    attn = variables["params"]["blocks"]["attn"]
    assert "q" in attn and "q_a" not in attn and attn["q"].shape == (2, 4, 16, 32)  # (layers, heads, kv, embed)
    tokens, want = expected("deepseek_v3_noq")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "ep"), want, atol=1e-4, rtol=0)
