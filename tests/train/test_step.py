"""Trainer (partitioning.train.step): sharded init, shardings from the rules, layout-independent numerics,
grad accumulation, the compiled step."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.boxes import is_box, is_logical_box
from partitioning.data.corpus import TokenBatches, load_corpus
from partitioning.errors import ShardingError
from partitioning.models import MLP
from partitioning.train import Trainer
from partitioning.train.state import host_scalar


def test_loss_decreases_on_quickstart_model(tokens, gpt_fsdp, run_steps, seq_len):
    trainer = gpt_fsdp
    state, losses = run_steps(trainer, tokens, 20)
    assert losses[0] > 5.0
    assert np.mean(losses[-3:]) < losses[0] - 1.5, losses
    assert host_scalar(state.step) == 20
    ev = trainer.eval_step(
        state.params, TokenBatches(load_corpus().eval, 16, seq_len, trainer.batch_sharding).batch_at(0)
    )
    assert host_scalar(ev["loss"]) < losses[0] - 1.5


def _leaves_with_layouts(boxed, arrays):
    """(boxed leaf, concrete array) pairs in flattening order."""
    b = jax.tree_util.tree_leaves(boxed, is_leaf=is_box)
    a = jax.tree_util.tree_leaves(arrays)
    assert len(a) == len(b)
    return list(zip(b, a, strict=True))


@pytest.mark.parametrize(
    "rules,mesh_shape", [("fsdp", {"data": 1, "fsdp": 8}), ("fsdp_tp", {"data": 1, "fsdp": 4, "tensor": 2})]
)
def test_every_leaf_has_the_sharding_its_rules_imply(
    rules, mesh_shape, gpt_fsdp, tiny_gpt, norm_spec, batch_size, seq_len
):
    mesh = pt.make_mesh(mesh_shape)
    table = pt.Rules.preset(rules)
    trainer = (
        gpt_fsdp
        if rules == "fsdp"
        else Trainer(tiny_gpt(), gpt_fsdp.tx, mesh, table, batch_size=batch_size, seq_len=seq_len)
    )
    state = trainer.init(jax.random.key(0))
    checked = 0
    for part in ("params", "opt_state"):
        pairs = _leaves_with_layouts(getattr(trainer.abstract_state, part), getattr(state, part))
        for boxed, arr in pairs:
            if is_logical_box(boxed):
                dims = table.explain(tuple(boxed.names), boxed.value.shape, mesh)
                expected = tuple(d.mesh_axes for d in dims)
                checked += 1
            else:
                expected = (None,) * arr.ndim
            assert norm_spec(arr.sharding.spec, arr.ndim) == norm_spec(expected, arr.ndim), (part, boxed)
            # The shard really is that small: nothing is held whole.
            shard = arr.addressable_shards[0].data.shape
            sizes = [
                1 if e is None else int(np.prod([mesh.shape[a] for a in ((e,) if isinstance(e, str) else e)]))
                for e in norm_spec(expected, arr.ndim)
            ]
            assert shard == tuple(s // n for s, n in zip(arr.shape, sizes, strict=True))
    assert checked == 3 * len(jax.tree.leaves(state.params))  # params, adam mu and nu
    # Spot-check concrete values, independent of explain().
    wi = state.params["blocks"]["mlp"]["wi_0"]  # (layers, embed, mlp)
    mu = state.opt_state[1].inner_state[0].mu["blocks"]["mlp"]["wi_0"]  # (clip, adamw) chain
    expect = (None, "fsdp", None) if rules == "fsdp" else (None, "fsdp", "tensor")
    assert norm_spec(wi.sharding.spec, 3) == expect
    assert norm_spec(mu.sharding.spec, 3) == expect
    assert norm_spec(state.step.sharding.spec, 0) == ()
    # state_layouts() agrees with the arrays, with paths.
    layouts = {leaf.path: leaf for leaf in trainer.state_layouts()}
    assert norm_spec(layouts["params/blocks/mlp/wi_0"].spec, 3) == expect
    assert norm_spec(layouts["opt_state/1/inner_state/0/mu/blocks/mlp/wi_0"].spec, 3) == expect


def test_optimizer_rules_give_zero1_layout(tokens, mlp_fsdp, norm_spec, batches, batch_size, seq_len):
    fsdp = mlp_fsdp
    replicated = pt.Rules([("batch", ("data", "fsdp"))])
    zero1 = Trainer(
        fsdp.model, fsdp.tx, fsdp.mesh, replicated, batch_size=batch_size, seq_len=seq_len, optimizer_rules="fsdp"
    )
    state = zero1.init(jax.random.key(0))

    def adam(opt_state):
        return opt_state.inner_state[0]  # inject_hyperparams -> the adamw chain

    wi, mu = state.params["wi_0"], adam(state.opt_state).mu["wi_0"]
    assert wi.sharding.is_fully_replicated
    assert norm_spec(mu.sharding.spec, 2) == ("fsdp", None)
    assert mu.addressable_shards[0].data.shape == (64 // 8, 128)
    # Same numbers as plain FSDP from the same start: only the layout differs.
    host = jax.tree.map(np.asarray, state)  # a copy: device_put may alias arrays the step donates
    states = {"zero1": (zero1, state), "fsdp": (fsdp, jax.device_put(host, fsdp.state_shardings))}
    losses = {}
    for name, (trainer, st) in states.items():
        data = batches(trainer, tokens)
        losses[name] = []
        for k in range(3):
            st, m = trainer.train_step(st, data.batch_at(k))
            losses[name].append(host_scalar(m["loss"]))
        if name == "zero1":  # the step keeps the layout
            assert st.params["wi_0"].sharding.is_fully_replicated
            assert norm_spec(adam(st.opt_state).nu["wi_0"].sharding.spec, 2) == ("fsdp", None)
    np.testing.assert_allclose(losses["zero1"], losses["fsdp"], rtol=1e-5)
    assert losses["zero1"][-1] < losses["zero1"][0]


@pytest.fixture(scope="module")
def auto_runs(tokens, tiny_gpt, batches, norm_spec, batch_size, seq_len, meshes):
    """{rules: (losses of 5 steps, stored param specs)} of the 1-layer GPT under the five presets on Auto axes,
    all from the same start; and that start (host arrays)."""
    runs, start = {}, None
    for rules, shape in meshes.items():
        trainer = Trainer(
            tiny_gpt(layers=1), optax.adamw(1e-2), pt.make_mesh(shape), rules, batch_size=batch_size, seq_len=seq_len
        )
        if rules in ("dp", "fsdp_tp"):  # two real sharded inits: the values do not depend on the layout
            state = trainer.init(jax.random.key(3))
            emb = np.asarray(state.params["embedding"])
            if start is None:
                start, ref_emb = jax.tree.map(np.asarray, state), emb
            np.testing.assert_array_equal(emb, ref_emb)
        else:  # the others start from the same values (saves compiling their init)
            state = jax.device_put(start, trainer.state_shardings)
        data = batches(trainer, tokens)
        out = []
        for k in range(5):
            state, m = trainer.train_step(state, data.batch_at(k))
            out.append(host_scalar(m["loss"]))
        runs[rules] = (out, jax.tree.map(lambda a: norm_spec(a.sharding.spec, a.ndim), state.params))
    return runs, start


@pytest.mark.slow  # ~20 s: six compiles of the GPT step and init (shared with the Explicit-axes test)
def test_same_losses_under_dp_fsdp_tp_fsdp_tp_seq(auto_runs, meshes):
    runs, _ = auto_runs
    for rules in meshes:
        np.testing.assert_allclose(runs[rules][0], runs["dp"][0], rtol=1e-4, err_msg=rules)
    assert runs["dp"][0][-1] < runs["dp"][0][0] - 0.5  # and it did train


def test_bf16_compute_with_remat_trains_f32_params(tokens, tiny_gpt, run_steps, batch_size, seq_len):
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    model = tiny_gpt(layers=1, dtype="bfloat16", remat="full")
    trainer = Trainer(model, optax.adam(1e-2), mesh, "fsdp", batch_size=batch_size, seq_len=seq_len)
    state, losses = run_steps(trainer, tokens, 6)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.5, losses


class ThirdParty(nn.Module):
    """Written against plain Flax: nn.with_logical_partitioning, nn.Dense, nn.Embed."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(
            256, 32, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed"))
        )(tokens)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        h = nn.Dense(
            64,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
            use_bias=False,
        )(x)
        h = nn.with_logical_constraint(nn.gelu(h), ("batch", "length", "mlp"))
        x = x + nn.Dense(
            32,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")),
            use_bias=False,
        )(h)
        return nn.Dense(
            256,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "vocab")),
            use_bias=False,
        )(x)


def test_plain_flax_third_party_module_trains(tokens, run_steps, norm_spec, batch_size, seq_len):
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    trainer = Trainer(ThirdParty(), optax.adam(3e-2), mesh, "fsdp", batch_size=batch_size, seq_len=seq_len)
    state, losses = run_steps(trainer, tokens, 8)
    assert losses[-1] < losses[0] - 1.0, losses
    assert norm_spec(state.params["Dense_0"]["kernel"].sharding.spec, 2) == ("fsdp", None)
    assert norm_spec(state.params["Embed_0"]["embedding"].sharding.spec, 2) == (None, "fsdp")
    assert norm_spec(state.opt_state[0].nu["Dense_1"]["kernel"].sharding.spec, 2) == (None, "fsdp")


def test_grad_accumulation_matches_one_big_batch(tokens, batches):
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    tx = optax.sgd(0.5)
    results = {}
    for accum in (1, 4):
        trainer = Trainer(MLP(embed=64, mlp=128), tx, mesh, "fsdp", batch_size=32, seq_len=16, grad_accum=accum)
        state = trainer.init(jax.random.key(0))
        start = jax.tree.map(np.asarray, state.params)
        state, m = trainer.train_step(state, batches(trainer, tokens).batch_at(0))
        results[accum] = (jax.tree.map(np.asarray, state.params), {k: host_scalar(v) for k, v in m.items()})
    (p1, m1), (p4, m4) = results[1], results[4]
    assert m1["loss"] == pytest.approx(m4["loss"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m4["grad_norm"], rel=1e-4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p1, p4)
    assert np.abs(p1["unembed"] - start["unembed"]).max() > 1e-3  # the step did change the params


def test_compiled_step_is_inspectable_and_donates_state(gpt_fsdp, seq_len):
    trainer = gpt_fsdp
    compiled = trainer.lower_train_step().compile()
    mem = compiled.memory_analysis()
    state_bytes = pt.layout.per_device_bytes(trainer.state_layouts()) + 4  # + the step counter
    batch_bytes = 2 * (trainer.batch_size // 8) * seq_len * 4
    # Arguments are the per-device shards only; the whole state is aliased to the output (donated).
    assert mem.argument_size_in_bytes == pytest.approx(state_bytes + batch_bytes, rel=0.01)
    assert mem.alias_size_in_bytes >= 0.99 * state_bytes
    hlo = compiled.as_text()
    assert "all-gather" in hlo or "all-reduce" in hlo  # FSDP gathers weights
    # The init never holds more than the final per-device state (RNG scratch included).
    assert state_bytes <= trainer.init_peak_bytes() <= 1.01 * state_bytes


def test_indivisible_batch_and_bad_grad_accum_are_errors(tiny_gpt, seq_len, batch_size):
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    with pytest.raises(
        ShardingError, match=r"batch_size 12 is not divisible by the batch mesh axes \('data', 'fsdp'\) of size 8"
    ):
        Trainer(tiny_gpt(), optax.sgd(0.1), mesh, "fsdp", batch_size=12, seq_len=seq_len)
    with pytest.raises(ShardingError, match=r"micro-batch 4 \(batch_size 16 / grad_accum 4\) is not divisible"):
        Trainer(tiny_gpt(), optax.sgd(0.1), mesh, "fsdp", batch_size=16, seq_len=seq_len, grad_accum=4)
    with pytest.raises(ShardingError, match="batch_size 16 must be a positive multiple of grad_accum 3"):
        Trainer(tiny_gpt(), optax.sgd(0.1), mesh, "fsdp", batch_size=16, seq_len=seq_len, grad_accum=3)
    wi = r"^params/blocks/mlp/wi_0, params/blocks/mlp/wi_1: dim 2 \('mlp', size 62\) is not divisible"
    with pytest.raises(ShardingError, match=wi):
        Trainer(
            tiny_gpt(mlp=62),
            optax.sgd(0.1),
            pt.make_mesh({"data": 2, "tensor": 4}),
            "tp",
            batch_size=batch_size,
            seq_len=seq_len,
        )


def test_declared_batch_axes_shard_the_batch_and_the_compute_layout(tiny_gpt, seq_len):
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    rules = pt.Rules.preset("fsdp").with_batch_axes(["data"])
    trainer = Trainer(tiny_gpt(), optax.sgd(0.1), mesh, rules, batch_size=4, seq_len=seq_len)
    assert trainer.batch_sharding.spec == P("data", None)
    # Params keep their stored (rule) layout; the step computes with them sharded over fsdp too.
    assert trainer.state_shardings.params["blocks"]["mlp"]["wi_0"].spec == P(None, "fsdp", None)
    assert pt.boxes.compute_spec(("embed", "mlp"), rules) == P("fsdp", None)


@pytest.mark.slow  # ~15 s: five compiles of the GPT step (the Auto runs are auto_runs')
def test_explicit_mesh_axes_train_to_the_same_losses_as_auto(
    tokens, tiny_gpt, batches, norm_spec, batch_size, seq_len, meshes, auto_runs
):
    """On Explicit axes the models gather FSDP params and name the layouts JAX cannot infer."""
    runs, start = auto_runs
    for rules, shape in meshes.items():
        mesh = pt.make_mesh(shape, axis_types="explicit")
        trainer = Trainer(tiny_gpt(layers=1), optax.adamw(1e-2), mesh, rules, batch_size=batch_size, seq_len=seq_len)
        state = jax.device_put(start, trainer.state_shardings)
        data = batches(trainer, tokens)
        losses = []
        for k in range(5):
            state, m = trainer.train_step(state, data.batch_at(k))
            losses.append(host_scalar(m["loss"]))
        np.testing.assert_allclose(losses, runs[rules][0], rtol=1e-4, err_msg=rules)
        # Params stay stored in their rule layout (FSDP still saves memory); only compute gathers.
        stored = jax.tree.map(lambda a: norm_spec(a.sharding.spec, a.ndim), state.params)
        assert stored == runs[rules][1], rules
        if rules == "fsdp":
            assert stored["embedding"] == (None, "fsdp")
    assert losses[-1] < losses[0]
