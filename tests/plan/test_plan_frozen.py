"""`plan` prices what a fine-tune holds: Llama-3.1-70B on 8 x 80 GiB, full (does not fit) vs LoRA (fits).

Planned from configs/hf/llama-3.1-70b/config.json alone (shapes only: fast)."""

from pathlib import Path

import pytest

import partitioning as pt
from partitioning.config.planning import plan_from_config
from partitioning.plan.budget import check_budget

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB = 2**30


def plan_of(name: str, *sets: str):
    cfg = pt.load_config(CONFIGS / name, list(sets))
    plan, _ = plan_from_config(cfg, 8)
    return plan, check_budget(plan, cfg.mesh.memory_bytes)


@pytest.fixture(scope="module")
def full():
    return plan_of("llama3_70b_full8.yaml")


def test_full_fine_tune_of_70b_does_not_fit_8_x_80gib(full):
    plan, fit = full
    assert not fit.fits and fit.budget == 80 * GIB
    n = plan.num_params
    assert n == 70_553_706_496
    # float32 params + gradients + adam's two moments (+ 16 bytes of optimizer scalars), fully sharded
    assert plan.totals["total"]["total"] == 16 * n + 16 and plan.totals["frozen"]["total"] == 0
    assert round(fit.peak / GIB, 1) == 131.4
    assert "needs 131.42 GiB per device" in str(fit.error())


def test_lora_fine_tune_of_70b_fits_8_x_80gib(full):
    plan, fit = plan_of("llama3_70b_lora.yaml")
    full = full[0]
    assert fit.fits and fit.budget == 80 * GIB
    t = plan.totals
    adapters = plan.to_json()["trainable_parameters"]
    assert adapters == 207_093_760 and adapters / plan.num_params < 0.003  # rank 16 on attention and MLP
    assert plan.num_params == full.num_params + adapters
    # the bfloat16 base: 2 bytes per weight, no gradient, no moments; the float32 adapters: 4 + 4 + 8
    assert t["frozen"]["total"] == 2 * full.num_params
    assert t["trainable"]["total"] == t["gradients"]["total"] == 4 * adapters
    assert t["optimizer"]["total"] == 8 * adapters + 16
    assert round(fit.peak / GIB, 2) == 17.12
    assert fit.top[0] == ("params/blocks/mlp/wi_0 (frozen)", 80 * 28672 * 8192 * 2 // 8)
