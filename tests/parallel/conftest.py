"""Shared by the pipeline and expert tests: trainers of one small GPT on many layouts, each run once per worker."""

import jax
import pytest

import partitioning as pt
from partitioning.data.corpus import TokenBatches, load_corpus
from partitioning.models import GPT
from partitioning.train.state import host_scalar

TP = [("heads", "tensor"), ("kv_heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor")]
BATCH, SEQ, STEPS = 16, 32, 3


def small_gpt(**kw):
    return GPT(**{"vocab_size": 256, "embed": 32, "heads": 4, "mlp": 64, "layers": 4, **kw})


class Runs:
    """trainer(model, mesh, rules, **kw) and run(...) -> (trainer, state, losses), cached by their arguments."""

    def __init__(self):
        self.tokens = load_corpus().train[:200_000]
        self.cache = {}

    def trainer(self, model, mesh, rules, **kw):
        tx = pt.make_optimizer("adamw", lr=1e-2, total_steps=20, warmup_steps=2)
        return pt.Trainer(model, tx, pt.make_mesh(mesh), rules, batch_size=BATCH, seq_len=SEQ, **kw)

    def batches(self, trainer):
        return TokenBatches(self.tokens, BATCH, SEQ, trainer.batch_sharding, seed=0)

    def run(self, key, model, mesh, rules, steps=STEPS, **kw):
        if key not in self.cache:
            tr = self.trainer(model, mesh, rules, **kw)
            state, data, losses, metrics = tr.init(jax.random.key(0)), self.batches(tr), [], []
            for k in range(steps):
                state, m = tr.train_step(state, data.batch_at(k))
                losses.append(host_scalar(m["loss"]))
                metrics.append({n: host_scalar(v) for n, v in m.items()})
            self.cache[key] = (tr, state, losses, metrics)
        return self.cache[key]


@pytest.fixture(scope="session")
def runs():
    return Runs()


@pytest.fixture(scope="session")
def tp_rules():
    """Tensor-parallel rules to add to a pipeline preset."""
    return TP
