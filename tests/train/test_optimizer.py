"""Optimizers (partitioning.train.optimizer): adafactor and sgd train and shard, the lr schedule."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.models import MLP
from partitioning.train import Trainer
from partitioning.train.optimizer import make_optimizer
from partitioning.train.state import host_scalar


@pytest.mark.parametrize("name", ["adafactor", "sgd"])
def test_other_optimizers_train_and_shard(name, tokens, run_steps, batch_size, seq_len):
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    tx = make_optimizer(name, lr=0.05 if name == "sgd" else 1e-2, total_steps=6, weight_decay=0.01, clip_norm=1.0)
    # embed 128, mlp 64: adafactor factors the embeddings (both dims >= 128), not the block matrices.
    trainer = Trainer(MLP(embed=128, mlp=64), tx, mesh, "fsdp", batch_size=batch_size, seq_len=seq_len)
    state, losses = run_steps(trainer, tokens, 6)
    assert losses[-1] < losses[0], losses
    layouts = trainer.state_layouts()
    sharded = [leaf.path for leaf in layouts if leaf.path.startswith("opt_state") and not leaf.replicated]
    if name == "adafactor":
        # Factored second moments keep their param's names less the dimension adafactor drops: the embedding's
        # v_row (its 256 vocab rows summed) is ("embed",), laid out as the embedding's embed dimension.
        specs = {leaf.path: (leaf.shape, leaf.spec) for leaf in layouts}
        names = {leaf.path: leaf.names for leaf in layouts}
        assert specs["opt_state/1/inner_state/0/v_row/embedding"] == ((128,), P("fsdp"))
        assert names["opt_state/1/inner_state/0/v_row/embedding"] == ("embed",)
        assert names["opt_state/1/inner_state/0/v_col/embedding"] == ("vocab",)
        assert specs["opt_state/1/inner_state/0/v_col/embedding"][0] == (256,)
        # Unfactored second moments (the 128 x 64 wi_0) are laid out like their param.
        assert specs["opt_state/1/inner_state/0/v/wi_0"] == ((128, 64), P("fsdp", None))
        assert "opt_state/1/inner_state/0/v/wi_0" in sharded
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
    assert set(m) == {"loss", "grad_norm", "lr", "accuracy", "nonfinite"}  # nonfinite: see train.nonfinite
