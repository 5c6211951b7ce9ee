"""Mixture of experts (partitioning.parallel.experts, the GPT's moe option, preset ep): routing and dispatch equal
a dense reference; ep, replicated experts and a data-parallel MoE give the same losses; tokens move with
all-to-all over `expert` and expert weights stay put; the load-balancing loss joins the objective; checkpoints
reshard between the layouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioning as pt
from partitioning.checkpoint import abstract_target, restore_checkpoint, save_checkpoint
from partitioning.config import load_config
from partitioning.config.build import model_from_config
from partitioning.parallel.experts import expert_capacity, moe_ffn, route, swiglu
from partitioning.plan.axes import collectives_by_axis
from partitioning.plan.hlo import collectives
from tests.parallel.conftest import small_gpt

G, S, D, E, M = 4, 16, 8, 4, 16
DROPLESS = {"experts": 8, "top_k": 2, "dropless": True}
EP = ({"data": 1, "fsdp": 2, "expert": 4}, "ep")
LAYOUTS = {"ep": EP, "fsdp": ({"data": 1, "fsdp": 8}, "fsdp"), "dp-moe": ({"data": 8, "fsdp": 1, "expert": 1}, "ep")}


@pytest.fixture(scope="module")
def moe_inputs():
    ks = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(ks[0], (G, S, D))
    router = jax.random.normal(ks[1], (D, E))
    w = (
        jax.random.normal(ks[2], (E, D, M)) / D**0.5,
        jax.random.normal(ks[3], (E, D, M)) / D**0.5,
        jax.random.normal(ks[4], (E, M, D)) / M**0.5,
    )
    return x, router, w


def reference(x, router, w, top_k, cap):
    """Token by token: every expert's output for every token, kept where the routing (and capacity) allows."""
    gates, idx, _ = route(jnp.einsum("gsd,de->gse", x, router), top_k)
    gates, idx = np.asarray(gates), np.asarray(idx)
    g_, s_, d_ = x.shape
    every = np.asarray(
        swiglu(jnp.broadcast_to(x[:, None], (g_, router.shape[1], s_, d_)), *w)
    )  # each expert, each token
    y = np.zeros_like(np.asarray(x))
    for g in range(x.shape[0]):
        taken = np.zeros(router.shape[1], int)
        for j in range(top_k):  # first choices of all tokens first
            for s in range(x.shape[1]):
                e = idx[g, s, j]
                if taken[e] < cap:
                    y[g, s] += gates[g, s, j] * every[g, e, s]
                taken[e] += 1
    return y


@pytest.mark.parametrize("top_k,cf", [(1, None), (2, None), (2, 1.0), (1, 0.5)])
def test_moe_ffn_equals_a_token_by_token_reference(moe_inputs, top_k, cf):
    x, router, w = moe_inputs
    cap = expert_capacity(S, E, top_k, cf)
    y, aux = jax.jit(lambda x: moe_ffn(x, router, w, top_k=top_k, capacity=cap))(x)
    np.testing.assert_allclose(y, reference(x, router, w, top_k, cap), rtol=1e-5, atol=1e-5)
    # The load-balancing loss: E * sum_e (share of assignments to e) * (mean router probability of e).
    probs = jax.nn.softmax(jnp.einsum("gsd,de->gse", x, router), -1)
    idx = jax.lax.top_k(probs, top_k)[1]
    share = np.bincount(np.asarray(idx).ravel(), minlength=E) / idx.size
    np.testing.assert_allclose(aux, E * np.sum(share * np.asarray(probs).mean((0, 1))), rtol=1e-5)


def test_capacity():
    assert expert_capacity(128, 8, 2, 1.25) == 40 and expert_capacity(128, 8, 2, None) == 128
    assert expert_capacity(16, 4, 1, 0.01) == 1 and expert_capacity(16, 4, 2, 100.0) == 16


def test_moe_ffn_gives_the_same_values_under_ep_and_moves_tokens_with_all_to_all(moe_inputs, mesh_of):
    """With dropping (capacity < tokens): routing is per sequence, so what is dropped does not depend on the layout."""
    x, router, w = moe_inputs
    cap = expert_capacity(S, E, 2, 1.0)
    assert cap < S
    f = jax.jit(lambda x, r, w: moe_ffn(x, r, w, top_k=2, capacity=cap))
    ref_y, ref_aux = f(x, router, w)
    mesh = mesh_of({"data": 1, "fsdp": 1, "expert": 4}, 4)
    with pt.sharding_context(mesh, "ep"):
        xs = jax.device_put(x, jax.NamedSharding(mesh, jax.P("expert")))
        ws = tuple(jax.device_put(a, jax.NamedSharding(mesh, jax.P("expert"))) for a in w)
        y, aux = f(xs, router, ws)
        ops = collectives(f.lower(xs, router, ws).compile().as_text())
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aux, ref_aux, rtol=1e-6)
    # Dispatch and combine: the (groups, experts, capacity, embed) buffer of one device (1 sequence here).
    a2a = collectives_by_axis(ops, {"expert": 4})["expert"]["all-to-all"]
    assert a2a == {"count": 2, "bytes": 2 * (1 * E * cap * D * 4)}
    # Nothing else moves the tokens: no all-gather of activations (top-k stays local to each token).
    assert [c.kind for c in ops if c.kind != "all-to-all" and c.bytes >= G * S * E * 4 // 4] == []


def test_expert_weights_are_named_expert_embed_mlp():
    params, _ = pt.abstract_train_state(
        small_gpt(layers=2, moe=DROPLESS), pt.make_optimizer("sgd", lr=0.1, total_steps=1), batch_size=8, seq_len=16
    )
    mlp = params["blocks"]["mlp"]
    names = {k: tuple(v.names) for k, v in mlp.items()}
    assert names == {
        "router": ("layers", "embed", "expert"),
        "wi_0": ("layers", "expert", "embed", "mlp"),
        "wi_1": ("layers", "expert", "embed", "mlp"),
        "wo": ("layers", "expert", "mlp", "embed"),
    }
    assert mlp["wi_0"].value.shape == (2, 8, 32, 64)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["fsdp", "dp-moe"])
def test_losses_equal_between_ep_and_layouts_without_it(runs, layout):
    _, _, ep_losses, ep_metrics = runs.run(("ep", "dropless"), small_gpt(layers=2, moe=DROPLESS), *EP)
    _, _, losses, metrics = runs.run((layout, "dropless"), small_gpt(layers=2, moe=DROPLESS), *LAYOUTS[layout])
    np.testing.assert_allclose(losses, ep_losses, rtol=1e-4)
    np.testing.assert_allclose([m["moe_aux_loss"] for m in metrics], [m["moe_aux_loss"] for m in ep_metrics], rtol=1e-4)
    assert ep_losses[-1] < ep_losses[0] - 0.5


def test_ep_moves_tokens_with_all_to_all_and_keeps_expert_weights_in_place(runs):
    tr, state, _, metrics = runs.run(("ep", "dropless"), small_gpt(layers=2, moe=DROPLESS), *EP)
    wi = state.params["blocks"]["mlp"]["wi_0"]  # (layers, expert, embed, mlp)
    assert tuple(wi.sharding.spec) == (None, "expert", "fsdp", None)
    assert wi.addressable_shards[0].data.shape == (2, 8 // 4, 32 // 2, 64)
    ops = collectives(tr.lower_train_step().compile().as_text())
    by_axis = collectives_by_axis(ops, {"data": 1, "fsdp": 2, "expert": 4})
    a2a = by_axis["expert"]["all-to-all"]
    # Dispatch and combine, forward and backward, in each of the 2 layers: the (groups, experts, capacity,
    # embed) buffer of this device: 16 sequences / 8 devices x 8 experts x 32 tokens (dropless) x 32 floats.
    assert a2a["count"] == 8 and a2a["bytes"] == 8 * (2 * 8 * 32 * 32 * 4)
    # ... which is the analytic figure `plan` prints.
    costs = pt.plan.parallel_costs(tr.model, tr.abstract_state.params, EP[0], EP[1], batch_size=16, seq_len=32)
    assert costs["experts"]["all_to_all_count"] == a2a["count"] and costs["experts"]["all_to_all_bytes"] == a2a["bytes"]
    assert costs["pipeline"]["stages"] == 1 and costs["pipeline"]["collective_permute_bytes"] == 0
    assert sum(v["all-to-all"]["count"] for k, v in by_axis.items() if k != "expert") == 0
    # Expert weights are never gathered over `expert` (the router and the dense weights, FSDP over fsdp x expert, are).
    one_layer_experts = 3 * 8 * 32 * 64 * 4
    over_expert = [
        c
        for c in ops
        if c.kind == "all-gather"
        and any("expert" in k.split("+") for k in collectives_by_axis([c], {"data": 1, "fsdp": 2, "expert": 4}))
    ]
    assert over_expert and all(c.bytes < one_layer_experts for c in over_expert)
    assert metrics[0]["moe_aux_loss"] > 0


def test_an_expert_axis_of_size_1_is_a_data_parallel_moe(runs):
    tr = runs.run(("dp-moe", "dropless"), small_gpt(layers=2, moe=DROPLESS), *LAYOUTS["dp-moe"])[0]
    assert not [c for c in collectives(tr.lower_train_step().compile().as_text()) if c.kind == "all-to-all"]


@pytest.mark.slow
def test_the_load_balancing_loss_joins_the_objective(runs):
    off = dict(DROPLESS, aux_loss_weight=0.0)
    _, s_off, l_off, m_off = runs.run(("fsdp", "no-aux"), small_gpt(layers=2, moe=off), *LAYOUTS["fsdp"], steps=2)
    _, s_on, l_on, m_on = runs.run(("fsdp", "dropless"), small_gpt(layers=2, moe=DROPLESS), *LAYOUTS["fsdp"])
    # The `loss` metric is the task's cross entropy: the same at the same init ...
    assert l_off[0] == pytest.approx(l_on[0], rel=1e-6)
    assert m_off[0]["moe_aux_loss"] == 0 and m_on[0]["moe_aux_loss"] > 0
    # ... and the aux term's gradient changed the router (and so the next loss).
    assert l_off[1] != pytest.approx(l_on[1], rel=1e-6)


def test_checkpoints_reshard_between_ep_and_replicated_experts(runs, tmp_path, assert_bit_exact):
    ep_tr, ep_state, _, _ = runs.run(("ep", "dropless"), small_gpt(layers=2, moe=DROPLESS), *EP)
    fs_tr = runs.run(("fsdp", "dropless"), small_gpt(layers=2, moe=DROPLESS), *LAYOUTS["fsdp"])[0]
    save_checkpoint(tmp_path, 3, ep_state)
    back = restore_checkpoint(tmp_path, abstract_target(fs_tr.abstract_state, shardings=fs_tr.state_shardings))
    assert_bit_exact(back, ep_state)
    assert tuple(back.params["blocks"]["mlp"]["wi_0"].sharding.spec) == (None, None, "fsdp", None)
    _, a = ep_tr.train_step(ep_state, runs.batches(ep_tr).batch_at(3))
    _, b = fs_tr.train_step(back, runs.batches(fs_tr).batch_at(3))
    np.testing.assert_allclose(float(b["loss"]), float(a["loss"]), rtol=1e-4)


@pytest.mark.parametrize(
    "moe,message",
    [
        ("{experts: 8, topk: 2}", "unknown moe option 'topk'"),
        ("{experts: 4, top_k: 5}", "moe needs experts >= 1 and 1 <= top_k <= experts"),
        ("{experts: 4, capacity_factor: 0}", "moe.capacity_factor must be > 0 (or set dropless: true)"),
        ("{experts: 4.5}", "moe.experts must be an integer, got 4.5"),
        ("{experts: 4, dropless: 1}", "moe.dropless must be true or false, got 1"),
        ("{experts: 4, aux_loss_weight: -1}", "moe.aux_loss_weight must be a number >= 0, got -1"),
        ("[8, 2]", "moe must be a mapping of"),
    ],
)
def test_bad_moe_options_name_the_key(moe, message, write):
    path = write(
        "moe.yaml",
        f"model: {{name: gpt, embed: 32, heads: 4, mlp: 64, layers: 2, moe: {moe}}}\n"
        "mesh: {shape: {data: 1, fsdp: -1, expert: 1}}\nrules: ep\n",
    )
    with pytest.raises(pt.ConfigError) as e:
        model_from_config(load_config(path))
    assert str(e.value).startswith(f"{path}:1: model.moe: {message}")
