"""Logits equal to transformers' on checkpoints it made, for every family, on fsdp and fsdp_tp meshes,
stacked (scan_layers) and per-block; parameters born in their shards."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from tests.hf.conftest import FAMILIES, NEW_FAMILIES, expected, fixture, logits, mesh_for

FAST = [(f, "fsdp", False) for f in FAMILIES] + [(f, "fsdp_tp", True) for f in FAMILIES]
# The newer families' third layout is tp (tests/hf/test_families.py), not these.
SLOW = [(f, "fsdp", True) for f in FAMILIES if f not in NEW_FAMILIES]
SLOW += [(f, "fsdp_tp", False) for f in FAMILIES if f not in NEW_FAMILIES]


def check_logits(name: str, preset: str, scan: bool) -> dict:
    mesh = mesh_for(preset)
    # Gemma's and Mistral's single kv head cannot split over `tensor`: replicated, with a warning.
    if name in ("gemma", "mistral") and preset == "fsdp_tp":
        with pytest.warns(pt.IndivisibleWarning, match="kv_heads"):
            model, variables = pt.hf.load_hf(fixture(name), mesh, preset, scan_layers=scan)
        assert variables["params"]["embedding"].sharding.spec == P("tensor", "fsdp")
    else:
        model, variables = pt.hf.load_hf(fixture(name), mesh, preset, scan_layers=scan)
    tokens, want = expected(name)
    got = logits(model, variables, tokens, mesh, preset)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    return variables["params"]


@pytest.mark.parametrize("name,preset,scan", FAST, ids=[f"{n}-{p}-{'scan' if s else 'blocks'}" for n, p, s in FAST])
def test_logits_match_transformers(name, preset, scan):
    check_logits(name, preset, scan)


@pytest.mark.slow
@pytest.mark.parametrize("name,preset,scan", SLOW, ids=[f"{n}-{p}-{'scan' if s else 'blocks'}" for n, p, s in SLOW])
def test_logits_match_transformers_other_layouts(name, preset, scan):
    check_logits(name, preset, scan)


def test_shards_are_placed_by_the_rules():
    model, variables = pt.hf.load_hf(fixture("qwen2"), mesh_for("fsdp_tp"), "fsdp_tp")
    p = variables["params"]
    # Weights are stored (out, in) like torch's Linear (kernel_order: out_in): loading is a reshape.
    assert p["blocks"]["attn"]["q"].sharding.spec == P(None, "tensor", None, "fsdp")  # (layers, heads, kv, embed)
    assert p["blocks"]["attn"]["q_bias"].sharding.spec == P(None, "tensor", None)  # (layers, heads, kv)
    assert p["blocks"]["attn"]["o"].sharding.spec == P(None, "fsdp", "tensor", None)  # (layers, embed, heads, kv)
    assert p["blocks"]["mlp"]["wi_0"].sharding.spec == P(None, "tensor", "fsdp")  # (layers, mlp, embed)
    assert p["embedding"].sharding.spec == P("tensor", "fsdp")
    assert "unembed" not in p  # tied
    # Each device holds only its shard.
    q = p["blocks"]["attn"]["q"]
    assert {s.data.shape for s in q.addressable_shards} == {(2, 2, 8, 8)}


def test_gpt2_positions_and_fused_qkv_are_laid_out():
    _, variables = pt.hf.load_hf(fixture("gpt2"), mesh_for("fsdp_tp"), "fsdp_tp", scan_layers=False)
    p = variables["params"]
    assert p["pos_embedding"].sharding.spec == P(None, "fsdp")  # (positions, embed)
    assert p["block_1"]["attn"]["k"].sharding.spec == P("fsdp", "tensor", None)  # Conv1D: (embed, heads, kv)
    assert p["block_1"]["mlp"]["wi_bias"].sharding.spec == P("tensor")


def test_pipeline_stages_load_their_layers_and_match():
    mesh = mesh_for("pp")
    model, variables = pt.hf.load_hf(fixture("llama"), mesh, "pp")
    q = variables["params"]["blocks"]["attn"]["q"]
    assert q.sharding.spec == P("stage", None, None, None)
    assert {s.data.shape[0] for s in q.addressable_shards} == {1}  # one of the 2 layers per stage
    tokens, want = expected("llama")
    np.testing.assert_allclose(logits(model, variables, tokens, mesh, "pp"), want, atol=1e-4, rtol=0)


def test_without_a_mesh_on_one_device_and_the_context_rules_otherwise():
    model, variables = pt.hf.load_hf(fixture("mistral"))
    q = variables["params"]["blocks"]["attn"]["q"]
    assert len(q.sharding.device_set) == 1
    tokens, want = expected("mistral")
    np.testing.assert_allclose(logits(model, variables, tokens), want, atol=1e-4, rtol=0)
    mesh = mesh_for("fsdp_tp")
    with pt.axis_rules("tp"):
        _, variables = pt.hf.load_hf(fixture("qwen2"), mesh)
    assert variables["params"]["blocks"]["mlp"]["wo"].sharding.spec == P(None, None, "tensor")
    _, variables = pt.hf.load_hf(fixture("qwen2"), mesh)  # no context: fsdp
    assert variables["params"]["blocks"]["mlp"]["wo"].sharding.spec == P(None, "fsdp", None)


def test_an_indivisible_dimension_is_refused_when_asked():
    # The default replicates (above); a user who wants every rule honoured gets the tensor and the axis.
    with pytest.raises(pt.ShardingError) as e:
        pt.hf.load_hf(fixture("gemma"), mesh_for("fsdp_tp"), "fsdp_tp", on_indivisible="error")
    assert str(e.value) == (
        "blocks/attn/k, blocks/attn/v: dim 1 ('kv_heads', size 1) is not divisible by mesh axes ('tensor',) of size 2 "
        "(presets/fsdp_tp.yaml:12: rules[3]); change the rule or the size, or set on_indivisible: replicate"
    )
