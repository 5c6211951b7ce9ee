"""The training task (partitioning.model.task): the language-model loss."""

import jax.numpy as jnp
import numpy as np
import pytest

from partitioning.model import lm_loss


def test_lm_loss_of_uniform_logits_is_log_vocab():
    logits = jnp.zeros((2, 5, 256))
    batch = {"inputs": jnp.zeros((2, 5), jnp.int32), "targets": jnp.ones((2, 5), jnp.int32)}
    loss, aux = lm_loss(logits, batch)
    assert float(loss) == pytest.approx(np.log(256), rel=1e-6)
    assert set(aux) == {"accuracy"}
