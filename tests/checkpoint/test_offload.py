"""Offloaded state (train.offload) in checkpoints: saved like any other, restored onto another layout with or
without offload, and training goes on with the same loss."""

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.checkpoint import CheckpointManager, abstract_target
from partitioning.models import GPT
from partitioning.train import Trainer

MODEL = GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)


def _trainer(mesh, rules, offload=()):
    return Trainer(MODEL, optax.adamw(1e-2), mesh, rules, batch_size=8, seq_len=8, offload=offload)


def _batch(tr, i):
    return pt.data.TokenBatches(np.arange(8192) % 64, 8, 8, tr.batch_sharding).batch_at(i)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, mesh_of):
    """A state trained one step with optimizer state and params in host memory, saved at step 1; the loss of
    its next step."""
    tr = _trainer(mesh_of({"data": 1, "fsdp": 8}), "fsdp", ("optimizer", "params"))
    state, _ = tr.train_step(tr.init(jax.random.key(0)), _batch(tr, 0))
    d = tmp_path_factory.mktemp("offloaded")
    with CheckpointManager(d) as mngr:
        mngr.save(1, state, force=True)
    values = [np.asarray(x) for x in jax.tree.leaves(state)]
    _, m = tr.train_step(state, _batch(tr, 1))
    return d, values, float(m["loss"])


@pytest.mark.parametrize("offload", [(), ("optimizer",), ("optimizer", "params")], ids=["none", "optimizer", "both"])
def test_restored_onto_another_layout_with_or_without_offload(saved, mesh_of, offload):
    d, values, next_loss = saved
    tr = _trainer(mesh_of({"data": 2, "fsdp": 2, "tensor": 2}), "fsdp_tp", offload)
    with CheckpointManager(d) as mngr:
        state = mngr.restore(abstract_target(tr.abstract_state, shardings=tr.state_shardings))
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(values, jax.tree.leaves(state), strict=True))
    for field, part in ((state.params, "params"), (state.opt_state, "optimizer")):
        want = "pinned_host" if part in offload else "device"
        assert {x.sharding.memory_kind for x in jax.tree.leaves(field)} == {want}
    assert state.params["blocks"]["mlp"]["wi_0"].sharding.spec == jax.P(
        None, "fsdp", "tensor"
    )  # (layers, embed, mlp) under fsdp_tp
    _, m = tr.train_step(state, _batch(tr, 1))
    assert float(m["loss"]) == pytest.approx(next_loss, rel=1e-6)
