"""Context parallelism: attention over a `length` split across the `context` axis equals attention over the
whole sequence — values and gradients, ring and all_gather, causal with packed rows, sliding windows and
soft-caps, grouped-query heads — for the kernel, the reference GPT and a Hugging Face family; and the
ring holds less than the gather."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioning as pt
from partitioning.errors import ConfigError
from partitioning.models import GPT
from partitioning.parallel.context import attend, balance, context_attention, context_axes, resolve_strategy

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STRATEGIES = ("ring", "all_gather")
MESH = {"data": 1, "fsdp": 2, "context": 4}  # the layout: params over fsdp x context, length over context


@pytest.fixture(scope="module")
def mesh():
    return pt.make_mesh(MESH)


@pytest.fixture(scope="module")
def qkv():
    b, t, h, g, d = 2, 32, 4, 2, 8
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, t, h, d))
    k, v = jax.random.normal(ks[1], (b, t, g, d)), jax.random.normal(ks[2], (b, t, g, d))
    w = jax.random.normal(ks[3], (b, t, h, d))  # the gradient's direction
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    seg = jnp.concatenate([jnp.ones((b, 20), jnp.int32), jnp.full((b, 12), 2, jnp.int32)], 1)
    pos_packed = jnp.where(seg == 1, pos, pos - 20)  # positions restart with the second example
    return q, k, v, w, pos, seg, pos_packed


CASES = {
    "causal": {},
    "window": {"window": 5},
    "packed": {"packed": True},
    "softcap": {"softcap": 3.0},
    "all": {"window": 7, "packed": True, "softcap": 2.0},
}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES)
def test_split_attention_equals_whole_attention_values_and_gradients(mesh, qkv, strategy, case):
    q, k, v, w, pos, seg, pos_packed = qkv
    opts = CASES[case]
    seg_, pos_ = (seg, pos_packed) if opts.get("packed") else (None, pos)
    kw = dict(scale=8**-0.5, window=opts.get("window"), softcap=opts.get("softcap"))

    def whole(q, k, v):
        return attend(q, k, v, pos_, pos_, seg_, seg_, **kw)

    def split(q, k, v):
        return context_attention(q, k, v, pos_, pos_, seg_, seg_, strategy=strategy, **kw)

    with pt.sharding_context(mesh, "fsdp_cp"):
        assert context_axes() == ("context",)
        got = jax.jit(split)(q, k, v)
        grads = jax.jit(jax.grad(lambda *a: jnp.sum(split(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    assert got.sharding.spec[1] == "context"  # the output stays split: no device holds the whole sequence
    want = whole(q, k, v)
    want_grads = jax.grad(lambda *a: jnp.sum(whole(*a) * w), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for g_, w_ in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5)


def test_the_balanced_order_pairs_chunk_i_with_chunk_2c_minus_1_minus_i(mesh):
    x = jnp.arange(2 * 16).reshape(2, 16)
    with pt.sharding_context(mesh, "fsdp_cp"):
        y = jax.jit(balance)(x)
        back = jax.jit(lambda y: balance(y, inverse=True))(y)
    # 4 context devices, 8 chunks of 2: device i holds chunks i and 7 - i.
    assert y[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert (back == x).all()


def test_without_a_split_length_it_is_plain_attention(qkv):
    q, k, v, _, pos, _, _ = qkv
    assert context_axes() == ()
    np.testing.assert_allclose(context_attention(q, k, v, pos, pos), attend(q, k, v, pos, pos, scale=8**-0.5))


def _loss(model, params, batch):
    logits = model.apply(
        {"params": params}, batch["inputs"], segment_ids=batch.get("segment_ids"), positions=batch.get("positions")
    )
    loss, _ = pt.model.lm_loss(logits, batch)
    return loss


def _batch(vocab: int, packed: bool):
    tokens = jax.random.randint(jax.random.key(3), (4, 33), 0, vocab)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    if packed:  # two examples a row: 20 + 12 tokens
        seg = jnp.concatenate([jnp.ones((4, 20), jnp.int32), jnp.full((4, 12), 2, jnp.int32)], 1)
        batch["segment_ids"] = seg
        batch["positions"] = jnp.where(seg == 1, jnp.arange(32), jnp.arange(32) - 20)
    return batch


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gpt_loss_and_gradients_under_fsdp_cp_equal_the_unsharded_model(mesh, strategy):
    model = GPT(
        vocab_size=64, embed=32, heads=4, kv_heads=2, mlp=64, layers=2, sliding_window=12, context_parallel=strategy
    )
    for packed in (False, True):
        batch = _batch(64, packed)
        params = pt.unbox(model.init(jax.random.key(0), batch["inputs"]))["params"]
        loss = functools.partial(_loss, model, batch=batch)
        want, want_g = jax.value_and_grad(loss)(params)
        with pt.sharding_context(mesh, "fsdp_cp"):
            got, got_g = jax.jit(jax.value_and_grad(loss))(params)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# Llama: grouped-query heads; Gemma 2: soft-capped scores, local and global layers; GPT-OSS: sinks, sliding
# layers, experts; SmolLM3: layers without RoPE.
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss", "smollm3"])
def test_hugging_face_families_give_the_same_logits(mesh, family):
    path = FIXTURES / "hf" / family
    model, variables = pt.hf.load_hf(path)
    assert model.kv_heads is None or model.kv_heads <= model.heads
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, model.vocab_size)
    want = model.apply(variables, tokens)
    _, sharded = pt.hf.load_hf(path, mesh, "fsdp_cp")  # every weight born in its fsdp x context shard
    with pt.sharding_context(mesh, "fsdp_cp"):
        for strategy in STRATEGIES:
            got = jax.jit(model.clone(context_parallel=strategy).apply)(sharded, tokens)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_ring_holds_less_than_the_gather(mesh):
    """Each device's temporary memory for one attention: the ring's is bounded by a block pair, the gather's
    grows with the whole sequence (the compiled step's own memory analysis)."""
    b, t, h, d = 1, 2048, 4, 32
    x = jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)
    pos = jax.ShapeDtypeStruct((b, t), jnp.int32)
    temp = {}
    with pt.sharding_context(mesh, "fsdp_cp"):
        for strategy in STRATEGIES:
            f = jax.jit(lambda q, k, v, p, s=strategy: context_attention(q, k, v, p, p, strategy=s))
            temp[strategy] = f.lower(x, x, x, pos).compile().memory_analysis().temp_size_in_bytes
    # Scores: the gather holds a (T/4 x T) block per head, the ring a (T/4 x T/4) one.
    assert temp["ring"] * 2 < temp["all_gather"], temp


def test_auto_gathers_short_sequences_and_rings_long_ones(mesh):
    with pt.sharding_context(mesh, "fsdp_cp"):
        assert resolve_strategy("auto", 4096, ("context",)) == "all_gather"
        assert resolve_strategy("auto", 32768, ("context",)) == "ring"
        assert resolve_strategy("ring", 128, ("context",)) == "ring"


def test_a_bad_strategy_is_one_line():
    with pytest.raises(ConfigError, match=r"^context_parallel must be one of all_gather, ring or auto, got 'rings'$"):
        GPT(context_parallel="rings")


def test_explicit_mesh_axes_too():
    mesh = pt.make_mesh(MESH, axis_types="explicit")
    model = GPT(vocab_size=64, embed=32, heads=4, kv_heads=2, mlp=64, layers=1, context_parallel="ring")
    batch = _batch(64, packed=True)
    params = pt.unbox(model.init(jax.random.key(0), batch["inputs"]))["params"]
    want = _loss(model, params, batch)
    with pt.sharding_context(mesh, "fsdp_cp"):
        got = jax.jit(functools.partial(_loss, model, batch=batch))(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- plan, tune and the run config ------------------------------------------------------------------------


def test_tune_prices_both_strategies_and_the_ring_holds_less():
    import optax

    from partitioning.tune.price import price
    from partitioning.tune.space import Candidate, candidates

    model = GPT(vocab_size=32000, embed=1024, heads=8, kv_heads=8, mlp=4096, layers=4, dtype="bfloat16")
    params, opt = pt.abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=32768)
    w = pt.tune.workload(pt.build_plan(params, opt, {"data": 8}, "dp").params, batch_size=8, seq_len=32768)
    rules = pt.Rules.preset("fsdp_cp")
    cands = candidates(8, {"fsdp_cp": rules}, batch_size=8, seq_len=32768)
    split = [c for c in cands if dict(c.mesh).get("context", 1) > 1]
    assert {c.context for c in split} == {"ring", "all_gather"}
    assert all(c.context is None for c in cands if dict(c.mesh).get("context", 1) == 1)
    h100 = pt.tune.hardware("h100")
    mesh = (("data", 1), ("fsdp", 1), ("context", 8))
    ring, gather = (
        price(params, opt, Candidate(mesh, "fsdp_cp", "full", context=s), rules, w, h100, 80 * 2**30)
        for s in ("ring", "all_gather")
    )
    # The gather keeps a (T/8 x T) score block per head for the backward pass; the ring one (T/8)^2 block at a time.
    assert ring.activations["total"] < gather.activations["total"] / 3
    kinds = {(c.kind, c.axes) for c in ring.estimate.comm if "ring" in c.what}
    assert kinds == {("collective-permute", ("context",))}
    assert any(c.kind == "all-gather" and "keys and values" in c.what for c in gather.estimate.comm)
    assert "model.context_parallel=ring" in ring.candidate.overrides(rules, None)
    rejected = []
    candidates(8, {"fsdp_cp": rules}, batch_size=8, seq_len=1001, rejected=rejected)
    assert any(why == "length: 1001 tokens do not split over the 2 devices of context" for _, why in rejected)


def test_check_resolves_auto_to_a_priced_strategy(tmp_path, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(tmp_path)
    r = run_cli_in_process(
        "check",
        Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml",
        "--set",
        "rules=fsdp_cp",
        "--set",
        "mesh.shape={data: 1, fsdp: 2, context: 4}",
        "--set",
        "model.layers=1",
        "--set",
        "model.embed=32",
        "--set",
        "model.mlp=64",
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("context_parallel: auto -> "))
    assert line.split(": est.")[0] in ("context_parallel: auto -> ring", "context_parallel: auto -> all_gather")
    assert ("ring " in line) != line.startswith("context_parallel: auto -> ring")  # the other one, priced


def test_a_config_names_its_strategy_and_a_wrong_one_is_one_line(tmp_path, monkeypatch, run_cli_in_process):
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    r = run_cli_in_process("check", config, "--set", "model.context_parallel=rings")
    assert r.returncode == 2
    assert r.stderr.strip().endswith(
        "model.context_parallel: context_parallel must be one of all_gather, ring or auto, got 'rings'"
    )


def test_generate_prefills_through_the_split_cache_and_decodes_the_same_tokens():
    path = FIXTURES / "hf" / "llama"
    mesh = pt.make_mesh({"data": 1, "fsdp": 1, "context": 8})
    prompt = [1, 272, 203, 90, 3, 17, 45, 99, 12, 5, 61, 200, 33, 8, 150, 7]  # 16 tokens: chunks of 16 split by 8
    plain = pt.make_mesh({"data": 1, "fsdp": 8})
    model, variables = pt.hf.load_hf(path, plain, "fsdp")
    want = pt.decode.generate(model, variables["params"], prompt, mesh=plain, rules="fsdp", max_tokens=6)
    _, sharded = pt.hf.load_hf(path, mesh, "fsdp_cp")
    for strategy in STRATEGIES:
        m = model.clone(context_parallel=strategy)
        got = pt.decode.generate(m, sharded["params"], prompt, mesh=mesh, rules="fsdp_cp", max_tokens=6)
        assert got == want, strategy
    # The 16-token prefill chunk went around the ring: its step passes key/value blocks on.
    from partitioning.decode.generate import Decoder

    dec = Decoder(model.clone(context_parallel="ring"), mesh, "fsdp_cp", max_len=22)
    assert dec.max_len == 24  # rounded up so the cache splits over the 8 context devices
    tokens = jax.device_put(jnp.zeros((dec.rows, 16), jnp.int32), dec.token_sharding)
    with pt.sharding_context(mesh, "fsdp_cp"):
        hlo = dec._step.lower(sharded["params"], dec._zeros(), tokens, jax.random.key(0), sampling=pt.decode.Sampling())
    assert "collective-permute" in hlo.compile().as_text()


def test_lora_adapters_train_the_same_under_context_parallelism(mesh):
    model = GPT(
        vocab_size=64,
        embed=32,
        heads=4,
        kv_heads=2,
        mlp=64,
        layers=1,
        lora={"rank": 4, "targets": ["attn/(q|v)$"]},
        context_parallel="ring",
    )
    batch = _batch(64, packed=False)
    params = pt.unbox(model.init(jax.random.key(0), batch["inputs"]))["params"]
    params = jax.tree.map(lambda x: x + 0.01, params)  # B != 0: the adapters change the logits
    loss = functools.partial(_loss, model, batch=batch)
    want, want_g = jax.value_and_grad(loss)(params)
    with pt.sharding_context(mesh, "fsdp_cp"):
        got, got_g = jax.jit(jax.value_and_grad(loss))(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    a = got_g["blocks"]["attn"]["q_lora_a"]
    np.testing.assert_allclose(a, want_g["blocks"]["attn"]["q_lora_a"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_attention_sinks_join_the_split_softmax(mesh, qkv, strategy):
    """GPT-OSS's sinks: a logit per head in every row's softmax, carried by each query's log-sum-exp."""
    from partitioning.models.variants import sink_softmax

    q, k, v, w, pos, _, _ = qkv
    sinks = jnp.array([0.5, -1.0, 2.0, 0.0])

    def whole(q, k, v, sinks):
        s = jnp.einsum("btgrd,bsgd->bgrts", q.reshape(2, 32, 2, 2, 8), k) * 8**-0.5
        s = jnp.where((pos[:, None, :] <= pos[:, :, None])[:, None, None], s, -1e30)
        p = sink_softmax(s, sinks)
        return jnp.einsum("bgrts,bsgd->btgrd", p, v).reshape(q.shape)

    def split(q, k, v, sinks):
        return context_attention(q, k, v, pos, pos, strategy=strategy, sinks=sinks)

    with pt.sharding_context(mesh, "fsdp_cp"):
        got = jax.jit(split)(q, k, v, sinks)
        grads = jax.jit(jax.grad(lambda *a: jnp.sum(split(*a) * w), argnums=(0, 1, 2, 3)))(q, k, v, sinks)
    np.testing.assert_allclose(got, whole(q, k, v, sinks), rtol=1e-5, atol=1e-6)
    want = jax.grad(lambda *a: jnp.sum(whole(*a) * w), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for g_, w_ in zip(grads, want, strict=True):
        np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-5)
