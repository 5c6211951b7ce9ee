"""An lm1b-style Linen Transformer, used as written: Flax's 2-name attention kernels, a config
dataclass, dropout through config.deterministic, inputs shifted inside the model."""

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import partitioning as pt
from examples.lm1b.models import TransformerConfig, TransformerLM


def model(dropout=0.0):
    return TransformerLM(TransformerConfig(num_heads=8, dropout_rate=dropout, attention_dropout_rate=dropout))


def test_plans_with_fewer_names_than_dimensions():
    params, opt = pt.abstract_train_state(model(), optax.adamw(1e-3), batch_size=8, seq_len=32, task="same_token")
    plan = pt.build_plan(
        params,
        opt,
        {"data": 1, "fsdp": 8},
        "fsdp",
        activations=pt.plan.activation_names(
            model(), params, {"data": 1, "fsdp": 8}, "fsdp", batch_size=8, seq_len=32, task="same_token"
        ),
    )
    specs = {leaf.path: (leaf.shape, leaf.spec) for leaf in plan.params}
    attn = "params/block_0/MultiHeadDotProductAttention_0"
    # ('embed', 'kv') on 3-D kernels: as in Flax, the trailing dimension is unsharded.
    assert specs[f"{attn}/query/kernel"] == ((64, 8, 8), P("fsdp", None, None))
    assert specs[f"{attn}/out/kernel"] == ((8, 8, 64), P("fsdp", None, None))
    assert specs["params/block_0/FeedForward_0/Dense_0/kernel"] == ((64, 128), P("fsdp", None))
    dims = {leaf.path: leaf.dims for leaf in plan.params}[f"{attn}/query/kernel"]
    assert dims[2].notes == ("no name (a trailing dimension): unsharded",)
    # No activation is constrained, but the input batch is split by the batch rule: it fires.
    assert plan.errors == [] and 0 not in [u.index for u in plan.unused_rules]
    assert not any("batch" in w and "never claims" in w for w in plan.warnings())


def test_same_losses_under_four_layouts_without_dropout(meshes, train_losses):
    losses = {}
    for preset in ("dp", "fsdp", "tp", "fsdp_tp"):
        trainer = pt.Trainer(
            model(),
            optax.adamw(3e-3),
            pt.make_mesh(meshes[preset]),
            preset,
            batch_size=8,
            seq_len=32,
            task="same_token",
        )
        _, losses[preset] = train_losses(trainer, trainer.init(jax.random.key(0)), 3)
    for preset in ("fsdp", "tp", "fsdp_tp"):
        np.testing.assert_allclose(losses[preset], losses["dp"], rtol=1e-4)
    assert losses["dp"][-1] < losses["dp"][0]


def test_dropout_is_reproducible_and_layout_independent(meshes, train_losses):
    runs = []
    for preset in ("dp", "dp", "fsdp"):
        trainer = pt.Trainer(
            model(dropout=0.1),
            optax.adamw(3e-3),
            pt.make_mesh(meshes[preset]),
            preset,
            batch_size=8,
            seq_len=32,
            task="same_token",
            seed=3,
        )
        _, losses = train_losses(trainer, trainer.init(jax.random.key(0)), 2)
        runs.append(losses)
    assert all(np.isfinite(runs[0]))
    assert runs[0] == runs[1]  # same seed: the same dropout masks
    np.testing.assert_allclose(runs[2], runs[0], rtol=1e-4)  # and the same on another layout
    # Eval mode flips config.deterministic: no dropout, so eval twice gives the same loss.
    trainer = pt.Trainer(
        model(dropout=0.5),
        optax.adamw(3e-3),
        pt.make_mesh(meshes["dp"]),
        "dp",
        batch_size=8,
        seq_len=32,
        task="same_token",
    )
    state = trainer.init(jax.random.key(0))
    batch = pt.data.load_corpus().batches("eval", 8, 32, trainer.batch_sharding).batch_at(0)
    assert float(trainer.eval_step(state.params, batch)["loss"]) == float(
        trainer.eval_step(state.params, batch)["loss"]
    )


def test_checkpoint_reshards_fsdp_to_tp_bit_exact(meshes, train_losses, tmp_path):
    fsdp = pt.Trainer(
        model(), optax.adamw(3e-3), pt.make_mesh(meshes["fsdp"]), "fsdp", batch_size=8, seq_len=32, task="same_token"
    )
    state, _ = train_losses(fsdp, fsdp.init(jax.random.key(0)), 2)
    pt.save_checkpoint(tmp_path / "ckpt", 2, state, rules=fsdp.rules, abstract=fsdp.abstract_state)
    tp = pt.Trainer(
        model(), optax.adamw(3e-3), pt.make_mesh(meshes["tp"]), "tp", batch_size=8, seq_len=32, task="same_token"
    )
    restored = pt.restore_checkpoint(
        tmp_path / "ckpt", pt.abstract_target(tp.abstract_state, shardings=tp.state_shardings)
    )
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    kernel = restored.params["block_0"]["FeedForward_0"]["Dense_0"]["kernel"]
    assert kernel.sharding.spec == P(None, "tensor")
