"""A Linen CNN with BatchNorm (mutable batch_stats, a `train` call argument) on a generated image set."""

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import partitioning as pt
from tests.byom.models.image_linen import ConvNet, bars


def run(preset, meshes, data, steps=5, model=None):
    trainer = pt.Trainer(
        model or ConvNet(),
        optax.adam(1e-2),
        pt.make_mesh(meshes[preset]),
        preset,
        batch=data.example(32),
        task="classification",
    )
    state = trainer.init(jax.random.key(0))
    batches = data.batches("train", 32, trainer.batch_shardings, seed=0)
    losses = []
    for i in range(steps):
        state, m = trainer.train_step(state, batches.batch_at(i))
        losses.append(float(m["loss"]))
    return trainer, state, losses


def test_trains_under_dp_and_fsdp_to_the_same_losses_and_carries_batch_stats(meshes):
    data = bars()
    dp, dp_state, dp_losses = run("dp", meshes, data)
    fsdp, fsdp_state, fsdp_losses = run("fsdp", meshes, data)
    np.testing.assert_allclose(fsdp_losses, dp_losses, rtol=1e-4)
    assert dp_losses[-1] < dp_losses[0]
    stats = fsdp_state.collections["batch_stats"]["BatchNorm_1"]
    assert stats["mean"].shape == (64,) and not np.allclose(np.asarray(stats["mean"]), 0)  # updated in training
    np.testing.assert_allclose(
        np.asarray(stats["var"]), np.asarray(dp_state.collections["batch_stats"]["BatchNorm_1"]["var"]), rtol=1e-4
    )
    assert fsdp.state_shardings.params["Conv_1"]["kernel"].spec == P(None, None, "fsdp", None)
    # Eval uses the running statistics (train=False): it needs the collections and does not change them.
    batch = data.batches("eval", 32, fsdp.batch_shardings).batch_at(0)
    ev = fsdp.evaluate_state(fsdp_state, batch)
    assert np.isfinite(float(ev["loss"])) and 0 <= float(ev["accuracy"]) <= 1


def test_batch_stats_are_checkpointed_and_restored(meshes, tmp_path):
    data = bars()
    fsdp, state, _ = run("fsdp", meshes, data, steps=3)
    pt.save_checkpoint(tmp_path / "ck", 3, state, rules=fsdp.rules, abstract=fsdp.abstract_state)
    dp = pt.Trainer(
        ConvNet(), optax.adam(1e-2), pt.make_mesh(meshes["dp"]), "dp", batch=data.example(32), task="classification"
    )
    restored = pt.restore_checkpoint(
        tmp_path / "ck", pt.abstract_target(dp.abstract_state, shardings=dp.state_shardings)
    )
    for path in ("BatchNorm_0", "BatchNorm_1"):
        for k in ("mean", "var"):
            assert np.array_equal(
                np.asarray(restored.collections["batch_stats"][path][k]),
                np.asarray(state.collections["batch_stats"][path][k]),
            )
    assert int(restored.step) == 3


def test_pmap_era_batchnorm_axis_name_runs_unchanged_with_the_same_statistics(meshes):
    # BatchNorm(axis_name='batch') reduces across pmap replicas; under GSPMD the batch-dim mean already
    # spans the global batch, so the name is bound with size 1 and the numbers do not change.
    data = bars()
    _, plain, plain_losses = run("fsdp", meshes, data, steps=3)
    trainer, pmapped, losses = run("fsdp", meshes, data, steps=3, model=ConvNet(axis_name="batch"))
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(pmapped.collections["batch_stats"]["BatchNorm_0"]["mean"]),
        np.asarray(plain.collections["batch_stats"]["BatchNorm_0"]["mean"]),
        rtol=1e-5,
    )
    assert trainer.model.axis_names == ["batch"]
