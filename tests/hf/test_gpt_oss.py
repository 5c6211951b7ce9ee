"""GPT-OSS checkpoints made by transformers (issue 37): logits on fsdp, fsdp_tp, tp and ep, the sinks and biases
laid out by the rules, the fused interleaved experts read per shard, the round trip bit-exact, transformers'
greedy tokens."""

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
    model, variables = pt.hf.load_hf(fixture("gpt_oss"), mesh, "ep")
    return mesh, model, variables


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp", "tp"])
def test_logits_match_transformers(preset):
    mesh = pt.make_mesh(MESHES[preset])
    model, variables = pt.hf.load_hf(fixture("gpt_oss"), mesh, preset)
    tokens, want = expected("gpt_oss")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, preset), want, atol=1e-4, rtol=0)
    if preset == "fsdp_tp":  # the sinks split with the heads, the expert biases with their mlp columns
        p = variables["params"]["blocks"]
        assert p["attn"]["sinks"].sharding.spec == P(None, "tensor")
        assert p["mlp"]["wi_0_bias"].sharding.spec == P(None, None, "tensor")


def test_logits_on_expert_parallel_and_its_options(ep):
    mesh, model, variables = ep
    tokens, want = expected("gpt_oss")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "ep"), want, atol=1e-4, rtol=0)
    assert model.attn_sinks and model.layer_types == ("sliding_attention", "full_attention")
    assert (model.sliding_window, model.qkv_bias, model.out_bias) == (5, True, True)
    assert model.rope_scaling["rope_type"] == "yarn" and model.rope_scaling["truncate"] is False
    moe = model.moe
    assert (moe["routing"], moe["router_bias"], moe["expert_bias"]) == ("topk_softmax", True, True)
    assert (moe["swiglu_limit"], moe["swiglu_alpha"], moe["mlp"], moe["top_k"]) == (0.5, 1.702, 24, 2)
    wi_0 = variables["params"]["blocks"]["mlp"]["wi_0"]  # (layers, expert, embed, mlp): one expert per device
    assert wi_0.sharding.spec[1] == "expert" and {s.data.shape[1] for s in wi_0.addressable_shards} == {1}


def test_the_interleaved_gate_and_up_columns_are_read_apart(ep):
    _, _, variables = ep
    mlp = variables["params"]["blocks"]["mlp"]
    file = tensors_of(fixture("gpt_oss"))
    gate_up = file["model.layers.1.mlp.experts.gate_up_proj"]  # (experts, embed, 2 mlp): gate even, up odd
    np.testing.assert_array_equal(np.asarray(mlp["wi_0"][1]), gate_up[..., ::2])
    np.testing.assert_array_equal(np.asarray(mlp["wi_1"][1]), gate_up[..., 1::2])
    bias = file["model.layers.0.mlp.experts.gate_up_proj_bias"]
    np.testing.assert_array_equal(np.asarray(mlp["wi_1_bias"][0]), bias[:, 1::2])


def test_sinks_routing_and_the_clamp_change_the_logits():
    model, variables = pt.hf.load_hf(fixture("gpt_oss"))
    tokens, want = expected("gpt_oss")
    no_sinks = jax.tree.map(lambda x: x, variables)
    no_sinks["params"]["blocks"]["attn"]["sinks"] = np.full((2, 4), -1e9, np.float32)  # sinks that take nothing
    assert np.abs(logits(model, no_sinks, tokens) - want).max() > 0.05
    # (softmax then top-k renormalised is the same gates: the unrenormalised probabilities are not.)
    for moe in ({"routing": "softmax_topk", "norm_topk_prob": False}, {"swiglu_limit": 100.0}):
        assert np.abs(logits(model.clone(moe={**model.moe, **moe}), variables, tokens) - want).max() > 0.05


def test_round_trip_is_bit_exact_and_transformers_reads_it(ep, tmp_path, repo):
    _, model, variables = ep
    out = pt.hf.save_hf(model, variables, tmp_path / "gpt_oss")
    want, got = tensors_of(fixture("gpt_oss")), tensors_of(out)
    assert sorted(got) == sorted(want)  # fused experts, as transformers saves GPT-OSS
    assert all(np.array_equal(got[k].view(np.uint8), want[k].view(np.uint8)) for k in want)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GptOssForCausalLM"]
    _, again = pt.hf.load_hf(out)
    assert same_bits(again, variables)
    if HF_PYTHON:
        check = [str(repo / "tools" / "make_hf_fixtures.py"), "--check", str(out), "--expect", str(fixture("gpt_oss"))]
        r = subprocess.run([HF_PYTHON, *check], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
        assert r.returncode == 0, r.stdout + r.stderr


def test_generate_gives_transformers_greedy_tokens():
    mesh = pt.make_mesh(MESHES["fsdp_tp"])
    model, variables = pt.hf.load_hf(fixture("gpt_oss"), mesh, "fsdp_tp")
    prompt = [int(t) for t in np.load(fixture("gpt_oss") / "tokens.npy")[0, :5]]
    want = np.load(fixture("gpt_oss") / "greedy.npy").tolist()
    got = pt.decode.generate(model, variables["params"], prompt, mesh=mesh, rules="fsdp_tp", max_tokens=len(want))
    assert got == want


def test_the_published_configs_give_the_model_cards_parameter_counts(capsys, repo, monkeypatch):
    """gpt-oss-120b: 116.83B total, 5.13B active; gpt-oss-20b: 20.91B total, 3.61B active (OpenAI's model card,
    whose active count leaves out the embedding table, 201,088 x 2,880 = 579,133,440: a token reads one row).

    A layer: attention 26,550,144 (q 2,880 x 4,096 + k, v 2,880 x 512 + o 4,096 x 2,880, their biases, 64 sinks),
    2 norms of 2,880, a router 2,880 x E + E, E experts of 24,891,840 (gate_up 2,880 x 5,760 + 5,760,
    down 2,880 x 2,880 + 2,880); untied embedding and lm_head 2 x 579,133,440, the final norm 2,880.
    """
    from partitioning.cli import main
    from tests.hf.test_families import count

    monkeypatch.chdir(repo)
    assert (
        count(repo / "configs/hf/gpt-oss-20b") == 24 * (26_555_904 + 92_192 + 32 * 24_891_840) + 2_880 + 2 * 579_133_440
    )
    assert count(repo / "configs/hf/gpt-oss-20b") == 20_914_757_184
    assert main(["plan", "configs/gpt_oss_120b_hf.yaml", "--no-compile"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    total = 36 * (26_555_904 + 368_768 + 128 * 24_891_840) + 2_880 + 2 * 579_133_440
    active = 36 * (26_555_904 + 368_768 + 4 * 24_891_840) + 2_880 + 2 * 579_133_440
    assert (total, active - 579_133_440) == (116_829_156_672, 5_132_849_472)  # the card's 116.83B and 5.13B
    assert f"({total:,} parameters, {active:,} active per token)" in first, first
