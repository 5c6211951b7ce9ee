"""Optimizers (partitioning.train.optimizer): adafactor and sgd train and shard, the lr schedule."""

import jax
import numpy as np
import pytest

import partitioning as pt
from partitioning.models import MLP
from partitioning.train import Trainer
from partitioning.train.optimizer import make_optimizer
from partitioning.train.state import host_scalar


@pytest.mark.parametrize("name", ["adafactor", "sgd"])
def test_other_optimizers_train_and_shard(name, tokens, run_steps, batch_size, seq_len):
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    tx = make_optimizer(name, lr=0.05 if name == "sgd" else 1e-2, total_steps=6, weight_decay=0.01, clip_norm=1.0)
    trainer = Trainer(MLP(embed=64, mlp=128), tx, mesh, "fsdp", batch_size=batch_size, seq_len=seq_len)
    state, losses = run_steps(trainer, tokens, 6)
    assert losses[-1] < losses[0], losses
    layouts = trainer.state_layouts()
    sharded = [l.path for l in layouts if l.path.startswith("opt_state") and not l.replicated]
    if name == "adafactor":
        # Factored second moments have other shapes than their params: replicated (and small).
        v_row = [l for l in layouts if "v_row" in l.path and "wi_0" in l.path]
        assert v_row and all(l.replicated for l in v_row)
        assert any("/v/" in p for p in sharded) or sharded == []
    else:
        assert any("trace/wi_0" in p for p in sharded), sharded  # momentum shards like the param


def test_metrics_report_lr_from_the_schedule(tokens, gpt_fsdp, batches):
    state = gpt_fsdp.init(jax.random.key(0))
    lrs = []
    for k in range(4):
        state, m = gpt_fsdp.train_step(state, batches(gpt_fsdp, tokens).batch_at(k))
        lrs.append(host_scalar(m["lr"]))
    # warmup over 2 steps starting at lr / 2, then cosine from 1e-2 towards 1e-3 over 18 steps
    np.testing.assert_allclose(lrs, [5e-3, 1e-2, 1e-2, 1e-3 + 9e-3 * (1 + np.cos(np.pi / 18)) / 2], rtol=1e-5)
    assert set(m) == {"loss", "grad_norm", "lr", "accuracy"}
