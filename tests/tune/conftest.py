"""Shared by the tune tests: a small GPT's abstract train state and its workload, and a search over it."""

import optax
import pytest

import partitioning as pt
from partitioning.plan import build_plan
from partitioning.rules import Rules
from partitioning.train.state import abstract_train_state
from partitioning.tune.hardware import hardware
from partitioning.tune.search import search
from partitioning.tune.workload import workload

B, T = 8, 16
GPT = dict(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)
PRESETS = ("dp", "fsdp", "tp", "fsdp_tp", "seq")


@pytest.fixture(scope="session")
def gpt_state():
    """(model, boxed abstract params, boxed abstract optimizer state) of a 2-layer GPT; batch 8 x 16."""
    model = pt.model.build_model("gpt", **GPT)
    params, opt = abstract_train_state(model, optax.adamw(1e-3), batch_size=B, seq_len=T)
    return model, params, opt


@pytest.fixture(scope="session")
def gpt_workload(gpt_state):
    """The GPT's Workload (batch 8 x 16, float32)."""
    _, params, opt = gpt_state
    return workload(build_plan(params, opt, {"data": 1}, Rules([])).params, batch_size=B, seq_len=T)


@pytest.fixture(scope="session")
def run_search(gpt_state, gpt_workload):
    """run_search(budget=2**30, hw="h100", tables=PRESETS, **kw): a search of the GPT's layouts of 8 devices."""

    def _run(budget=2**30, hw="h100", tables=PRESETS, devices=8, w=None, **kw):
        _, params, opt = gpt_state
        kw.setdefault("remats", ("none", "full"))
        return search(
            params,
            opt,
            {n: Rules.preset(n) for n in tables},
            devices,
            w or gpt_workload,
            hardware(hw) if isinstance(hw, str) else hw,
            budget,
            **kw,
        )

    return _run
