"""Mixture-of-experts checkpoints (Mixtral, Qwen3-MoE) made by transformers: logits on fsdp, fsdp_tp and
expert-parallel meshes, experts stacked on `expert`, the round trip bit-exact, dropless routing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioning as pt
from partitioning.hf import weights as hf_module
from tests.hf.conftest import expected, fixture, logits, tensors_of

MESHES = {
    "fsdp": {"data": 1, "fsdp": 8},
    "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
    "ep": {"data": 1, "fsdp": 2, "expert": 4},
}
CASES = [
    ("mixtral", "fsdp"),  # on ep: test_fused_experts_as_transformers_5_holds_them
    ("qwen3_moe", "fsdp_tp"),
    ("qwen3_moe", "ep"),
    ("qwen3_moe_mixed", "ep"),
]


@pytest.mark.parametrize("name,preset", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_logits_match_transformers(name, preset):
    mesh = pt.make_mesh(MESHES[preset])
    model, variables = pt.hf.load_hf(fixture(name), mesh, preset)
    tokens, want = expected(name)
    got = logits(model, variables, tokens, mesh, preset)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    mlp = variables["params"]["blocks" if model.scan_layers else "block_0"]["mlp"]
    if preset == "ep":  # experts split over `expert` (4 experts, 1 per device), tokens all-to-all'd to them
        spec = mlp["wi_0"].sharding.spec
        assert spec[-3] == "expert" and {s.data.shape[-3] for s in mlp["wi_0"].addressable_shards} == {1}


def test_experts_are_stacked_and_layers_are_dense_or_sparse():
    model, variables = pt.hf.load_hf(fixture("mixtral"))
    p = variables["params"]["blocks"]["mlp"]
    assert {k: v.shape for k, v in p.items()} == {
        "router": (2, 32, 4),
        "wi_0": (2, 4, 32, 48),
        "wi_1": (2, 4, 32, 48),
        "wo": (2, 4, 48, 32),
    }
    file = tensors_of(fixture("mixtral"))
    w1 = file["model.layers.1.block_sparse_moe.experts.2.w1.weight"]  # (mlp, embed), torch's Linear
    assert np.array_equal(np.asarray(p["wi_0"][1, 2]), w1.T)
    assert model.moe == {
        "experts": 4,
        "top_k": 2,
        "dropless": True,
        "capacity_factor": None,
        "aux_loss_weight": 0.0,
        "norm_topk_prob": True,
    }
    # Qwen3-MoE with layer 1 dense (mlp_only_layers): built per block, each layer its own kind and width.
    model, variables = pt.hf.load_hf(fixture("qwen3_moe_mixed"))
    assert not model.scan_layers and model.moe_layers == (0, 2)
    p = variables["params"]
    assert p["block_1"]["mlp"]["wi_0"].shape == (64, 32)  # intermediate_size, (mlp, embed)
    assert p["block_2"]["mlp"]["wi_0"].shape == (4, 32, 24)  # moe_intermediate_size
    assert model.moe["norm_topk_prob"] is False and model.moe["mlp"] == 24


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe_mixed"])
def test_round_trip_is_bit_exact(name, tmp_path):
    mesh = pt.make_mesh(MESHES["ep"])
    model, variables = pt.hf.load_hf(fixture(name), mesh, "ep")
    out = pt.hf.save_hf(model, variables, tmp_path / name)
    want, got = tensors_of(fixture(name)), tensors_of(out)
    assert sorted(got) == sorted(want)  # one tensor per expert, as transformers' save_pretrained writes
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def test_each_expert_tensor_is_read_once_into_the_device_holding_it(monkeypatch):
    """Each expert is its own file tensor, read once, into the one device (of 2 along `expert`) holding it.

    Across processes, each reads only its own experts' tensors: test_roundtrip's two-process test.
    """
    read: list[str] = []
    original = hf_module.Reader.tensor

    def tensor(self, s, pattern, part, shape, targets):
        read.append(s.name)
        if ".experts." in s.name:
            assert len(targets) == 1  # one device's box holds this expert
        return original(self, s, pattern, part, shape, targets)

    monkeypatch.setattr(hf_module.Reader, "tensor", tensor)
    mesh = pt.make_mesh({"data": 1, "fsdp": 1, "expert": 2}, devices=jax.devices()[:2])
    _, variables = pt.hf.load_hf(fixture("mixtral"), mesh, "ep")
    w1 = [n for n in read if n.endswith(".w1.weight")]
    assert w1 == [f"model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight" for i in range(2) for e in range(4)]
    shards = variables["params"]["blocks"]["mlp"]["wi_0"].addressable_shards
    assert sorted(s.index[1].indices(4)[:2] for s in shards) == [(0, 2), (2, 4)]


def test_dropless_inference_and_a_capacity_for_training():
    """Dropless: no token is ever dropped, whatever the routing; a capacity factor caps each expert."""
    from partitioning.models.moe import MoE

    dropless = MoE.parse({"experts": 4, "top_k": 2, "dropless": True, "capacity_factor": None})
    assert dropless.capacity(16) == 16  # every expert can take every token of a sequence
    # All 16 tokens routed to the same two experts: nothing is dropped.
    x = jnp.ones((1, 16, 8))
    router = jnp.zeros((8, 4)).at[:, 0].set(1.0).at[:, 1].set(0.5)
    w = (jnp.ones((4, 8, 4)), jnp.ones((4, 8, 4)), jnp.ones((4, 4, 8)))
    ffn = jax.jit(
        lambda cap: pt.parallel.moe_ffn(x, router, w, top_k=2, capacity=cap, norm_topk_prob=True)[0], static_argnums=0
    )
    assert bool((jnp.abs(ffn(dropless.capacity(16))) > 0).all())
    y = ffn(pt.parallel.expert_capacity(16, 4, 2, 1.0))
    assert int((jnp.abs(y[0]).sum(-1) > 0).sum()) == 8  # capacity 8: the second half of the tokens skip both
    model = pt.hf.hf_model(fixture("qwen3_moe"), capacity_factor=1.25)
    assert model.moe["capacity_factor"] == 1.25 and model.moe["dropless"] is False
    with pytest.raises(pt.ConfigError, match="capacity_factor applies to mixture-of-experts checkpoints"):
        pt.hf.hf_model(fixture("llama"), capacity_factor=1.25)


def test_generate_on_the_fixture():
    """Greedy decoding with a KV cache, experts routed dropless: the first token is transformers' argmax."""
    mesh = pt.make_mesh({"data": 1, "fsdp": 1}, devices=jax.devices()[:1])
    model, variables = pt.hf.load_hf(fixture("qwen3_moe"), mesh, "fsdp")
    tokens, want = expected("qwen3_moe")
    prompt = [int(t) for t in tokens[0, :6]]
    new = pt.decode.generate(model, variables["params"], prompt, mesh=mesh, rules="fsdp", max_tokens=3)
    assert len(new) == 3 and all(0 <= t < 320 for t in new)
    assert new[0] == int(np.argmax(want[0, 5]))


def test_unsupported_router_options_are_one_line():
    from partitioning.models.hf.families import mixtral

    with pytest.raises(pt.ConfigError, match="router_jitter_noise 0.1 is not supported") as e:
        mixtral({"architectures": ["MixtralForCausalLM"], "router_jitter_noise": 0.1})
    assert e.value.arg == "router_jitter_noise"


def test_plan_prints_the_published_parameter_counts(capsys):
    """Mixtral-8x7B 46.7B / 12.9B active, Qwen3-30B-A3B 30.5B / 3.3B active, from config.json alone.

    Mixtral: 32 layers x (attention 41,943,040 + norms 8,192 + router 32,768 + 8 experts x 176,160,768)
    + embedding and lm_head 2 x 131,072,000 + final norm 4,096; active: 2 experts of 8.
    Qwen3-30B-A3B: 48 layers x (attention 18,874,368 + q/k norms 256 + norms 4,096 + router 262,144
    + 128 experts x 4,718,592) + 2 x 311,164,928 + 2,048; active: 8 experts of 128.
    """
    from partitioning.cli import main

    for config, total, active in (
        ("configs/mixtral_8x7b_hf.yaml", 46_702_792_704, 12_879_925_248),
        ("configs/qwen3_30b_a3b_hf.yaml", 30_532_122_624, 3_353_032_704),
    ):
        assert main(["plan", config, "--no-compile"]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert f"({total:,} parameters, {active:,} active per token)" in first, first


def test_fused_experts_as_transformers_5_holds_them(tmp_path):
    """save_pretrained(save_original_format=False) fuses each layer's experts: read too, saved per expert."""
    mesh = pt.make_mesh(MESHES["ep"])
    model, variables = pt.hf.load_hf(fixture("mixtral_fused"), mesh, "ep")
    tokens, want = expected("mixtral_fused")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "ep"), want, atol=1e-4, rtol=0)
    fused = tensors_of(fixture("mixtral_fused"))
    out = tensors_of(pt.hf.save_hf(model, variables, tmp_path / "per_expert"))
    gate_up = fused["model.layers.1.mlp.experts.gate_up_proj"]  # (experts, 2 mlp, embed): gate, then up
    assert np.array_equal(out["model.layers.1.block_sparse_moe.experts.2.w1.weight"], gate_up[2, :48])
    assert np.array_equal(out["model.layers.1.block_sparse_moe.experts.2.w3.weight"], gate_up[2, 48:])
    assert np.array_equal(
        out["model.layers.1.block_sparse_moe.experts.2.w2.weight"], fused["model.layers.1.mlp.experts.down_proj"][2]
    )
