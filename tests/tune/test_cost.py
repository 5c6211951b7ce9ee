"""The cost model's terms (partitioning.tune.cost) against values computed by hand on small cases."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from partitioning.boxes import LogicallyPartitioned
from partitioning.layout import tree_layouts
from partitioning.rules import Rules
from partitioning.tune.compiled import axes_of_group, compiled_estimate
from partitioning.tune.cost import (
    Comm,
    Estimate,
    analytic_comm,
    analytic_estimate,
    bubble_time,
    compute_parallelism,
    parallel_comm,
)
from partitioning.tune.crossover import mlp_stack
from partitioning.tune.hardware import Hardware
from partitioning.tune.workload import Workload

HW = Hardware(
    name="test",
    peak_flops=1e12,
    memory=2**30,
    memory_bandwidth=1e10,
    topology="nodes",
    node_size=64,
    link_bandwidth=1e9,
    network_bandwidth=1e9,
    latency=1e-6,
)
D, F, L, TOKENS = 8, 16, 2, 32  # two MLP blocks, bf16: each of wi, wo is 2 x 8 x 16 x 2 = 512 bytes


def setup(mesh, rules):
    params = tree_layouts(mlp_stack(D, F, L), mesh, Rules.preset(rules))
    w = Workload(
        params=2 * L * D * F,
        matmul_params=2 * L * D * F,
        batch=TOKENS,
        seq_len=1,
        layers=L,
        embed=D,
        mlp=F,
        compute_bytes=2,
    )
    return params, w


def by(comms):
    return {(c.label, c.kind, c.phase): c for c in comms}


def test_fsdp_gathers_weights_twice_and_reduce_scatters_gradients():
    mesh = {"data": 1, "fsdp": 4}
    params, w = setup(mesh, "fsdp")
    c = by(analytic_comm(params, mesh, Rules.preset("fsdp"), w, HW, micro_batch=TOKENS))
    assert set(c) == {("fsdp", "all-gather", "fwd"), ("fsdp", "all-gather", "bwd"), ("fsdp", "reduce-scatter", "bwd")}
    for term in c.values():
        # 128 bytes per device per leaf, gathered over 4: 512 per leaf, 2 leaves; once per layer
        assert (term.bytes, term.count, term.group) == (1024, 4, 4)
        assert term.seconds == pytest.approx(4 * 1e-6 + 1024 / 1e9)


def test_micro_batches_repeat_the_gathers():
    mesh = {"data": 1, "fsdp": 4}
    params, w = setup(mesh, "fsdp")
    c = by(analytic_comm(params, mesh, Rules.preset("fsdp"), w, HW, micro_batch=TOKENS // 4, grad_accum=4))
    assert c[("fsdp", "all-gather", "fwd")].bytes == 4 * 1024


def test_data_parallel_all_reduces_gradients():
    mesh = {"data": 4}
    params, w = setup(mesh, "dp")
    [term] = analytic_comm(params, mesh, Rules.preset("dp"), w, HW, micro_batch=TOKENS)
    assert (term.label, term.kind, term.phase, term.bytes, term.count) == ("data", "all-reduce", "bwd", 1024, 2)
    assert term.seconds == pytest.approx(2e-6 + 2 * 1024 / 1e9)


def test_tensor_parallel_all_reduces_activations():
    mesh = {"data": 1, "tensor": 4}
    params, w = setup(mesh, "tp")
    c = by(analytic_comm(params, mesh, Rules.preset("tp"), w, HW, micro_batch=TOKENS))
    resid = TOKENS * D * 2  # (batch, length, embed) in bf16, whole on every tensor shard
    fwd = c[("tensor", "all-reduce", "fwd")]  # wo (mlp, embed) is row-parallel: its output is summed
    bwd = c[("tensor", "all-reduce", "bwd")]  # wi (embed, mlp) is column-parallel: its input's gradient is
    assert (fwd.bytes, fwd.count) == (L * resid, L)
    assert (bwd.bytes, bwd.count) == (L * resid, L)
    assert compute_parallelism(params, mesh, Rules.preset("tp"), w) == 4


def test_flops_per_device_and_compute_parallelism():
    mesh = {"data": 2, "fsdp": 2}
    params, w = setup(mesh, "fsdp")
    state = {"params": 1.0, "optimizer": 2.0, "gradients": 1.0}
    est = analytic_estimate(params, state, mesh, Rules.preset("fsdp"), w, HW, remat="full", grad_accum=1)
    fwd = 2 * (2 * L * D * F) * TOKENS
    assert est.flops == {"fwd": fwd / 4, "bwd": 3 * fwd / 4, "update": 0.0}  # full remat: forward again
    assert est.model_flops == 3 * fwd


def test_roofline_overlapped_and_not():
    comm = [Comm(("fsdp",), "all-gather", "fwd", 0, 1, 4, 1.5), Comm(("data",), "all-reduce", "bwd", 0, 1, 2, 1.0)]
    e = Estimate(
        "analytic",
        {"fwd": 1e12, "bwd": 2e12, "update": 0.0},
        {"fwd": 0, "bwd": 0, "update": 5e9},
        {"fwd": 1.0, "bwd": 2.0, "update": 0.5},
        comm,
        True,
        3e12,
        1,
        1e12,
    )
    assert e.overlapped == pytest.approx(1.5 + 2.0 + 0.5)
    assert e.serial == pytest.approx(2.5 + 3.0 + 0.5)
    assert e.step_time == e.overlapped and e.mfu == pytest.approx(3.0 / 4.0)
    assert e.per_axis() == {"fsdp": 1.5, "data": 1.0}
    assert e.bottleneck == "compute"  # 2.0 of bwd compute beats 1.5 of fsdp in fwd
    assert dataclasses.replace(e, compute={"fwd": 0.2, "bwd": 0.5, "update": 0.5}).bottleneck == "comm fsdp"
    assert dataclasses.replace(e, compute={"fwd": 0.2, "bwd": 2.0, "update": 0.5}).bottleneck == "compute"
    assert dataclasses.replace(e, overlap=False).step_time == e.serial


def test_axes_of_a_compiled_collective_from_its_group_size():
    mesh = {"data": 2, "fsdp": 4, "tensor": 1}
    assert axes_of_group(mesh, 4, HW) == ("fsdp",)
    assert axes_of_group(mesh, 8, HW) == ("data", "fsdp")
    assert axes_of_group(mesh, 1, HW) == ()


def test_compiled_estimate_is_a_roofline_per_op_on_the_measured_machine():
    hw = dataclasses.replace(HW, measured=True, alloc_bandwidth=1e9)
    ops = [["a", "fusion", "fwd", 1e9, 1e8, 1], ["b", "dot", "bwd", 4e9, 1e7, 1], ["c", "fusion", "bwd", 0, 1e8, 2]]
    colls = [{"kind": "all-gather", "bytes": 1e6, "executions": 3, "group_size": 4, "source": "jit(f)/jvp(g)/x"}]
    e = compiled_estimate(ops, colls, {"data": 2, "fsdp": 4}, hw, model_flops=1.0, temp_bytes=2e7)
    assert e.compute == pytest.approx({"fwd": 1e-2, "bwd": 4e-3 + 1e-2, "update": 0.0})
    [c] = e.comm
    assert (c.label, c.phase, c.bytes, c.count) == ("fsdp", "fwd", 3e6, 3)
    assert c.seconds == pytest.approx(3e-6 + 3e6 / 1e9)
    assert e.other == {"temporaries": pytest.approx(2e-2)}
    assert e.serial == pytest.approx(1e-2 + c.seconds + 1.4e-2 + 2e-2)


def test_compiled_estimate_for_other_hardware_keeps_the_analytic_bytes_and_collectives():
    mesh = {"data": 1, "fsdp": 4}
    params, w = setup(mesh, "fsdp")
    analytic = analytic_estimate(
        params,
        {"params": 1.0, "optimizer": 1.0, "gradients": 1.0},
        mesh,
        Rules.preset("fsdp"),
        w,
        HW,
        remat="none",
        grad_accum=1,
    )
    e = compiled_estimate([["a", "dot", "fwd", 3e9, 1e12, 1]], [], mesh, HW, model_flops=1.0, analytic=analytic)
    assert e.flops["fwd"] == 3e9 and e.hbm_bytes == analytic.hbm_bytes and e.comm == analytic.comm


def test_pipeline_stages_split_the_layers_without_tensor_parallel_traffic():
    """`layers` over `stage` is each device's share of the layers: no activation all-reduce over `stage`."""
    mesh = {"stage": 2, "data": 2}
    params, w = setup(mesh, "pp")
    c = by(analytic_comm(params, mesh, Rules.preset("pp"), w, HW, micro_batch=TOKENS))
    assert set(c) == {("data", "all-reduce", "bwd")}
    assert c[("data", "all-reduce", "bwd")].bytes == 512  # each device holds one of the two layers
    assert compute_parallelism(params, mesh, Rules.preset("pp"), w) == 4


def test_pipeline_fsdp_gathers_a_stage_s_weights_every_schedule_iteration():
    mesh = {"stage": 2, "data": 1, "fsdp": 2}
    params, w = setup(mesh, "pp_fsdp")
    c = by(analytic_comm(params, mesh, Rules.preset("pp_fsdp"), w, HW, micro_batch=TOKENS, microbatches=4))
    # wi, wo: 128 bytes per device each, gathered over fsdp 2 (256), 5 iterations (M=4, S=2)
    assert c[("fsdp", "all-gather", "fwd")].bytes == 2 * 256 * 5
    assert c[("fsdp", "reduce-scatter", "bwd")].bytes == 2 * 256 * 5


def test_pipeline_and_expert_collectives_and_the_bubble():
    mesh = {"stage": 4, "data": 1, "expert": 2}
    costs = {
        "pipeline": {
            "stages": 4,
            "microbatches": 8,
            "collective_permute_bytes": 1000,
            "collective_permute_count": 22,
            "stage_all_reduce_bytes": 400,
        },
        "experts": {"expert_shards": 2, "all_to_all_bytes": 800, "all_to_all_count": 8},
    }
    c = by(parallel_comm(costs, mesh, HW))
    assert set(c) == {
        (a, k, p)
        for a, k in [("stage", "collective-permute"), ("stage", "all-reduce"), ("expert", "all-to-all")]
        for p in ("fwd", "bwd")
    }
    permute = c[("stage", "collective-permute", "fwd")]
    assert (permute.bytes, permute.count, permute.group) == (500, 11, 4)
    assert permute.seconds == pytest.approx(11 * 1e-6 + 500 / 1e9)
    a2a = c[("expert", "all-to-all", "bwd")]
    assert (a2a.bytes, a2a.count) == (400, 4)
    assert a2a.seconds == pytest.approx(4 * 1e-6 + 0.25 * 400 / 1e9)
    assert bubble_time({"fwd": 1.0, "bwd": 2.0, "update": 5.0}, 4, 8) == {"pipeline bubble": pytest.approx(3 * 3 / 8)}
    assert bubble_time({"fwd": 1.0, "bwd": 2.0}, 1, 1) == {}


def test_expert_weights_are_not_gathered_over_the_expert_axis():
    def box(shape, names):
        return LogicallyPartitioned(jax.ShapeDtypeStruct(shape, jnp.bfloat16), names)

    tree = {
        "wi": box((2, 4, D, F), ("layers", "expert", "embed", "mlp")),
        "wo": box((2, 4, F, D), ("layers", "expert", "mlp", "embed")),
    }
    mesh = {"data": 1, "fsdp": 2, "expert": 4}
    params = tree_layouts(tree, mesh, Rules.preset("ep"))
    w = Workload(
        params=4 * 2 * 2 * D * F,
        matmul_params=4 * 2 * 2 * D * F,
        batch=TOKENS,
        seq_len=1,
        layers=2,
        embed=D,
        mlp=F,
        compute_bytes=2,
        expert_params=4 * 2 * 2 * D * F,
        experts=4,
        expert_fraction=0.5,
    )
    c = by(analytic_comm(params, mesh, Rules.preset("ep"), w, HW, micro_batch=TOKENS))
    # Split over expert (their experts) and fsdp (embed): gathered over fsdp only, 2 x 2 x 1 x 8 x 16 x 2 bytes
    assert set(c) == {("fsdp", "all-gather", "fwd"), ("fsdp", "all-gather", "bwd"), ("fsdp", "reduce-scatter", "bwd")}
    assert c[("fsdp", "all-gather", "fwd")].bytes == 2 * (2 * 1 * D * F * 2)
    # Each expert computes half of the tokens' dense work: 2 FLOPs x active params x tokens
    assert w.flops_per_step()["fwd"] == 2 * (4 * 2 * 2 * D * F * 0.5) * TOKENS


def test_a_stage_runs_its_own_layers_tensor_parallel_in_every_schedule_iteration():
    """pp x tp: a device all-reduces the activations of its L/S layers, (M+S-1)/M of the batch (bubble included)."""
    pp_tp = Rules([["layers", "stage"]]) + Rules.preset("tp")
    mesh = {"stage": 2, "data": 1, "tensor": 2}
    params = tree_layouts(mlp_stack(D, F, L), mesh, pp_tp)
    _, w = setup({"data": 1, "tensor": 2}, "tp")
    c = by(analytic_comm(params, mesh, pp_tp, w, HW, micro_batch=TOKENS, microbatches=4))
    resid = TOKENS * D * 2
    fwd = c[("tensor", "all-reduce", "fwd")]
    assert (fwd.bytes, fwd.count) == (L // 2 * resid * 5 / 4, L // 2 * 5)  # 1 layer, 5 iterations of M/4
