"""The shape-priced compute terms (partitioning.tune.compute, efficiency, links) against values computed by hand:
GEMM tables interpolated in log-shape space, collectives by message size and link, attention by implementation,
frozen weights without weight gradients."""

import dataclasses
import math

import pytest

import partitioning as pt
from partitioning.layout import tree_layouts
from partitioning.rules import Rules
from partitioning.tune.compute import CAUSAL, FLASH_BACKWARD, XLA_SCORE_BYTES, attention_kind, compute_terms
from partitioning.tune.cost import analytic_comm
from partitioning.tune.crossover import mlp_stack
from partitioning.tune.efficiency import GemmTable, model_table, sm90
from partitioning.tune.hardware import Hardware
from partitioning.tune.links import Curve, alpha_beta, effective_bandwidth, ib_link
from partitioning.tune.workload import Workload

# Every GEMM at half the peak, except those with a dimension of 256 or less: a quarter.
TABLE = GemmTable.from_points(
    [(m, n, k, 0.25 if min(m, n, k) <= 256 else 0.5) for m in (256, 4096) for n in (256, 4096) for k in (256, 4096)]
)
HW = Hardware(
    name="test",
    peak_flops=1e12,
    memory=2**30,
    memory_bandwidth=1e10,
    topology="nodes",
    node_size=64,
    link_bandwidth=1e9,
    network_bandwidth=1e9,
    gemm=TABLE,
)
D, F, L, TOKENS = 4096, 4096, 2, 4096


def mlp(mesh, rules="fsdp", tokens=TOKENS):
    params = tree_layouts(mlp_stack(D, F, L), mesh, Rules.preset(rules))
    w = Workload(params=2 * L * D * F, matmul_params=2 * L * D * F, batch=tokens, seq_len=1, layers=L, embed=D,
                 mlp=F, compute_bytes=2)  # fmt: skip
    return params, w


def test_a_gemm_table_interpolates_in_log_shape_space():
    assert TABLE.efficiency(4096, 4096, 4096) == 0.5
    assert TABLE.efficiency(1024, 4096, 4096) == pytest.approx(0.375)  # half way in log2 between 256 and 4096
    assert TABLE.efficiency(65536, 4096, 4096) == 0.5  # above the grid: the plateau
    assert TABLE.efficiency(128, 4096, 4096) == pytest.approx(0.125)  # below: the 256 GEMM's time
    with pytest.raises(ValueError, match="full grid"):
        GemmTable.from_points([(256, 256, 256, 0.5), (512, 256, 256, 0.5), (256, 512, 256, 0.5)])


def test_the_h100_table_is_xlas_measured_one_and_the_tpu_tables_a_roofline_model():
    t = sm90()
    assert t.measured and "matmul_interpolator_data.h" in t.source and t.date == "2026-07-10"
    assert t.efficiency(4096, 4096, 4096) == pytest.approx(6.2 * 0 + 780.2 / 989, abs=0.01)
    assert t.efficiency(256, 256, 256) < 0.01 < t.efficiency(1024, 1024, 1024) < t.efficiency(4096, 4096, 4096)
    v5p = pt.tune.hardware("v5p").gemm
    assert not v5p.measured and v5p.efficiency(8192, 8192, 8192) == pytest.approx(1.0)
    # An operand of 128 elements: the HBM roofline binds (2.76 TB/s against 459 TFLOP/s).
    m = model_table(459e12, 2.76e12, cap=1.0, tile=128, floor_s=0.0)
    moved = 2 * (8192 * 128 * 2 + 8192 * 8192)
    assert m.efficiency(8192, 8192, 128) == pytest.approx(2 * 8192 * 8192 * 128 / 459e12 / (moved / 2.76e12))


def test_each_matmul_is_priced_at_its_shape_forward_and_backward():
    params, w = mlp({"data": 1, "fsdp": 4})
    c = compute_terms(params, {"data": 1, "fsdp": 4}, Rules.preset("fsdp"), w, HW, remat="none", grad_accum=1)
    gemm = 2 * 1024 * 4096 * 4096 / (1e12 * 0.375)  # 1,024 tokens per device: (1024, 4096, 4096) at 0.375
    assert c.matmul["fwd"] == pytest.approx(2 * L * gemm)  # wi and wo, per layer
    # Backward: the input gradient (1024, 4096, 4096) and the weight gradient (4096, 4096, 1024), same shares.
    assert c.matmul["bwd"] == pytest.approx(2 * 2 * L * gemm)
    assert c.flops["fwd"] == pytest.approx(2 * 1024 * 2 * L * D * F)
    full = compute_terms(params, {"data": 1, "fsdp": 4}, Rules.preset("fsdp"), w, HW, remat="full", grad_accum=1)
    assert full.matmul["bwd"] == pytest.approx(c.matmul["bwd"] + c.matmul["fwd"])  # the forward again


def test_frozen_weights_cost_no_weight_gradient_flops_and_no_gradient_collectives():
    mesh = {"data": 2, "fsdp": 2}
    params, w = mlp(mesh)
    frozen = {"wi"}  # paths without params/, as train.trainable names them
    kw = dict(remat="none", grad_accum=1)
    trained = compute_terms(params, mesh, Rules.preset("fsdp"), w, HW, **kw)
    lora = compute_terms(params, mesh, Rules.preset("fsdp"), w, HW, frozen=frozen, **kw)
    gemm = 2 * 1024 * 4096 * 4096 / (1e12 * 0.375)
    assert trained.matmul["bwd"] - lora.matmul["bwd"] == pytest.approx(L * gemm)  # wi's weight gradient only
    assert lora.flops["bwd"] == pytest.approx(trained.flops["bwd"] * 3 / 4)
    w2 = dataclasses.replace(w, frozen_params=L * D * F)  # the workload's count says the same
    assert w2.flops_per_step()["bwd"] == pytest.approx(w.flops_per_step()["bwd"] * 3 / 4)
    comms = {(x.label, x.kind, x.what) for x in analytic_comm(params, mesh, Rules.preset("fsdp"), w, HW,
                                                              micro_batch=w.batch, frozen={"wi"})}  # fmt: skip
    assert ("fsdp", "all-gather", "FSDP weights (backward)") in comms  # the input gradient needs the weights
    trains = analytic_comm(params, mesh, Rules.preset("fsdp"), w, HW, micro_batch=w.batch)
    kinds = lambda cs: sorted((x.kind, x.label) for x in cs)  # noqa: E731
    frozen_comm = analytic_comm(params, mesh, Rules.preset("fsdp"), w, HW, micro_batch=w.batch, frozen={"wi"})
    assert kinds(trains) == kinds(frozen_comm)  # wo still reduces its gradient
    scattered = lambda cs: sum(x.bytes for x in cs if x.kind == "reduce-scatter")  # noqa: E731
    assert scattered(frozen_comm) == pytest.approx(scattered(trains) / 2)


def test_attention_by_implementation():
    w = Workload(params=0, matmul_params=0, batch=4, seq_len=4096, layers=1, embed=4096, heads=32, kv_heads=32,
                 head_dim=128, compute_bytes=2)  # fmt: skip
    mesh, rules = {"data": 1}, Rules.preset("dp")
    fused = compute_terms([], mesh, rules, dataclasses.replace(w, attention="fused"), HW, remat="none", grad_accum=1)
    xla = compute_terms([], mesh, rules, w, HW, remat="none", grad_accum=1)
    rows = 4 * 4096 * 32  # query rows of the scores
    square = 4.0 * rows * 4096 * 128
    assert fused.flops["fwd"] == pytest.approx(square * CAUSAL)  # the kernel skips the masked half
    assert fused.flops["bwd"] == pytest.approx(square * CAUSAL * FLASH_BACKWARD)
    assert xla.flops["fwd"] == pytest.approx(square)
    assert fused.hbm_bytes["fwd"] == xla.hbm_bytes["fwd"] - XLA_SCORE_BYTES["fwd"] * rows * 4096  # the scores' trips
    assert xla.seconds["fwd"] > 2 * fused.seconds["fwd"]
    auto = dataclasses.replace(w, attention="auto")
    assert [attention_kind(auto, pt.tune.hardware(h)) for h in ("h100", "v5p")] == ["fused", "xla"]


def test_collectives_by_message_size_and_link():
    curve = Curve(((1e3, 1e8), (1e6, 1e10), (1e9, 1e11)))
    assert curve.rate(1e9) == curve.rate(1e12) == 1e11  # flat above the largest message
    assert curve.rate(math.sqrt(1e6 * 1e9)) == pytest.approx(math.sqrt(1e10 * 1e11))  # log-log
    assert curve.rate(1e2) == pytest.approx(1e7)  # the smallest message's time below it
    ici = alpha_beta("ici", 1e11, 1e-5)
    assert ici.rate("all-gather", 8, 1e6) == pytest.approx(1e6 / (1e-5 + 1e-5))  # latency and bytes alike
    assert ici.rate("all-reduce", 8, 1e6) == pytest.approx(2e6 / (1e-5 + 2e-5))
    ib = ib_link()
    assert ib.rate("all-gather", 4, 1e12) == pytest.approx(0.94 * 50e9, rel=1e-3)
    h100 = pt.tune.hardware("h100")
    nvlink = h100.links[0]
    # Inside a node, XLA's measured all-gather of 8 H100s; across 8 nodes, each GPU's NIC carries 1/8 to 8 nodes.
    assert effective_bandwidth(h100, "all-gather", 2**31, 8, 8) == nvlink.curves["all-gather 8"].rate(2**31)
    across = effective_bandwidth(h100, "all-gather", 2**31, 64, 8)
    assert across == pytest.approx(min(nvlink.curves["all-gather 8"].rate(2**31), 8 * ib.rate("all-gather", 8, 2**28)))


def test_the_einsums_on_a_gpu_are_priced_as_the_einsums_they_are(write):
    """The config's ``model.attention`` reaches tune's workload: ``auto`` runs cuDNN on a GPU, ``xla`` the einsums."""
    from partitioning.config.load import load_config
    from partitioning.config.planning import tune_inputs

    path = write("run.yaml", "model: {name: gpt, vocab_size: 256, embed: 64, heads: 4, mlp: 128, layers: 2, "
                             "dtype: bfloat16, attention: auto}\nmesh: {shape: {data: -1}}\nrules: dp\n"
                             "train: {batch_size: 8, seq_len: 256}\n")  # fmt: skip
    auto = tune_inputs(load_config(path)).workload
    xla = tune_inputs(load_config(path, ["model.attention=xla"])).workload
    assert (auto.attention, xla.attention) == ("auto", "xla")
    h100 = pt.tune.hardware("h100")
    assert (attention_kind(auto, h100), attention_kind(xla, h100)) == ("fused", "xla")
