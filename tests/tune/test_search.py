"""The search (partitioning.tune.search, .space): every candidate fits or is rejected with its reason; the
ranking; what a compiled view changes; what to say when nothing fits."""

import dataclasses

from partitioning.rules import Rules
from partitioning.tune.space import Candidate, candidates, factorizations, table_axes, zero1_rules


def test_factorizations_and_table_axes():
    assert sorted(factorizations(4, 2)) == [(1, 4), (2, 2), (4, 1)]
    assert len(factorizations(2048, 3)) == 78
    assert table_axes(Rules.preset("fsdp_tp")) == ["data", "fsdp", "tensor"]
    assert table_axes(Rules.preset("dp")) == ["data"]


def test_candidates_cover_meshes_remats_micro_batches_and_zero1():
    rejected = []
    cands = candidates(8, {"dp": Rules.preset("dp"), "fsdp": Rules.preset("fsdp")}, batch_size=8,
                       remats=("none", "full"), rejected=rejected)
    labels = {c.label for c in cands}
    assert "dp {data: 8} remat none" in labels and "dp +zero1 {data: 8} remat full x2 micro-batches" not in labels
    assert "fsdp {data: 2, fsdp: 4} remat full" in labels
    assert all(c.devices == 8 for c in cands)
    # dp over 8 devices with micro-batches of 4 sequences cannot split the batch 8 ways
    assert not any(c.rules_name == "dp" and c.grad_accum > 1 for c in cands)
    assert Candidate((("data", 8),), "dp", "none", 1, True) in cands       # ZeRO-1: data splits no parameter
    assert all(not c.zero1 for c in cands if c.rules_name == "fsdp" and c.sizes["data"] == 1)
    assert rejected == []          # every mesh splits 8 sequences at one micro-batch


def test_zero1_splits_the_optimizer_state_over_data():
    assert zero1_rules(Rules.preset("dp")).to_list()[1:] == [["embed", "data"], ["mlp", "data"], ["vocab", "data"]]


def test_every_candidate_fits_or_says_why_not(run_search):
    s = run_search(budget=2**30)
    assert len(s.results) > 50 and s.duplicates > 0
    for r in s.results:
        if r.fits:
            assert r.estimate is not None and r.peak > 0 and r.step_time > 0
        else:
            assert r.reason.split(":")[0] in {"batch", "indivisible", "memory", "memory (compiled)", "rules"}, r.reason
    best = s.ranked[0].step_time
    times = [round(r.step_time / best, 3) for r in s.ranked]    # within 0.1%, the simpler layout first
    assert times == sorted(times)
    assert any(r.reason.startswith("indivisible: params/") for r in s.rejected)   # tensor 8 over 4 heads


def test_a_batch_that_does_not_split_is_rejected_with_the_shards(run_search, gpt_workload):
    s = run_search(w=dataclasses.replace(gpt_workload, batch=4), tables=("dp",))
    [r] = [r for r in s.results if r.candidate.sizes == {"data": 8} and r.candidate.grad_accum == 1
           and not r.candidate.zero1 and r.candidate.remat == "none"]
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
    for a, b in zip(s.ranked, s.ranked[1:]):
        if round(a.step_time / best, 3) == round(b.step_time / best, 3):
            assert (a.candidate.grad_accum, a.candidate.zero1) <= (b.candidate.grad_accum, b.candidate.zero1)


def test_a_compiled_view_replaces_the_estimates(run_search):
    s = run_search(budget=2**30)
    first = s.ranked[0]
    s.add_compiled(first, {"status": "ok", "memory": {"peak_estimate": 2**31, "temp": 0}, "cost_ops": [],
                           "collective_ops": []})
    assert not first.fits and first.reason.startswith("memory (compiled): needs 2.00 GiB")
    assert first.peak_source == "compiled" and first.compiled is not None
    assert first not in s.ranked
