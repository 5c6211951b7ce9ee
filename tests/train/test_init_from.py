"""Trainer.init_from: a train state starting from given params (pretrained weights), in the trainer's layout."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.models import GPT


def test_init_from_places_casts_and_initialises_the_optimizer_from_the_params():
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    model = GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2)
    trainer = pt.Trainer(model, optax.adam(1e-3), mesh, "fsdp", batch_size=8, seq_len=8)
    params = pt.unbox(jax.jit(model.init)(jax.random.key(3), jnp.zeros((1, 8), jnp.int32))["params"])
    # Host arrays in bfloat16 (a checkpoint's dtype): moved into the trainer's shards, cast to its float32.
    host = jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16)), params)
    state = trainer.init_from(host)
    assert int(state.step) == 0
    for got, want, sharding in zip(
        jax.tree.leaves(state.params),
        jax.tree.leaves(host),
        jax.tree.leaves(trainer.state_shardings.params),
        strict=True,
    ):
        assert got.dtype == jnp.float32 and got.sharding == sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want, np.float32))
    mu = state.opt_state[0].mu
    assert all(not np.asarray(m).any() for m in jax.tree.leaves(mu))
    # Arrays already in place are used as they are; a train step runs from the state.
    again = trainer.init_from(state.params)
    assert jax.tree.leaves(again.params)[0] is jax.tree.leaves(state.params)[0]
    with pytest.raises(ValueError, match="init_from: params do not have the model's structure"):
        trainer.init_from({"embedding": host["embedding"]})
