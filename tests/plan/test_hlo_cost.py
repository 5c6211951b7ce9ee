"""FLOPs and bytes per op from optimized HLO (partitioning.plan.hlo_cost): loops counted, in-place slices,
phases; against XLA's own cost_analysis where it is right (no loops)."""

import jax
import jax.numpy as jnp
import pytest

from partitioning.plan.hlo_cost import op_costs, phase_of, summarize_ops

M, K, N, STEPS = 64, 128, 96, 5


def matmuls(x, w):
    for _ in range(STEPS):
        x = jnp.tanh(x @ w)
    return x


def scanned(x, w):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=STEPS)[0]


ARGS = (jax.ShapeDtypeStruct((M, K), jnp.float32), jax.ShapeDtypeStruct((K, K), jnp.float32))


def test_unrolled_program_agrees_with_cost_analysis():
    compiled = jax.jit(matmuls).lower(*ARGS).compile()
    total = summarize_ops(op_costs(compiled.as_text()))["total"]
    assert total["flops"] == pytest.approx(compiled.cost_analysis()["flops"], rel=0.05)
    assert total["flops"] >= STEPS * 2 * M * K * K


def test_a_loop_counts_its_body_once_per_iteration():
    compiled = jax.jit(scanned).lower(*ARGS).compile()
    total = summarize_ops(op_costs(compiled.as_text()))["total"]
    dots = STEPS * 2 * M * K * K
    assert dots <= total["flops"] <= dots * 1.1
    # XLA's cost_analysis counts the while body once, whatever the trip count.
    assert compiled.cost_analysis()["flops"] < total["flops"] / 2


def test_a_scan_stacking_its_outputs_writes_only_the_update():
    def stack(x):
        return jax.lax.scan(lambda c, _: (c * 1.5 + 1.0, c), x, None, length=64)[1]

    compiled = jax.jit(stack).lower(jax.ShapeDtypeStruct((N * 1024,), jnp.float32)).compile()
    total = summarize_ops(op_costs(compiled.as_text()))["total"]
    per_step = N * 1024 * 4
    # Each iteration reads the carry and writes the carry and one row of the stack: a few rows,
    # not the whole 64-row stack (which would be ~64 x 64 rows).
    assert total["bytes"] < 64 * 8 * per_step


def test_phases_come_from_jax_op_names():
    assert phase_of("jit(step)/jvp(GPT)/blocks/mlp/dot_general") == "fwd"
    assert phase_of("jit(step)/transpose(jvp(GPT))/blocks/mlp/dot_general") == "bwd"
    assert phase_of("jit(step)/adam/mul") == "update"

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x)

    ops = op_costs(jax.jit(step).lower(ARGS[1], ARGS[0]).compile().as_text())
    phases = summarize_ops(ops)
    assert phases["fwd"]["flops"] >= 2 * M * K * K
    assert phases["bwd"]["flops"] >= 2 * 2 * M * K * K * 0.5  # dW (and dx, pruned: x is not differentiated)
