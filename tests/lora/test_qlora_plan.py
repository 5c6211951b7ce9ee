"""`plan` prices a quantized base: Llama-3.1-70B QLoRA (NF4 base) fits on 2 x 80 GiB; int8 is 1 byte a weight.

Planned from configs/hf/llama-3.1-70b/config.json alone (shapes only: fast)."""

from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.config.planning import plan_from_config
from partitioning.plan.budget import check_budget

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB = 2**30
LAYERS, EMBED, KV, MLP, VOCAB = 80, 8192, 1024, 28672, 128256
# The kernels stored quantized: q, k, v, o and the three MLP weights of every layer.
KERNELS = LAYERS * (2 * EMBED * EMBED + 2 * EMBED * KV + 3 * EMBED * MLP)
# What stays bfloat16: embedding, head, the two norms of each layer and the final norm.
OTHERS = 2 * VOCAB * EMBED + (2 * LAYERS + 1) * EMBED
ADAPTERS = 207_093_760


def plan_of(*sets: str):
    cfg = pt.load_config(CONFIGS / "llama3_70b_qlora.yaml", list(sets))
    plan, _ = plan_from_config(cfg, cfg.mesh.devices)
    return plan, check_budget(plan, cfg.mesh.memory_bytes)


def test_an_nf4_base_of_70b_fits_2_x_80gib():
    plan, fit = plan_of()
    assert fit.fits and fit.budget == 80 * GIB
    t = plan.totals
    assert KERNELS + OTHERS == 70_553_706_496  # every weight of the model, once
    assert plan.num_params == KERNELS + OTHERS + ADAPTERS  # codes count their weights, scales none
    # NF4: half a byte a weight + a float32 absmax per 64; the rest bfloat16
    assert t["frozen"]["total"] == KERNELS // 2 + KERNELS // 64 * 4 + 2 * OTHERS
    assert t["trainable"]["total"] == t["gradients"]["total"] == 4 * ADAPTERS
    assert t["optimizer"]["total"] == 8 * ADAPTERS + 16
    assert round(fit.peak / GIB, 2) == 21.61
    assert fit.top[0] == ("params/blocks/mlp/wi_0 (frozen)", LAYERS * MLP * EMBED // 2 // 2)


def test_an_int8_base_is_one_byte_a_weight_plus_its_scales():
    plan, fit = plan_of("model.lora.base_dtype=int8")
    assert plan.totals["frozen"]["total"] == KERNELS + KERNELS // 64 * 4 + 2 * OTHERS
    assert fit.fits and round(fit.peak / GIB, 2) == 37.54


@pytest.mark.parametrize(
    "rules, shape, wo, q",
    [
        ("fsdp", "{data: 1, fsdp: 8}", P(None, "fsdp", None), P(None, None, None, "fsdp")),
        ("fsdp_tp", "{data: 1, fsdp: 2, tensor: 4}", P(None, "fsdp", "tensor"), P(None, "tensor", None, "fsdp")),
        ("tp", "{data: 1, tensor: 8}", P(None, None, "tensor"), P(None, "tensor", None, None)),
    ],
)
def test_scales_are_split_where_their_kernels_are(rules, shape, wo, q):
    # wo (layers, embed, mlp) is blocked along mlp, q (layers, heads, kv, embed) along embed: a split of the
    # blocked axis cuts codes and scales at the same block boundaries.
    plan, _ = plan_of(f"mesh.shape={shape}", "mesh.devices=8", f"rules={rules}")
    leaves = {leaf.path: leaf for leaf in plan.params}
    for name, spec in (("blocks/mlp/wo", wo), ("blocks/attn/q", q)):
        codes, scale = leaves[f"params/{name}"], leaves[f"params/{name}_qscale"]
        assert codes.names == scale.names and codes.spec == scale.spec == spec


def test_tune_prices_the_float_weights_flops_and_the_stored_bytes():
    plan, _ = plan_of()
    nf4 = pt.tune.workload(plan.params, batch_size=8, seq_len=2048)
    bf16, _ = plan_of("model.lora.base_dtype=null")
    assert nf4.params == plan.num_params == bf16.num_params  # the codes count their weights, the scales none
    assert nf4.matmul_params == pt.tune.workload(bf16.params, batch_size=8, seq_len=2048).matmul_params
    assert plan.totals["frozen"]["total"] < 0.31 * bf16.totals["frozen"]["total"]
