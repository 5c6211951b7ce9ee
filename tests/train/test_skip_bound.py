"""`on_nonfinite: skip_step` is bounded: more than `max_skipped` consecutive skipped steps stop the run
(NonFiniteError with `.skipped`), where it used to skip every step to the end and report done."""

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.models import MLP
from partitioning.train.nonfinite import NonFiniteError


def test_consecutive_skipped_steps_past_the_bound_stop_the_run():
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    # A learning rate that makes every parameter infinite after the first update: every later step is non-finite.
    trainer = pt.Trainer(MLP(), optax.sgd(1e38), mesh, "fsdp", batch_size=8, seq_len=16, on_nonfinite="skip_step")
    batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    logger = pt.train.JsonlLogger(None)
    with pytest.raises(NonFiniteError) as e:
        pt.fit(
            trainer,
            trainer.init(jax.random.key(0)),
            batches,
            steps=40,
            log_every=2,
            hooks=[logger],
            progress=False,
            max_skipped=3,
        )
    assert e.value.skipped > 3 and "consecutive steps had a non-finite loss" in str(e.value)
    assert "(more than max_skipped_steps 3): the run diverges; stopped" in str(e.value)
    assert logger.records[-1]["step"] < 40  # stopped at a sync point soon after the bound, not at the end
