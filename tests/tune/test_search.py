"""The search (partitioning.tune.search, .space): every candidate fits or is rejected with its reason; the
ranking; what a compiled view changes; what to say when nothing fits."""

import dataclasses
import itertools

import optax
import pytest

import partitioning as pt
from partitioning.parallel.pipeline import microbatching
from partitioning.parallel.trace import recording
from partitioning.plan import activation_names, build_plan
from partitioning.rules import Rules
from partitioning.train.state import abstract_train_state
from partitioning.tune.hardware import hardware
from partitioning.tune.search import search
from partitioning.tune.space import Candidate, candidates, factorizations, table_axes, zero1_rules
from partitioning.tune.workload import workload


def test_factorizations_and_table_axes():
    assert sorted(factorizations(4, 2)) == [(1, 4), (2, 2), (4, 1)]
    assert len(factorizations(2048, 3)) == 78
    assert table_axes(Rules.preset("fsdp_tp")) == ["data", "fsdp", "tensor"]
    assert table_axes(Rules.preset("dp")) == ["data"]


def test_candidates_cover_meshes_remats_micro_batches_and_zero1():
    rejected = []
    cands = candidates(
        8,
        {"dp": Rules.preset("dp"), "fsdp": Rules.preset("fsdp")},
        batch_size=8,
        remats=("none", "full"),
        rejected=rejected,
    )
    labels = {c.label for c in cands}
    assert "dp {data: 8} remat none" in labels and "dp +zero1 {data: 8} remat full x2 micro-batches" not in labels
    assert "fsdp {data: 2, fsdp: 4} remat full" in labels
    assert all(c.devices == 8 for c in cands)
    # dp over 8 devices with micro-batches of 4 sequences cannot split the batch 8 ways
    assert not any(c.rules_name == "dp" and c.grad_accum > 1 for c in cands)
    assert Candidate((("data", 8),), "dp", "none", 1, True) in cands  # ZeRO-1: data splits no parameter
    assert all(not c.zero1 for c in cands if c.rules_name == "fsdp" and c.sizes["data"] == 1)
    assert rejected == []  # every mesh splits 8 sequences at one micro-batch


def test_zero1_splits_the_optimizer_state_over_data():
    assert zero1_rules(Rules.preset("dp")).to_list()[-3:] == [["embed", "data"], ["mlp", "data"], ["vocab", "data"]]


def test_every_candidate_fits_or_says_why_not(run_search):
    s = run_search(budget=2**30)
    assert len(s.results) > 50 and s.duplicates > 0
    for r in s.results:
        if r.fits:
            assert r.estimate is not None and r.peak > 0 and r.step_time > 0
        else:
            assert r.reason.split(":")[0] in {"batch", "indivisible", "memory", "memory (compiled)", "rules"}, r.reason
    best = min(r.step_time for r in s.ranked)  # the first is within 0.1% of it: the simpler layout first
    times = [round(r.step_time / best, 3) for r in s.ranked]
    assert times == sorted(times)
    assert any(r.reason.startswith("indivisible: params/") for r in s.rejected)  # tensor 8 over 4 heads


def test_a_batch_that_does_not_split_is_rejected_with_the_shards(run_search, gpt_workload):
    s = run_search(w=dataclasses.replace(gpt_workload, batch=4), tables=("dp",))
    [r] = [
        r
        for r in s.results
        if r.candidate.sizes == {"data": 8}
        and r.candidate.grad_accum == 1
        and not r.candidate.zero1
        and r.candidate.remat == "none"
    ]
    assert r.reason == "batch: 4 sequences do not split over the 8 batch shards"


def test_memory_rejections_and_what_budget_would_fit(run_search):
    s = run_search(budget=64 * 1024)
    assert s.ranked == [] and {r.reason.split(":")[0] for r in s.results} <= {"memory", "indivisible", "batch"}
    smallest = min((r for r in s.results if r.peak), key=lambda r: r.peak)
    msg = s.nothing_fits()
    assert "fits 64.00 KiB per device" in msg and smallest.candidate.label in msg
    assert "(--device-memory " in msg and ") would fit it" in msg


def test_ties_go_to_the_simpler_layout(run_search):
    s = run_search(budget=2**30)
    best = s.ranked[0].step_time
    for a, b in itertools.pairwise(s.ranked):
        if round(a.step_time / best, 3) == round(b.step_time / best, 3):
            assert (a.candidate.grad_accum, a.candidate.zero1) <= (b.candidate.grad_accum, b.candidate.zero1)


def test_a_compiled_view_replaces_the_estimates(run_search):
    s = run_search(budget=2**30)
    first = s.ranked[0]
    s.add_compiled(
        first, {"status": "ok", "memory": {"peak_estimate": 2**31, "temp": 0}, "cost_ops": [], "collective_ops": []}
    )
    assert not first.fits and first.reason.startswith("memory (compiled): needs 2.00 GiB")
    assert first.peak_source == "compiled" and first.compiled is not None
    assert first not in s.ranked


@pytest.fixture(scope="module")
def moe_search():
    """A 4-layer scanned MoE GPT (8 experts, top 2) on 8 devices, priced over pp, pp_fsdp, ep and fsdp."""
    model = pt.model.build_model(
        "gpt",
        vocab_size=64,
        embed=32,
        heads=4,
        mlp=32,
        layers=4,
        moe={"experts": 8, "top_k": 2, "capacity_factor": 1.0},
    )
    params, opt = abstract_train_state(model, optax.adamw(1e-3), batch_size=16, seq_len=16)
    with microbatching(1), recording() as records:
        names = activation_names(model, params, {"data": 1}, Rules([]), batch_size=16, seq_len=16)
    experts = next(r for r in records if r["kind"] == "experts")
    w = workload(
        build_plan(params, opt, {"data": 1}, Rules([])).params, batch_size=16, seq_len=16, expert_layer=experts
    )
    tables = {n: Rules.preset(n) for n in ("pp", "pp_fsdp", "ep", "fsdp")}
    s = search(
        params,
        opt,
        tables,
        8,
        w,
        hardware("h100"),
        2**30,
        activations={n: names for n in tables},
        records=records,
        max_grad_accum=2,
    )
    return model, params, s, w


def test_stage_candidates_split_the_stacked_layers(moe_search):
    _, _, s, w = moe_search
    assert w.experts == 8 and w.expert_fraction == pytest.approx(4 / 16)  # capacity 16 x 2 / 8 = 4 of 16 tokens
    stages = {r.candidate.sizes.get("stage", 1) for r in s.results if r.candidate.rules_name == "pp"}
    assert stages == {1, 2, 4, 8}
    [eight] = [r for r in s.results if r.candidate.rules_name == "pp" and r.candidate.sizes["stage"] == 8]
    assert eight.reason == "stages: 4 stacked layers do not split into 8 stages"
    ms = {
        r.candidate.microbatches
        for r in s.results
        if r.candidate.rules_name == "pp" and r.candidate.stages == 4 and r.candidate.grad_accum == 1
    }
    assert ms == {4, 8}  # {stage: 4, data: 2}: M = 16 would leave micro-batches of 1 sequence for 2 data shards


@pytest.mark.parametrize(
    "rules,mesh,micro,repeats",
    [
        ("pp", {"stage": 4, "data": 2}, 8, 1),
        ("pp_fsdp", {"stage": 2, "data": 1, "fsdp": 4}, 4, 1),
        ("pp_fsdp", {"stage": 2, "data": 1, "fsdp": 4}, 4, 2),
        ("ep", {"data": 1, "fsdp": 2, "expert": 4}, 1, 1),
    ],
)
def test_pipeline_and_expert_bytes_equal_what_plan_traces(moe_search, rules, mesh, micro, repeats):
    """The tuner's collective-permute and all-to-all bytes are plan's (pt.plan.parallel_costs traces that layout)."""
    model, params, s, _ = moe_search
    [r] = [
        r
        for r in s.results
        if r.candidate.rules_name == rules
        and r.candidate.sizes == mesh
        and r.fits
        and r.candidate.microbatches == micro
        and r.candidate.repeats == repeats
        and r.candidate.grad_accum == 1
        and r.candidate.remat is None
        and not r.candidate.zero1
    ]
    costs = pt.plan.parallel_costs(
        model,
        params,
        mesh,
        rules,
        batch_size=16,
        seq_len=16,
        microbatches=micro if "stage" in mesh else None,
        repeats=repeats,
    )
    comm = {}
    for c in r.analytic.comm:
        comm[(c.label, c.kind)] = comm.get((c.label, c.kind), 0) + c.bytes
    if "stage" in mesh:
        shifts = sum(c.bytes for c in r.analytic.comm if c.what == "activations to the next stage")
        assert shifts == costs["pipeline"]["collective_permute_bytes"]
        bubble = (mesh["stage"] - 1) / (repeats * micro) * (r.analytic.compute["fwd"] + r.analytic.compute["bwd"])
        assert r.analytic.other["pipeline bubble"] == pytest.approx(bubble)
        # The circular schedule regroups the stage's stored layers once per pass: half of them move here
        # (2 stages x 2 repeats), the weights forward and their gradients back.
        leaves = build_plan(params, None, mesh, rules).params
        stacked = sum(leaf.per_device_bytes for leaf in leaves if "layers" in (leaf.names or ()))
        regroup = sum(c.bytes for c in r.analytic.comm if "circular" in c.what)
        assert regroup == (stacked if repeats == 2 else 0)
        assert not any(
            c.kind == "all-reduce" and "stage" in c.axes and c.phase == "fwd" and "matmul" in c.what
            for c in r.analytic.comm
        )
    else:
        assert comm[("expert", "all-to-all")] == costs["experts"]["all_to_all_bytes"] > 0
        # Expert weights are gathered over fsdp only (their expert dimension stays split 4 ways); the rest over
        # fsdp and expert, whole.
        leaves = build_plan(params, None, mesh, rules).params

        def is_expert(leaf):
            return {"expert", "mlp"} <= set(leaf.names or ())

        experts = sum(leaf.nbytes for leaf in leaves if is_expert(leaf))
        dense = sum(leaf.nbytes for leaf in leaves if not is_expert(leaf) and not leaf.replicated)
        gathered = sum(c.bytes for c in r.analytic.comm if c.kind == "all-gather" and c.phase == "fwd")
        assert gathered == dense + experts // 4


def test_the_written_overrides_set_the_pipeline_micro_batches(moe_search):
    _, _, s, _ = moe_search
    pp = next(r for r in s.results if r.candidate.stages == 4 and r.candidate.microbatches == 8)
    sets = pp.candidate.overrides(pp.rules, None)
    assert "train.microbatches=8" in sets and "mesh.shape={stage: 4, data: 2}" in sets
    assert pp.candidate.label.endswith("M=8")
    flat = next(r for r in s.results if r.candidate.stages == 1 and r.fits)
    assert "train.microbatches=null" in flat.candidate.overrides(flat.rules, None)
