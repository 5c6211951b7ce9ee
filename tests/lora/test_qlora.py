"""QLoRA: a frozen base stored int8 / NF4 with block-wise scales named by logical axes, dequantized per layer."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import partitioning as pt
from partitioning.finetune.quantize import NF4, dequantize, quantize, stored_shapes
from partitioning.models import GPT

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "tests" / "fixtures" / "hf" / "llama"


def test_nf4_levels_are_bitsandbytes_and_each_value_goes_to_the_nearest():
    assert NF4[0] == -1.0 and NF4[7] == 0.0 and NF4[15] == 1.0 and len(NF4) == 16
    # Midway between 0.0796 and 0.1609 is 0.12026: just below goes down, just above goes up.
    w = jnp.array([[1.0, 0.12, 0.1203, -0.09, 0.05, -0.05, 0.61, -0.61]])
    codes, scale = quantize(w, "nf4", 8)
    assert codes.dtype == jnp.uint8 and codes.shape == (1, 4) and scale.tolist() == [[1.0]]
    lo, hi = np.asarray(codes) & 15, np.asarray(codes) >> 4
    assert np.stack([lo, hi], -1).reshape(1, 8).tolist() == [[15, 8, 9, 6, 8, 6, 13, 2]]
    np.testing.assert_allclose(
        dequantize(codes, scale, "nf4", 8),
        [[1.0, 0.07958, 0.16093, -0.09105, 0.07958, -0.09105, 0.56262, -0.52507]],
        atol=1e-5,
    )


def test_int8_rounds_to_127_levels_of_each_blocks_absmax():
    w = jnp.array([[2.0, -1.0, 0.5, 0.0, 0.01, -0.02, 0.04, 0.0]])
    codes, scale = quantize(w, "int8", 4)
    assert codes.tolist() == [[127, -64, 32, 0, 32, -64, 127, 0]]
    np.testing.assert_allclose(scale, [[2 / 127, 0.04 / 127]], rtol=1e-6)
    back = dequantize(codes, scale, "int8", 4)
    np.testing.assert_allclose(back[0, :3], [2.0, -64 * 2 / 127, 32 * 2 / 127], rtol=1e-6)


@pytest.mark.parametrize("kind, bound", [("int8", 0.5 / 127), ("nf4", (NF4[1] + 1) / 2 / 1)])
def test_the_error_of_a_normal_weight_is_within_half_a_level_of_its_blocks_absmax(kind, bound):
    w = jax.random.normal(jax.random.key(0), (64, 256))
    codes, scale = quantize(w, kind, 64)
    back = dequantize(codes, scale, kind, 64)
    absmax = np.abs(np.asarray(w).reshape(64, 4, 64)).max(-1, keepdims=True)
    err = np.abs(np.asarray(back - w)).reshape(64, 4, 64) / absmax
    # int8: half a step of absmax / 127; nf4: half the widest gap between levels (-1 .. -0.696).
    assert err.max() <= bound + 1e-6
    rel = float(jnp.linalg.norm(back - w) / jnp.linalg.norm(w))
    assert rel < (0.01 if kind == "int8" else 0.11), rel
    assert float(jnp.abs(back).max()) == pytest.approx(float(jnp.abs(w).max()), rel=1e-6)  # absmax is exact


def test_an_all_zero_block_stays_zero():
    for kind in ("int8", "nf4"):
        codes, scale = quantize(jnp.zeros((2, 8)), kind, 4)
        assert not np.asarray(dequantize(codes, scale, kind, 4)).any()


def test_stored_shapes_halve_nf4_along_the_last_axis():
    assert stored_shapes((8, 32), "int8", 16) == ((8, 32), np.dtype("int8"), (8, 2))
    assert stored_shapes((8, 32), "nf4", 16) == ((8, 16), np.dtype("uint8"), (8, 2))


def _quantized_reference(plain_params, quant_params, kind, block):
    """The float model's params with every quantized kernel replaced by dequantize(quantize(W))."""
    flat = traverse_util.flatten_dict(pt.unbox(plain_params))
    quant = traverse_util.flatten_dict(pt.unbox(quant_params))
    out = {}
    for k, w in flat.items():
        if k[:-1] + (k[-1] + "_qscale",) in quant:
            out[k] = dequantize(*quantize(w, kind, block), kind, block, w.dtype)
        else:
            out[k] = w
    return traverse_util.unflatten_dict(out)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_load_hf_quantizes_and_the_logits_are_the_dequantized_references(kind):
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    lora = {"rank": 4, "targets": ["attn/(q|v)$"], "base_dtype": kind, "base_block": 8}
    model, variables = pt.hf.load_hf(LLAMA, mesh, "fsdp_tp", lora=lora)
    plain_model, plain = pt.hf.load_hf(LLAMA, mesh, "fsdp_tp", lora={**lora, "base_dtype": None})
    attn = variables["params"]["blocks"]["attn"]
    want_dtype = jnp.uint8 if kind == "nf4" else jnp.int8
    assert attn["q"].dtype == want_dtype and attn["q_qscale"].dtype == jnp.float32
    # (layers, heads, kv, embed): fsdp splits embed, tensor heads; the scale's blocked embed too, at the same rows.
    assert attn["q"].shape == (2, 4, 8, 16 if kind == "nf4" else 32) and attn["q_qscale"].shape == (2, 4, 8, 4)
    assert (
        attn["q"].sharding.spec
        == attn["q_qscale"].sharding.spec
        == jax.sharding.PartitionSpec(None, "tensor", None, "fsdp")
    )
    p = variables["params"]
    assert p["embedding"].dtype == p["unembed"].dtype == jnp.float32 and "unembed_qscale" not in p
    tokens = jnp.arange(32).reshape(4, 8) * 7 % 320
    ref = _quantized_reference(plain["params"], variables["params"], kind, 8)
    with pt.sharding_context(mesh, "fsdp_tp"):
        got = model.apply(variables, tokens)
        want = plain_model.apply({"params": ref}, tokens)
        exact = plain_model.apply(plain, tokens)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    assert float(jnp.abs(got - exact).max()) > 1e-4  # the base really is quantized


def test_the_reference_gpt_quantizes_its_blocks_not_embeddings_head_norms():
    lora = {"rank": 2, "targets": ["attn/", "mlp/"], "base_dtype": "nf4", "base_block": 16}
    model = GPT(embed=32, heads=2, mlp=64, layers=2, vocab_size=64, lora=lora)
    abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    flat = traverse_util.flatten_dict(pt.unbox(abstract["params"]))
    scales = sorted("/".join(k) for k in flat if k[-1].endswith("_qscale"))
    assert scales == [
        "blocks/attn/k_qscale",
        "blocks/attn/o_qscale",
        "blocks/attn/q_qscale",
        "blocks/attn/v_qscale",
        "blocks/mlp/wi_0_qscale",
        "blocks/mlp/wi_1_qscale",
        "blocks/mlp/wo_qscale",
    ]
    names = pt.logical_names(abstract)["params"]["blocks"]["mlp"]
    assert names["wo"] == names["wo_qscale"] == ("layers", "mlp", "embed")
    assert flat[("blocks", "mlp", "wo")].dtype == jnp.uint8 and flat[("blocks", "mlp", "wo")].shape == (2, 64, 16)


def test_no_gradient_reaches_the_base_and_the_adapters_get_one():
    lora = {"rank": 2, "targets": ["attn/q$"], "base_dtype": "int8", "base_block": 16}
    model = GPT(embed=32, heads=2, mlp=64, layers=1, vocab_size=64, lora=lora)
    params = pt.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    params["blocks"]["attn"]["q_lora_b"] = jnp.ones_like(params["blocks"]["attn"]["q_lora_b"])
    tokens = jnp.arange(8).reshape(1, 8)

    def loss(scale, a):
        p = jax.tree.map(lambda x: x, params)
        p["blocks"]["attn"]["q_qscale"], p["blocks"]["attn"]["q_lora_a"] = scale, a
        return model.apply({"params": p}, tokens).sum()

    attn = params["blocks"]["attn"]
    g_scale, g_a = jax.grad(loss, argnums=(0, 1))(attn["q_qscale"], attn["q_lora_a"])
    assert not np.asarray(g_scale).any() and np.abs(np.asarray(g_a)).max() > 0


def test_the_quantized_base_cannot_be_made_trainable():
    from partitioning.finetune.trainable import subset_of

    lora = {"rank": 2, "targets": ["attn/q$"], "base_dtype": "nf4", "base_block": 16}
    model = GPT(embed=32, heads=2, mlp=64, layers=1, vocab_size=64, lora=lora)
    params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    assert "blocks/attn/q" in subset_of(params, None).frozen  # the default: the adapters only
    assert "embedding" not in subset_of(params, ["_lora_", "embedding"]).frozen  # a float leaf may train
    with pytest.raises(pt.ConfigError) as e:
        subset_of(params, ["attn/"])
    assert str(e.value) == (
        "trainable: blocks/attn/k is part of the quantized base (model.lora.base_dtype), which cannot train; "
        "match the adapters only (the default with model.lora: _lora_[ab]$)"
    )


def test_an_nf4_base_runs_on_explicit_axes_with_the_same_logits():
    # Dequantizing is elementwise (no gather): on Explicit axes the codes keep their layout.
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    lora = {"rank": 4, "targets": ["attn/(q|v)$", "mlp/"], "base_dtype": "nf4", "base_block": 8}
    auto = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    model, variables = pt.hf.load_hf(LLAMA, auto, "fsdp_tp", lora=lora)
    tokens = jnp.arange(32).reshape(4, 8) * 7 % 320
    with pt.sharding_context(auto, "fsdp_tp"):
        want = np.asarray(jax.jit(model.apply)(variables, tokens))
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2}, axis_types="explicit")
    moved = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, x.sharding.spec)), variables)
    with pt.sharding_context(mesh, "fsdp_tp"):
        got = jax.jit(model.apply)(moved, jax.device_put(tokens, NamedSharding(mesh, P(("data", "fsdp")))))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
