"""Train steps timed side by side (partitioning/train/timing.py): what comes back, never which choice is faster."""

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.models import GPT
from partitioning.train.timing import time_steps


@pytest.fixture(scope="module")
def mesh():
    return pt.make_mesh({"data": 1, "fsdp": -1})


def _trainer(mesh, **options):
    model = GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2, **options)
    return pt.Trainer(model, optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16)


@pytest.fixture(scope="module")
def batch(mesh):
    return pt.data.TokenBatches(np.arange(4096) % 64, 8, 16, _trainer(mesh).batch_sharding).batch_at(0)


def test_every_choice_is_timed_on_one_state_within_the_bounds(mesh, batch):
    trainers = {p: _trainer(mesh, remat=p) for p in ("none", "full")}
    t = time_steps(trainers, batch, budget=0.0, min_steps=2, max_steps=4)
    assert sorted(t.seconds) == ["full", "none"] and t.skipped == {} and t.clock == "cpu"
    assert all(s > 0 for s in t.seconds.values())
    # A spent budget stops after min_steps; a choice is never timed past max_steps.
    assert set(t.steps.values()) == {2}
    assert t.fastest == min(t.seconds, key=t.seconds.get)
    assert sorted(t.peak) == ["full", "none"] and t.peak["none"] > t.peak["full"]  # none keeps every activation
    assert t.spent_s >= t.compile_s > 0
    json = t.to_json()
    assert sorted(json) == ["clock", "compile_s", "peak", "seconds", "skipped", "spent_s", "steps"]


def test_a_choice_whose_compiled_peak_exceeds_the_memory_is_not_run(mesh, batch):
    trainers = {p: _trainer(mesh, remat=p) for p in ("none", "full")}
    t = time_steps(trainers, batch, budget=0.0, min_steps=1, memory=1)
    assert t.seconds == {} and t.fastest is None
    assert sorted(t.skipped) == ["full", "none"]
    assert t.skipped["none"] == f"compiled peak {t.peak['none']:,} bytes > the budget of 1"


def test_choices_whose_states_differ_each_get_their_own(mesh, batch):
    # scan_layers stacks the layers' params: another state structure, so one state cannot serve both.
    trainers = {"scan": _trainer(mesh), "loop": _trainer(mesh, scan_layers=False)}
    t = time_steps(trainers, batch, budget=0.0, min_steps=1, max_steps=1)
    assert sorted(t.seconds) == ["loop", "scan"] and t.steps == {"loop": 1, "scan": 1}


def test_a_wall_clock_on_request(mesh, batch):
    t = time_steps({"none": _trainer(mesh)}, batch, budget=0.0, min_steps=1, clock="wall")
    assert t.clock == "wall" and t.steps == {"none": 1}


def test_the_winners_step_is_compiled_for_the_run(mesh, batch, caplog):
    trainers = {p: _trainer(mesh, remat=p) for p in ("none", "full")}
    time_steps(trainers, batch, budget=0.0, min_steps=1, max_steps=1)
    state = trainers["full"].init(jax.random.key(0))
    with jax.log_compiles(True), caplog.at_level("DEBUG"):
        state, metrics = trainers["full"].train_step(state, batch)  # the run's first step: compiled already
        np.asarray(metrics["loss"])
    assert not [r for r in caplog.records if "_step_fn" in r.getMessage() and "ompil" in r.getMessage()]
