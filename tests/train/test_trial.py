"""Defaults decided by trial (partitioning/train/trial.py): the estimate, the cache and the measurement, in one line."""

import json

import jax
import numpy as np
import optax
import pytest

import partitioning as pt
from partitioning.models import GPT
from partitioning.train.timing import Timings
from partitioning.train.trial import Choices, Verdict, decide, read_verdict, verdict_key, write_verdict


@pytest.fixture(scope="module")
def mesh():
    return pt.make_mesh({"data": 1, "fsdp": -1})


def _choices(**estimates):
    pick = min(estimates, key=lambda k: estimates[k])
    return Choices("remat", "policies", estimates, pick, f"est. {estimates[pick] * 1e3:g} ms")


def test_only_the_choices_priced_within_the_margin_are_worth_timing():
    c = _choices(full=0.10, dots=0.09, none=0.2)
    assert c.candidates() == ["full", "dots"]  # none: over 1.5x the best
    c.margin = 1.05
    assert c.candidates() == ["dots"]
    assert Choices("attention", "kernels", {"xla": None, "cudnn": None}, "cudnn", "").candidates() == ["xla", "cudnn"]


def test_without_the_run_the_estimate_decides_and_says_why(mesh, tmp_path):
    v = decide(_choices(full=0.10, dots=0.09), what={"m": 1}, mesh=mesh, measurable="no devices", directory=tmp_path)
    assert (v.how, v.choice) == ("estimated", "dots")
    assert v.note() == "remat: auto -> dots: est. 90 ms; estimated, not measured: no devices"
    alone = decide(_choices(full=0.10), what={}, mesh=mesh, measurable=None, directory=tmp_path)
    assert alone.note() == "remat: auto -> full: est. 100 ms; estimated, not measured: the only choice that fits"
    far = decide(_choices(full=0.10, none=0.3), what={}, mesh=mesh, measurable=None, directory=tmp_path)
    assert far.why_not == "the others are priced over 1.5x slower"


def test_a_cached_verdict_decides_at_once_for_the_same_run_and_devices(mesh, tmp_path):
    choices = _choices(full=0.10, dots=0.09)
    key = verdict_key({"m": 1}, mesh, ["full", "dots"])
    data = {"choice": "full", "seconds": {"full": 0.05, "dots": 0.06}, "clock": "cpu"}
    path = write_verdict("remat", key, data, tmp_path)
    assert read_verdict("remat", key, tmp_path)["choice"] == "full"

    def build(choice):
        raise AssertionError("a cached verdict builds nothing")

    v = decide(choices, what={"m": 1}, mesh=mesh, measurable=None, build=build, batch=lambda: 0, directory=tmp_path)
    assert (v.how, v.choice, v.path) == ("cached", "full", path)
    assert v.note() == (
        "remat: auto -> full: measured, the fastest of 2 policies: 50 ms per step (dots 60 ms (+20.0%); CPU time "
        f"per simulated device); the estimate had picked dots; from the cache {path}"
    )
    # Another run (or the cache turned off) is not this verdict.
    other = decide(choices, what={"m": 2}, mesh=mesh, measurable="off", directory=tmp_path)
    assert other.how == "estimated"
    off = decide(choices, what={"m": 1}, mesh=mesh, measurable="off", directory=tmp_path, cache=False)
    assert (off.how, off.choice) == ("estimated", "dots")
    # A file that is not a verdict for this key is no verdict.
    path.write_text(json.dumps({"key": "another", "choice": "full", "seconds": {"full": 1}}))
    assert read_verdict("remat", key, tmp_path) is None


def test_the_devices_and_jax_are_in_the_key(mesh):
    key = verdict_key({"m": 1}, mesh, ["b", "a"])
    assert key["choices"] == ["a", "b"] and key["run"] == {"m": 1}
    d = key["devices"]
    assert (d["platform"], d["devices"], d["processes"], d["jax"]) == ("cpu", 8, 1, jax.__version__)
    assert d["cpu"] and d["cores"] >= 1


def test_measured_once_then_read_back(mesh, tmp_path):
    built = []

    def build(policy):
        built.append(policy)
        model = GPT(vocab_size=64, embed=32, heads=2, mlp=64, layers=2, remat=policy)
        return pt.Trainer(model, optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16)

    def batch():
        return pt.data.TokenBatches(np.arange(4096) % 64, 8, 16, build("none").batch_sharding).batch_at(0)

    choices = _choices(full=0.10, dots=0.09)
    kw = dict(what={"m": 3}, mesh=mesh, measurable=None, build=build, batch=batch, directory=tmp_path, budget=0.0)
    v = decide(choices, **kw)
    assert v.how == "measured" and v.choice in ("full", "dots") and sorted(v.seconds) == ["dots", "full"]
    assert v.trainer is not None and v.trainer.model.module.remat == v.choice and v.timings.spent_s > 0
    line = v.note()
    assert line.startswith(f"remat: auto -> {v.choice}: measured, ") and " of 2 policies: " in line
    assert " steps each in " in line and "budget 3 s each)" in line and line.endswith(f"; cached in {v.path}")
    saved = json.loads(v.path.read_text())
    assert saved["choice"] == v.choice and saved["seconds"] == v.seconds and saved["clock"] == "cpu"
    built.clear()
    again = decide(choices, **kw)
    assert (again.how, again.choice, again.seconds, built) == ("cached", v.choice, v.seconds, [])


def test_the_note_of_a_measurement_word_for_word():
    t = Timings({"full": 0.1, "dots": 0.11}, {"full": 3, "dots": 4}, {}, {}, "wall", compile_s=2.0, spent_s=5.25)
    v = Verdict(_choices(full=0.2, dots=0.1), "full", "measured", t.seconds, t, "wall")
    assert v.note() == (
        "remat: auto -> full: measured, the fastest of 2 policies: 100 ms per step (dots 110 ms (+10.0%); wall time); "
        "the estimate had picked dots; 3-4 steps each in 5.2 s (compile 2.0 s, budget 3 s each)"
    )


def test_another_process_has_the_cached_choice_without_its_timings():
    # Processes other than 0 get the choice only (the dead-peer resume crashed there with a KeyError).
    v = Verdict(_choices(full=0.2, none=0.1), "none", "cached")
    assert v.note() == "remat: auto -> none: cached, as process 0 decided"


def test_a_lead_within_the_noise_keeps_the_estimates_pick(mesh, tmp_path, monkeypatch):
    measured = {}

    def timed(trainers, batch, **kw):  # injected timings: the verdict, not the clock, is under test
        return Timings(dict(measured), {c: 3 for c in measured}, {}, {}, "cpu", compile_s=1.0, spent_s=2.0)

    monkeypatch.setattr("partitioning.train.trial.time_steps", timed)
    kw = dict(mesh=mesh, measurable=None, build=lambda c: c, batch=lambda: 0, directory=tmp_path)
    measured.update(full=0.100, dots=0.101)  # the estimate picked dots; full leads by 1%
    v = decide(_choices(full=0.10, dots=0.09), what={"m": 4}, **kw)
    assert (v.how, v.choice, v.trainer) == ("measured", "dots", "dots")
    assert v.note().startswith(
        "remat: auto -> dots: measured, within 1.0% of the fastest of 2 policies: 101 ms per step "
        "(full 100 ms (-1.0%); CPU time per simulated device); the estimate's pick, kept: a lead under 2% is noise; "
        "3 steps each in 2.0 s"
    )
    measured.update(full=0.100, dots=0.103)  # a 3% lead is the measurement's
    v = decide(_choices(full=0.10, dots=0.09), what={"m": 5}, **kw)
    assert (v.choice, json.loads(v.path.read_text())["choice"]) == ("full", "full")
    assert "; the estimate had picked dots; " in v.note()
