"""Shared by the bring-your-own-model tests: the corpus, a step runner, a state copier (meshes: tests/conftest.py)."""

import jax
import numpy as np
import pytest

import partitioning as pt


@pytest.fixture(scope="session")
def corpus():
    return pt.data.load_corpus()


@pytest.fixture
def train_losses(corpus):
    """train_losses(trainer, state, steps, batches=None) -> (state, losses): the corpus's first batches."""

    def run(trainer, state, steps, batches=None):
        batches = batches or corpus.batches("train", trainer.batch_size, trainer.seq_len, trainer.batch_sharding)
        losses = []
        for i in range(steps):
            state, m = trainer.train_step(state, batches.batch_at(i))
            losses.append(float(m["loss"]))
        return state, losses

    return run


@pytest.fixture
def copy_state():
    """copy_state(tree, shardings): the same values as new arrays in ``shardings`` (never aliasing donated ones)."""
    return lambda tree, shardings: jax.tree.map(lambda a, s: jax.device_put(np.asarray(a), s), tree, shardings)
