"""LoRA in the reference decoder and the Hugging Face families (the activation path), and on any model.

Step 0 of a LoRA model is the base model exactly (``lora_b`` starts at zero);
with non-zero adapters the logits are those of the merged weight
``W + scale * A @ B`` computed here by hand; the weight path (LoRAModel, for
models without a ``lora`` option) gives the activation path's logits.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.models import GPT
from tests.byom.models.constrained_linen import MaxTextStyleLM
from tests.byom.models.gpt_nnx import GPT as NNXGPT

MESHES = {"fsdp": {"data": 1, "fsdp": 8}, "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2}}
KW = dict(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)
LORA = {"rank": 4, "alpha": 8, "targets": ["attn/(q|v|o)$", "mlp/w", "unembed"]}  # scale 2
LLAMA = "tests/fixtures/hf/llama"
TOKENS = np.random.default_rng(0).integers(0, 64, (8, 16)).astype(np.int32)


def flat(params):
    return {"/".join(k): v for k, v in traverse_util.flatten_dict(pt.unbox(params)).items()}


def nest(d):
    return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in d.items()})


def base_of(params):
    return nest({k: v for k, v in flat(params).items() if not k.endswith(("_lora_a", "_lora_b"))})


_JITTED: dict = {}


def logits(model, params, mesh, rules, rngs=None, **kw):
    """The model's logits on TOKENS; one compile per (model, mesh, rules, mode), shared by the tests."""
    key = (id(model), id(mesh), rules, tuple(sorted(kw.items())))
    if key not in _JITTED:
        _JITTED[key] = (model, jax.jit(lambda p, t, r: model.apply({"params": p}, t, rngs=r, **kw)))
    with pt.sharding_context(mesh, rules):
        return np.asarray(_JITTED[key][1](params, TOKENS, rngs))


def random_adapters(params, seed=1):
    """The params with every adapter random (lora_b too), so the LoRA branch changes the logits."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in flat(params).items():
        if k.endswith(("_lora_a", "_lora_b")):
            v = jax.device_put(rng.normal(0, 0.2, v.shape).astype(np.float32), v.sharding)
        out[k] = v
    return nest(out)


def merged_by_hand(params, scale, out_in=False):
    """Each adapted weight replaced by W + scale * A @ B (numpy), the adapters dropped."""
    p = {k: np.asarray(v) for k, v in flat(params).items()}
    out = {k: v for k, v in p.items() if not k.endswith(("_lora_a", "_lora_b"))}
    for k, w in out.items():
        if k + "_lora_a" not in p:
            continue
        a, b = p[k + "_lora_a"], p[k + "_lora_b"]
        s = a.ndim + b.ndim - 2 - w.ndim  # the stacked `layers` axis
        if out_in:  # A (lora, in...), B (out..., lora): delta (out..., in...)
            delta = np.einsum(
                "...or,...ri->...oi", b.reshape(*b.shape[:s], -1, b.shape[-1]), a.reshape(*a.shape[: s + 1], -1)
            )
        else:  # A (in..., lora), B (lora, out...): delta (in..., out...)
            delta = np.einsum(
                "...ir,...ro->...io", a.reshape(*a.shape[:s], -1, a.shape[-1]), b.reshape(*b.shape[: s + 1], -1)
            )
        out[k] = w + scale * delta.reshape(w.shape)
    return nest(out)


@pytest.fixture(scope="module")
def gpts():
    """{(scan, preset): (mesh, lora model, base model, params, scale)}: the reference GPT with LoRA and its base.

    The params are random numbers in the model's layout (no init compiled: the fresh
    adapters' values are checked through load_hf, which inits them), ``lora_b`` zero as at step 0.
    The unscanned model has ``rslora`` (scale 8 / sqrt(4) = 4, not 8 / 4).
    """
    out = {}
    rng = np.random.default_rng(0)
    for scan, preset in [(True, "fsdp"), (True, "fsdp_tp"), (False, "fsdp_tp")]:
        mesh = pt.make_mesh(MESHES[preset])
        model = GPT(**KW, scan_layers=scan, lora={**LORA, "rslora": not scan})
        abstract = jax.eval_shape(model.init, jax.random.key(0), TOKENS)["params"]
        shardings = pt.unbox(pt.tree_shardings(abstract, mesh, preset))

        def value(path, a):
            zero = path[-1].key.endswith("_lora_b")
            return np.zeros(a.shape, a.dtype) if zero else rng.normal(0, 0.3, a.shape).astype(a.dtype)

        values = jax.tree_util.tree_map_with_path(value, pt.unbox(abstract))
        scale = 2.0 if scan else 4.0
        out[scan, preset] = mesh, model, GPT(**KW, scan_layers=scan), jax.device_put(values, shardings), scale
    return out


@pytest.mark.parametrize("scan, preset", [(True, "fsdp"), (True, "fsdp_tp"), (False, "fsdp_tp")])
def test_step_0_of_a_lora_gpt_is_the_base_gpt_exactly(gpts, scan, preset):
    mesh, model, base, params, scale = gpts[scan, preset]
    assert np.array_equal(logits(model, params, mesh, preset), logits(base, base_of(params), mesh, preset))


def test_adapters_sit_beside_their_weights_with_the_lora_axis_and_lay_out_by_the_rules(gpts):
    mesh, model, base, params, scale = gpts[True, "fsdp_tp"]
    f = flat(params)
    assert f["blocks/attn/q_lora_a"].shape == (2, 32, 4) and f["blocks/attn/q_lora_b"].shape == (2, 4, 4, 8)
    assert f["blocks/attn/q_lora_b"].sharding.spec == P(None, None, "tensor", None)  # (layers, lora, heads, kv)
    assert f["blocks/attn/q_lora_a"].sharding.spec == P(None, "fsdp", None)  # (layers, embed, lora)
    assert f["blocks/mlp/wo_lora_a"].sharding.spec == P(None, "tensor", None)  # (layers, mlp, lora)
    assert f["blocks/attn/q_lora_a"].dtype == jnp.float32
    assert "blocks/attn/k_lora_a" not in f  # not a target
    names = pt.logical_names(jax.eval_shape(GPT(**KW, lora=LORA).init, jax.random.key(0), TOKENS))["params"]
    assert names["blocks"]["attn"]["q_lora_b"] == ("layers", "lora", "heads", "kv")
    assert names["unembed_lora_a"] == ("embed", "lora") and names["unembed_lora_b"] == ("lora", "vocab")
    unscanned = flat(gpts[False, "fsdp_tp"][3])
    assert unscanned["block_1/attn/v_lora_b"].shape == (4, 4, 8)  # (lora, kv_heads, kv)


@pytest.mark.parametrize("scan, preset", [(True, "fsdp"), (False, "fsdp_tp")])
def test_non_zero_adapters_compute_the_merged_weight(gpts, scan, preset):
    mesh, model, base, params, scale = gpts[scan, preset]
    params = random_adapters(params)
    got = logits(model, params, mesh, preset)
    want = logits(base, merged_by_hand(params, scale=scale), mesh, preset)
    assert not np.allclose(got, logits(base, base_of(params), mesh, preset), atol=1e-2)  # the adapters count
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_dropout_applies_in_training_only(gpts):
    mesh, model, base, params, scale = gpts[True, "fsdp"]
    params = random_adapters(params)
    dropout = GPT(**KW, lora={**LORA, "dropout": 0.5})

    @jax.jit
    def both(p, key):  # eval and training, one compile
        v = {"params": p}
        return dropout.apply(v, TOKENS), dropout.apply(v, TOKENS, deterministic=False, rngs={"dropout": key})

    with pt.sharding_context(mesh, "fsdp"):
        (evals, train1), (_, train2) = both(params, jax.random.key(1)), both(params, jax.random.key(2))
    assert np.array_equal(evals, logits(model, params, mesh, "fsdp"))  # deterministic: no dropout
    assert not np.allclose(train1, evals, atol=1e-3) and not np.allclose(train1, train2, atol=1e-3)


def test_adapters_in_bfloat16_params_stay_float32():
    model = GPT(**KW, param_dtype="bfloat16", lora={"rank": 2, "targets": ["attn/q$"]})
    params = jax.eval_shape(model.init, jax.random.key(0), TOKENS)["params"]
    assert params["blocks"]["attn"]["q"].value.dtype == jnp.bfloat16
    assert params["blocks"]["attn"]["q_lora_a"].value.dtype == jnp.float32
    model = GPT(**KW, lora={"rank": 2, "targets": ["attn/q$"], "dtype": "bfloat16"})
    assert (
        jax.eval_shape(model.init, jax.random.key(0), TOKENS)["params"]["blocks"]["attn"]["q_lora_b"].value.dtype
        == jnp.bfloat16
    )


# -- a Hugging Face checkpoint: load_hf(..., lora=) ---------------------------------------------------


@pytest.mark.parametrize("preset", ["fsdp", "fsdp_tp"])
def test_load_hf_with_lora_gives_the_checkpoints_logits_then_the_merged_weights(preset):
    mesh = pt.make_mesh(MESHES[preset])
    tokens, want = np.load(f"{LLAMA}/tokens.npy"), np.load(f"{LLAMA}/logits.npy")
    model, variables = pt.hf.load_hf(
        LLAMA, mesh, preset, lora={"rank": 4, "alpha": 8, "targets": ["attn/(q|v)$", "mlp/wo"]}
    )
    base, params = pt.hf.hf_model(LLAMA), variables["params"]
    q_b = params["blocks"]["attn"]["q_lora_b"]  # out_in, as PEFT's lora_B.weight (out, r): (layers, heads, kv, lora)
    assert q_b.shape == (2, 4, 8, 4) and not np.asarray(q_b).any()
    assert q_b.sharding.spec == (P(None, "tensor", None, None) if preset == "fsdp_tp" else P(None, None, None, None))
    assert params["blocks"]["attn"]["q_lora_a"].sharding.spec == P(None, None, "fsdp")  # (layers, lora, embed)

    q_a = params["blocks"]["attn"]["q_lora_a"]
    assert q_a.sharding.spec == P(None, None, "fsdp")  # (layers, lora, embed)
    assert q_a.dtype == jnp.float32 and 0 < float(jnp.abs(q_a).max()) <= 32**-0.5  # U(+-1/sqrt(in)), as PEFT

    @jax.jit
    def both(lora_params, base_params):  # the LoRA model and its base, one compile
        return model.apply({"params": lora_params}, tokens), base.apply({"params": base_params}, tokens)

    def run(p, q):
        with pt.sharding_context(mesh, preset):
            return tuple(np.asarray(x) for x in both(p, q))

    step0, base0 = run(params, base_of(params))
    assert np.array_equal(step0, base0)
    np.testing.assert_allclose(step0, want, atol=1e-4)  # transformers' logits
    if preset == "fsdp_tp":  # the merged weight, by hand, on the outputs-first layout
        params = random_adapters(params)
        got, want = run(params, merged_by_hand(params, scale=2.0, out_in=True))
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_load_hf_with_lora_on_explicit_mesh_axes():
    # The fresh adapters' init traces the model on a token batch that must split over Explicit axes (it was (1, 1)).
    mesh = pt.make_mesh(MESHES["fsdp_tp"], axis_types="explicit")
    model, variables = pt.hf.load_hf(LLAMA, mesh, "fsdp_tp", lora={"rank": 4, "targets": ["attn/(q|v)$"]})
    q_a = variables["params"]["blocks"]["attn"]["q_lora_a"]
    assert q_a.sharding.spec == P(None, None, "fsdp") and q_a.shape == (2, 4, 32)
    tokens, want = np.tile(np.load(f"{LLAMA}/tokens.npy"), (2, 1)), np.tile(np.load(f"{LLAMA}/logits.npy"), (2, 1, 1))
    with pt.sharding_context(mesh, "fsdp_tp"):
        got = np.asarray(jax.jit(model.apply)(variables, tokens))
    np.testing.assert_allclose(got, want, atol=1e-4)  # lora_b starts at zero: the checkpoint's logits


# -- any other model: LoRAModel (the weight path) ---------------------------------------------------


def test_the_weight_path_on_an_nnx_model_equals_the_activation_path_of_the_linen_gpt(gpts):
    """The NNX twin of the GPT (same paths and names) wrapped in LoRAModel gets the very adapters the Linen
    GPT makes (q: A (layers, embed, lora), B (layers, lora, heads, kv)); with the same params, the same logits."""
    mesh, model, base, params, scale = gpts[True, "fsdp"]
    params = random_adapters(params)
    twin = pt.finetune.LoRAModel(pt.NNXModel(lambda rngs: NNXGPT(**KW, rngs=rngs)), LORA)
    abstract = twin.abstract((TOKENS,), {})["params"]
    lin = pt.logical_names(jax.eval_shape(model.init, jax.random.key(0), TOKENS))["params"]
    assert pt.logical_names(abstract) == lin  # every adapter: the same shape and names on both paths
    assert lin["blocks"]["attn"]["o_lora_a"] == ("layers", "heads", "kv", "lora")
    with pt.sharding_context(mesh, "fsdp"):
        fn = jax.jit(lambda p: twin.apply({"params": p}, (TOKENS,), {}, rngs={}, train=False)[0])
        got = np.asarray(fn(params))
    np.testing.assert_allclose(got, logits(model, params, mesh, "fsdp"), rtol=2e-4, atol=2e-4)


def test_the_weight_path_on_a_users_linen_model_starts_at_the_base_and_lays_out_by_the_rules():
    mesh = pt.make_mesh(MESHES["fsdp_tp"])
    lm = MaxTextStyleLM(vocab=64, embed=32, mlp=64)
    model = pt.finetune.LoRAModel(lm, pt.finetune.LoRA(rank=2, targets=["^w[io]$"]))
    tokens = (TOKENS,)
    shardings = pt.unbox(pt.tree_shardings(model.abstract(tokens, {}), mesh, "fsdp_tp"))
    variables = jax.device_put(model.init(jax.random.key(0), tokens, {}), shardings)

    @jax.jit
    def both(v, w):  # the wrapped model and the model itself, one compile
        return model.apply(v, tokens, {}, rngs={}, train=False)[0], pt.as_model(lm).apply(
            w, tokens, {}, rngs={}, train=False
        )[0]

    with pt.sharding_context(mesh, "fsdp_tp"):
        out, base = both(variables, {"params": base_of(variables["params"])})
    p = variables["params"]
    assert sorted(p) == ["embedding", "wi", "wi_lora_a", "wi_lora_b", "wo", "wo_lora_a", "wo_lora_b"]
    assert p["wi_lora_a"].sharding.spec == P("fsdp", None) and p["wi_lora_b"].sharding.spec == P(None, "tensor")
    assert p["wo_lora_a"].shape == (64, 2) and p["wo_lora_b"].shape == (2, 32)
    assert np.array_equal(np.asarray(out), np.asarray(base))
    # The base init is the wrapped model's own: adapters draw from another stream.
    assert np.array_equal(
        np.asarray(p["wi"]), np.asarray(pt.as_model(lm).init(jax.random.key(0), tokens, {})["params"]["wi"])
    )


def test_lora_model_refuses_dropout_and_names_what_a_target_could_match():
    with pytest.raises(
        pt.ConfigError,
        match=r"lora.dropout must be 0 for this model, got 0.1: dropout on the adapters' input needs the activation",
    ):
        pt.finetune.LoRAModel(nn.Dense(4), {"rank": 2, "targets": ["kernel"], "dropout": 0.1})
    model = pt.finetune.LoRAModel(nn.Dense(4), {"rank": 2, "targets": ["kernal"]})
    with pytest.raises(pt.ConfigError) as e:
        model.abstract((jnp.zeros((2, 8)),), {})
    assert str(e.value) == (
        "lora.targets: 'kernal' matches no parameter of >= 2 dims LoRA can adapt; did you mean 'kernel'? "
        "(the 1 it can: kernel)"
    )
    assert e.value.arg == "lora.targets"


# -- bad options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, message",
    [
        ({"rank": 0, "targets": ["q"]}, "lora.rank must be an integer >= 1, got 0"),
        ({"rank": True, "targets": ["q"]}, "lora.rank must be an integer >= 1, got True"),
        ({"rank": 4, "alpha": -1, "targets": ["q"]}, "lora.alpha must be a number > 0, got -1"),
        ({"rank": 4, "targets": []}, "lora.targets must be a non-empty list of regexes"),
        ({"rank": 4, "targets": ["q("]}, "lora.targets: 'q(' is not a valid regex: missing ), unterminated subpattern"),
        ({"rank": 4, "targets": ["q"], "dropout": 1.0}, "lora.dropout must be a number in [0, 1), got 1.0"),
        ({"rank": 4, "targets": ["q"], "rslora": "yes"}, "lora.rslora must be true or false, got 'yes'"),
        (
            {"rank": 4, "targets": ["q"], "dtype": "float31"},
            "lora.dtype must be one of float32, bfloat16, float16, got 'float31'; did you mean 'float32'?",
        ),
        (
            {"rank": 4, "targets": ["q"], "ranks": 2},
            "unknown lora option 'ranks' (options: rank, alpha, targets, dropout, rslora, dtype, base_dtype, "
            "base_block); did you mean 'rank'?",
        ),
        ({"targets": ["q"]}, "lora needs a rank"),
        ({"rank": 4}, "lora needs targets"),
        ([4], "lora must be a mapping of rank, alpha, targets, dropout, rslora, dtype, base_dtype, base_block"),
    ],
)
def test_bad_lora_options_name_the_key(value, message):
    with pytest.raises(pt.ConfigError) as e:
        GPT(**KW, lora=value)
    assert str(e.value).startswith(message), str(e.value)
    assert e.value.arg.startswith("lora")


def test_a_target_matching_nothing_lists_what_it_could_match():
    from partitioning.models.lora import check_lora_targets

    with pytest.raises(pt.ConfigError) as e:
        check_lora_targets(GPT(**KW, lora={"rank": 4, "targets": ["attn/q$", "atn/k"]}))
    assert str(e.value) == (
        "lora.targets: 'atn/k' matches no weight LoRA can adapt; did you mean 'blocks/attn/k'? (the 8 it can: "
        "blocks/attn/q, blocks/attn/k, blocks/attn/v, blocks/attn/o, blocks/mlp/wi_0, blocks/mlp/wi_1, blocks/mlp/wo, "
        "unembed)"
    )
    # MoE experts and tied embeddings are not adapted: a target that only finds them matches nothing.
    moe = GPT(**KW, moe={"experts": 4, "top_k": 2}, tie_embeddings=True, lora={"rank": 4, "targets": ["mlp/"]})
    with pytest.raises(
        pt.ConfigError, match=r"'mlp/' matches no weight LoRA can adapt \(the 4 it can: blocks/attn/q, "
    ):
        check_lora_targets(moe)
