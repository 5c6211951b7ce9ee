"""Divergence (partitioning.train.nonfinite): a NaN batch at a known step, under both policies.

The model is one weight vector and the loss a squared error, so a batch holding a
NaN makes exactly that step's loss and gradient NaN; everything else stays finite.
"""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.train import Trainer
from partitioning.train.loop import fit
from partitioning.train.nonfinite import NonFiniteError, Tally
from partitioning.train.state import host_scalar

BAD_STEP = 3  # 1-based: the batch of step index 2 holds a NaN


class Scale(nn.Module):
    @nn.compact
    def __call__(self, x):
        w = self.param("w", pt.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
        return x * w


def loss(out, batch):
    return ((out - batch["targets"]) ** 2).mean()


def batch_at(trainer, step):
    x = np.full((8, 8), 0.5, np.float32)
    if step + 1 == BAD_STEP:
        x[0, 0] = np.nan
    return trainer.place({"inputs": x, "targets": np.zeros((8, 8), np.float32)})


def make(policy):
    shape = {"inputs": np.zeros((8, 8), np.float32), "targets": np.zeros((8, 8), np.float32)}
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})
    return Trainer(Scale(), optax.sgd(0.1), mesh, "fsdp", batch=shape, task=loss, on_nonfinite=policy)


class Saver:
    """A hook that saves (wants_state) every 2 steps; records what it was handed."""

    def __init__(self):
        self.saved, self.logged, self.exit = [], [], None

    def wants_state(self, step):
        return step % 2 == 0

    def on_step_end(self, step, state, metrics):
        if self.wants_state(step):
            self.saved.append((step, np.asarray(state.params["w"]).copy()))

    def on_exit(self, state, reason):
        self.exit = reason


class Logger:
    def __init__(self):
        self.logged, self.exit = {}, None

    def on_step_end(self, step, state, metrics):
        if metrics is not None:
            self.logged[step] = metrics

    def on_exit(self, state, reason):
        self.exit = reason


@pytest.fixture(scope="module")
def stop_trainer():
    return make("stop")


@pytest.fixture(scope="module")
def skip_trainer():
    return make("skip_step")


def test_stop_names_the_first_bad_step_and_never_hands_a_nan_state_to_a_saver(stop_trainer):
    t = stop_trainer
    saver, logger = Saver(), Logger()
    with pytest.raises(NonFiniteError) as e:
        fit(
            t,
            t.init(jax.random.key(0)),
            lambda s: batch_at(t, s),
            steps=10,
            log_every=5,
            hooks=[saver, logger],
            progress=False,
        )
    assert e.value.step == BAD_STEP
    # Found at step 4 (a saving step: a sync point), not at the logging step 5.
    assert str(e.value).startswith(
        "step 3 (loss nan, grad_norm nan at step 4): the loss or gradient norm is not finite"
    )
    assert [s for s, _ in saver.saved] == [2] and np.isfinite(saver.saved[0][1]).all()
    assert saver.exit == logger.exit == "nonfinite"
    assert sorted(logger.logged) == [1, 4] and np.isnan(logger.logged[4]["loss"])  # the loggers see the bad step


def test_skip_step_drops_the_update_and_counts_it(skip_trainer):
    t = skip_trainer
    logger = Logger()
    state = fit(
        t, t.init(jax.random.key(0)), lambda s: batch_at(t, s), steps=5, log_every=5, hooks=[logger], progress=False
    )
    assert host_scalar(state.step) == 5 and logger.exit == "done"
    assert logger.logged[5]["skipped_steps"] == 1 and "nonfinite" not in logger.logged[5]
    # d/dw_j of mean over 8x8 of (0.5 w_j)^2 is w_j / 16: four finite sgd steps scale w by (1 - 0.1 / 16)^4;
    # the NaN step changed nothing.
    np.testing.assert_allclose(np.asarray(state.params["w"]), np.full(8, (1 - 0.1 / 16) ** 4), rtol=1e-6)


def test_tally_counts_on_device_and_reads_the_first_bad_step():
    tally = Tally(start=10)
    assert tally.read() == (0, None)
    for flag in (0.0, 0.0, 1.0, 0.0, 1.0):
        tally.add(jax.numpy.float32(flag))
    assert tally.read() == (2, 13)


def test_a_stop_signal_after_a_bad_step_saves_nothing(stop_trainer):
    """Ctrl-C between logging steps is a sync point too: the NaN state is not saved on the way out."""
    import os
    import signal

    t = stop_trainer

    class CtrlC:
        def on_step_end(self, step, state, metrics):
            if step == BAD_STEP:
                os.kill(os.getpid(), signal.SIGINT)

    class ExitSaver(Saver):
        def on_exit(self, state, reason):
            super().on_exit(state, reason)
            if reason != "nonfinite":  # as the checkpoint hook: it would save here
                self.saved.append(("exit", None))

    saver = ExitSaver()
    with pytest.raises(NonFiniteError) as e:
        fit(
            t,
            t.init(jax.random.key(0)),
            lambda s: batch_at(t, s),
            steps=10,
            log_every=10,
            hooks=[CtrlC(), saver],
            progress=False,
        )
    assert e.value.step == BAD_STEP and saver.exit == "nonfinite"
    assert [s for s, _ in saver.saved] == [2]
