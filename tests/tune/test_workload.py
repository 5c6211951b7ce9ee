"""The workload (partitioning.tune.workload): the model's shape from logical names, its FLOPs, and the
activation estimate against XLA's compiled memory."""

import jax
import optax
import pytest

import partitioning as pt
from partitioning.plan import build_plan
from partitioning.rules import Rules
from partitioning.train.state import abstract_train_state
from partitioning.tune.cost import token_axes
from partitioning.tune.price import _gathered_layer_bytes
from partitioning.tune.workload import activation_bytes, workload


def test_shape_from_logical_names(gpt_workload):
    w = gpt_workload
    assert (w.layers, w.embed, w.mlp, w.heads, w.kv_heads, w.head_dim, w.vocab) == (2, 32, 64, 4, 4, 8, 64)
    assert w.params == 64 * 32 * 2 + 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32
    assert w.matmul_params == w.params - 64 * 32 - 2 * 2 * 32 - 32  # no lookup table, no norm scales
    assert w.tokens == 8 * 16 and w.compute_bytes == 4


def test_unscanned_layers_are_counted_from_their_names():
    model = pt.model.build_model("gpt", vocab_size=64, embed=32, heads=4, mlp=64, layers=3, scan_layers=False)
    params, opt = abstract_train_state(model, optax.adamw(1e-3), batch_size=8, seq_len=16)
    assert workload(build_plan(params, opt, {"data": 1}, Rules([])).params, batch_size=8, seq_len=16).layers == 3


def test_flops_per_step(gpt_workload):
    w = gpt_workload
    fwd = w.tokens * (2 * w.matmul_params + 4 * 16 * 4 * 8 * 2)  # matmuls + attention (QK^T, PV) per layer
    assert w.flops_per_step("none") == {
        "fwd": fwd,
        "bwd": 2 * fwd,
        "recompute": 0.0,
        "total": 3 * fwd,
        "model": 3 * fwd,
        "six_n": 6 * w.params * w.tokens,
    }
    assert w.flops_per_step("full")["total"] == 4 * fwd


@pytest.mark.parametrize(
    "rules,mesh,remat",
    [
        ("fsdp", {"data": 1, "fsdp": 8}, "none"),
        ("fsdp", {"data": 1, "fsdp": 8}, "full"),
        ("tp", {"data": 2, "tensor": 4}, "none"),
    ],
)
def test_activation_estimate_is_near_the_compiled_peak(rules, mesh, remat):
    b, t = 16, 256
    model = pt.model.build_model("gpt", vocab_size=512, embed=256, heads=8, mlp=1024, layers=2, remat=remat)
    tx = optax.adamw(1e-3)
    trainer = pt.Trainer(model, tx, pt.make_mesh(mesh), rules, batch_size=b, seq_len=t)
    m = trainer.lower_train_step().compile().memory_analysis()
    compiled = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    params, opt = abstract_train_state(model, tx, batch_size=b, seq_len=t)
    plan = build_plan(params, opt, mesh, rules)
    w = workload(plan.params, batch_size=b, seq_len=t)
    r = Rules.preset(rules)
    state = sum(plan.totals[k]["per_device"] for k in ("params", "optimizer", "gradients"))
    acts = activation_bytes(
        w,
        r,
        mesh,
        remat=remat,
        micro_batch=b,
        gathered_layer_bytes=_gathered_layer_bytes(plan, token_axes(r, mesh, w), w.layers),
    )
    assert 0.75 < (state + acts["total"]) / compiled < 1.25
    jax.clear_caches()
