"""The training loop (partitioning.train.loop): resumable data order, logging steps, hooks."""

import jax
import jax.numpy as jnp
import numpy as np

from partitioning.data.corpus import TokenBatches, load_corpus
from partitioning.train.loop import fit
from partitioning.train.state import host_scalar


def test_fit_resumes_with_the_same_data_order(tokens, mlp_fsdp, batches):
    """Two fits of 2 + 3 steps equal one fit of 5: batch_at(step) makes the loop resumable."""

    class Record:
        def __init__(self):
            self.seen, self.exit = {}, None

        def on_step_end(self, step, state, metrics):
            self.seen[step] = None if metrics is None else metrics["loss"]

        def on_exit(self, state, reason):
            self.exit = reason

    t1 = t2 = mlp_fsdp  # a Trainer holds no run state: two runs can share it
    full = Record()
    fit(t1, t1.init(jax.random.key(0)), batches(t1, tokens), steps=5, log_every=1, hooks=[full], progress=False)
    first, second = Record(), Record()
    state = fit(
        t2, t2.init(jax.random.key(0)), batches(t2, tokens), steps=2, log_every=1, hooks=[first], progress=False
    )
    state = fit(t2, state, batches(t2, tokens), steps=5, log_every=1, hooks=[second], progress=False)
    assert host_scalar(state.step) == 5
    assert list(second.seen) == [3, 4, 5]
    np.testing.assert_allclose(
        [first.seen[1], first.seen[2], *second.seen.values()], list(full.seen.values()), rtol=1e-5
    )
    assert full.exit == "done"


def test_fit_pulls_metrics_only_on_logging_steps_and_on_start_can_replace_state(
    tokens, mlp_fsdp, batches, batch_size, seq_len
):
    trainer = mlp_fsdp
    evals = TokenBatches(load_corpus().eval, batch_size, seq_len, trainer.batch_sharding)

    class Hook:
        def __init__(self):
            self.logged = {}

        def on_start(self, state):
            return state.replace(step=jnp.asarray(3, jnp.int32))  # as a restored checkpoint would

        def on_step_end(self, step, state, metrics):
            self.logged[step] = metrics

    h = Hook()
    fit(
        trainer,
        trainer.init(jax.random.key(0)),
        batches(trainer, tokens),
        steps=10,
        log_every=4,
        eval_batches=lambda: [evals.batch_at(0)],
        eval_every=8,
        hooks=[h],
        progress=False,
    )
    assert list(h.logged) == [4, 5, 6, 7, 8, 9, 10]
    assert [s for s, m in h.logged.items() if m is not None] == [4, 8, 10]  # first, every 4th, last
    assert {"loss", "grad_norm", "lr", "step", "tokens_per_s", "step_time_s"} <= set(h.logged[8])
    assert "eval_loss" in h.logged[8] and "eval_loss" in h.logged[10] and "eval_loss" in h.logged[4]
    assert h.logged[8]["step"] == 8 and h.logged[8]["tokens_per_s"] > 0
