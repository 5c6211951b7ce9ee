"""Analytic pipeline and expert costs (partitioning.plan.parallel) from traced records."""

import pytest

from partitioning.plan.parallel import costs_from_records, expert_cost, pipeline_cost

STACK = {
    "kind": "pipeline",
    "layers": 8,
    "stages": 4,
    "microbatches": 8,
    "shape": (32, 128, 64),
    "dtype": "bfloat16",
    "batch_axes": ("data",),
}
EXPERTS = {
    "kind": "experts",
    "experts": 8,
    "top_k": 2,
    "capacity": 40,
    "embed": 64,
    "groups": 32,
    "dtype": "float32",
    "batch_axes": ("data", "fsdp", "expert"),
    "expert_axes": ("expert",),
}


def test_pipeline_cost():
    c = pipeline_cost(STACK, {"stage": 4, "data": 2})
    assert c["bubble"] == c["bubble_gpipe"] == pytest.approx(3 / 11) and c["regroup_bytes"] == 0
    assert (c["layers_per_stage"], c["iterations"], c["micro_batch_rows"]) == (2, 11, 4)
    micro = (32 // 8 // 2) * 128 * 64 * 2  # 2 rows of (128, 64) bf16 on each device
    assert c["activation_bytes"] == micro
    assert (c["collective_permute_count"], c["collective_permute_bytes"]) == (22, 22 * micro)
    assert c["stage_all_reduce_bytes"] == 2 * 8 * micro


def test_expert_cost_and_steps_of_several_passes():
    c = expert_cost(EXPERTS, {"data": 1, "fsdp": 2, "expert": 4}, layers=3)
    buffer = (32 // 8) * 8 * 40 * 64 * 4
    assert (c["dispatch_bytes"], c["all_to_all_count"], c["all_to_all_bytes"]) == (buffer, 12, 12 * buffer)
    # No expert axis: no all-to-all (a data-parallel MoE).
    assert expert_cost(EXPERTS, {"data": 1, "fsdp": 8, "expert": 1})["all_to_all_bytes"] == 0
    both = costs_from_records([STACK, EXPERTS, EXPERTS], {"stage": 4, "data": 2, "fsdp": 1, "expert": 1}, passes=2)
    assert (
        both["pipeline"]["collective_permute_bytes"]
        == 2 * pipeline_cost(STACK, {"stage": 4, "data": 2})["collective_permute_bytes"]
    )
    assert both["experts"]["layers"] == 8  # inside the stack: once per stacked layer
    assert costs_from_records([], {"data": 8}) == {"pipeline": None, "experts": None}
