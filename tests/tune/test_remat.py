"""``choose_remat``: every remat policy priced for one layout; the fastest that fits, else the smallest peak."""

import dataclasses

import pytest

from partitioning.rules import Rules
from partitioning.tune.hardware import Hardware, hardware
from partitioning.tune.remat import choose_remat

POLICIES = ("none", "dots", "dots_no_batch", "full")
MESH = {"data": 1, "fsdp": 8}
# The measured CPU profile's shape: no overlap, fresh memory costs time (values of the same order).
CPU = Hardware(
    name="cpu",
    peak_flops=7e10,
    memory=2**31,
    memory_bandwidth=6e9,
    topology="nodes",
    node_size=8,
    link_bandwidth=1e9,
    network_bandwidth=1e9,
    overlap=False,
    alloc_bandwidth=1.6e9,
    measured=True,
)


@pytest.fixture(scope="module")
def choose(gpt_state, gpt_workload):
    _, params, opt = gpt_state

    def _choose(hw, budget=2**34, **kw):
        return choose_remat(params, opt, MESH, Rules.preset("fsdp"), gpt_workload, hw, budget, policies=POLICIES, **kw)

    return _choose


def test_on_an_accelerator_with_room_nothing_is_recomputed(choose):
    c = choose(hardware("h100"))
    assert c.policy == "none" and c.why == "fastest"
    assert [r.candidate.remat for r in c.results] == list(POLICIES)
    by = {r.candidate.remat: r for r in c.results}
    # Recomputation costs FLOPs and saves memory, in the order of the policies.
    assert by["none"].analytic.flops["bwd"] == by["dots"].analytic.flops["bwd"]
    bwd = {p: r.analytic.flops["bwd"] for p, r in by.items()}
    assert bwd["dots"] < bwd["dots_no_batch"] < bwd["full"]
    assert by["none"].peak > by["dots"].peak > by["dots_no_batch"].peak > by["full"].peak


def test_a_tighter_budget_picks_the_least_recomputation_that_fits(choose):
    peaks = {r.candidate.remat: r.peak for r in choose(hardware("h100")).results}
    c = choose(hardware("h100"), budget=(peaks["dots_no_batch"] + peaks["dots"]) / 2)
    assert c.policy == "dots_no_batch"
    assert {r.candidate.remat for r in c.results if not r.fits} == {"none", "dots"}
    c = choose(hardware("h100"), budget=peaks["full"] / 2)
    assert c.policy == "full" and c.why == "smallest peak (none fits)"


def test_where_fresh_memory_costs_time_saving_activations_can_cost_more_than_recomputing(choose):
    assert choose(CPU).policy != "none"
    # The dearer a byte of fresh memory, the more is recomputed.
    assert choose(dataclasses.replace(CPU, alloc_bandwidth=1e6)).policy == "full"
    assert choose(dataclasses.replace(CPU, alloc_bandwidth=None)).policy == "none"


def test_describe_is_one_line_naming_every_policy(choose):
    c = choose(hardware("h100"))
    line = c.describe()
    assert "\n" not in line and line.startswith("none: the fastest of 4 policies, est. ")
    assert all(p in line for p in POLICIES) and "on h100" in line and "of 16.00 GiB" in line


def test_a_cpu_estimate_says_it_is_cpu_time_per_simulated_device_and_the_wall_time_it_means(choose, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    c = choose(CPU)
    chosen = next(r for r in c.results if r.candidate.remat == c.policy)
    line = c.describe()
    # 8 simulated devices on 2 cores: each core runs 4 devices' work one after another.
    wall = chosen.step_time * c.devices / 2
    assert c.devices == 8 and " of CPU time per simulated device per step (~" in line
    text = f"{wall * 1e3:.3g} ms" if wall < 1 else f"{wall:.3g} s"
    assert f"(~{text} wall: 8 devices on 2 cores)" in line
