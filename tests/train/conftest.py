"""Shared by the train tests: the corpus slice, tiny models, two Trainers compiled once per worker, helpers."""

import jax
import pytest

import partitioning as pt
from partitioning.data.corpus import TokenBatches, load_corpus
from partitioning.models import GPT, MLP
from partitioning.train import Trainer
from partitioning.train.optimizer import make_optimizer
from partitioning.train.state import host_scalar

FSDP = {"data": 1, "fsdp": 8}


@pytest.fixture(scope="session")
def batch_size() -> int:
    """The batch size of the tests' Trainers (unless a test needs another)."""
    return 8


@pytest.fixture(scope="session")
def seq_len() -> int:
    """The sequence length of the tests' Trainers."""
    return 32


@pytest.fixture(scope="session")
def tokens():
    return load_corpus().train[:200_000]


def _tiny_gpt(**kw):
    return GPT(**{"embed": 32, "heads": 4, "mlp": 64, "layers": 2, **kw})


@pytest.fixture(scope="session")
def tiny_gpt():
    """tiny_gpt(**overrides): the quickstart GPT, tiny (embed 32, heads 4, mlp 64, layers 2)."""
    return _tiny_gpt


@pytest.fixture(scope="session")
def gpt_fsdp(seq_len):
    """The quickstart architecture, tiny, under FSDP; shared so each step compiles once per worker."""
    tx = make_optimizer("adamw", lr=1e-2, total_steps=20, warmup_steps=2, weight_decay=0.1, clip_norm=1.0)
    return Trainer(_tiny_gpt(), tx, pt.make_mesh(FSDP), "fsdp", batch_size=16, seq_len=seq_len)


@pytest.fixture(scope="session")
def mlp_fsdp(batch_size, seq_len):
    tx = make_optimizer("adamw", lr=1e-2, total_steps=10)
    return Trainer(MLP(embed=64, mlp=128), tx, pt.make_mesh(FSDP), "fsdp", batch_size=batch_size, seq_len=seq_len)


def _batches(trainer, tokens, seed=0):
    return TokenBatches(tokens, trainer.batch_size, trainer.seq_len, trainer.batch_sharding, seed=seed)


@pytest.fixture(scope="session")
def batches():
    """batches(trainer, tokens, seed=0): TokenBatches shaped and sharded for the trainer."""
    return _batches


@pytest.fixture(scope="session")
def norm_spec():
    """norm_spec(spec, ndim): a PartitionSpec as a tuple of length ndim (trailing Nones made explicit,
    1-tuples unwrapped)."""

    def _norm_spec(spec, ndim):
        out = list(spec) + [None] * (ndim - len(spec))
        return tuple(a[0] if isinstance(a, tuple) and len(a) == 1 else a for a in out)

    return _norm_spec


@pytest.fixture(scope="session")
def run_steps():
    """run_steps(trainer, tokens, n, seed=0) -> (state, host losses): init, then n train steps."""

    def _run_steps(trainer, tokens, n, seed=0):
        state = trainer.init(jax.random.key(seed))
        data = _batches(trainer, tokens)
        losses = []
        for k in range(n):
            state, m = trainer.train_step(state, data.batch_at(k))
            losses.append(host_scalar(m["loss"]))
        return state, losses

    return _run_steps
