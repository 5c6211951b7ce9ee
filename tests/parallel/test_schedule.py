"""The GPipe schedule (partitioning.parallel.schedule): the same values and gradients as a plain scan over the
layers, for S = 2 and 4 stages and any number of micro-batches; its collectives; the bubble fraction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.parallel import bubble_fraction, gpipe
from partitioning.parallel.schedule import stage_chunks
from partitioning.plan.hlo import collectives

L, B, D = 8, 16, 32


def layer_fn(w, x, args, i, j):
    (scale,) = args
    h = jnp.tanh(x @ w) * scale[:, None]
    h = pt.with_logical_constraint(h, ("batch", "embed"))
    # An aux term that depends on the micro-batch's rows: summed over layers, averaged over micro-batches.
    return h, {"aux": jnp.mean(h**2)}


def sequential(ws, x, scale):
    def body(carry, w):
        h, aux = carry
        h, a = layer_fn(w, h, (scale,), 0, 0)
        return (h, aux + a["aux"]), None

    (h, aux), _ = jax.lax.scan(body, (x, 0.0), ws)
    return h, aux


@pytest.fixture(scope="module")
def data():
    ws = jax.random.normal(jax.random.key(0), (L, D, D)) / D**0.5
    x = jax.random.normal(jax.random.key(1), (B, D))
    scale = 1.0 + jax.random.uniform(jax.random.key(2), (B,))
    return ws, x, scale


def test_bubble_fraction():
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert bubble_fraction(1, 8) == 0.0
    # The interleaved (circular) form: R repeats divide the bubble.
    assert bubble_fraction(4, 4, repeats=2) == pytest.approx(3 / 11)
    assert stage_chunks(4, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(
    "stages,micro,repeats", [(2, 1, 1), (2, 4, 1), (4, 4, 1), (4, 8, 1), (2, 2, 2), (2, 4, 4), (4, 8, 2)]
)
def test_gpipe_equals_the_layers_applied_in_order(data, stages, micro, repeats):
    ws, x, scale = data
    mesh = pt.make_mesh({"stage": stages, "data": -1})
    rules = pt.Rules([("layers", "stage"), ("batch", "data")])

    def piped(ws, x, scale):
        return gpipe(
            layer_fn, ws, x, (scale,), stages=stages, microbatches=micro, repeats=repeats, batch_axes=("data",)
        )

    with pt.sharding_context(mesh, rules):
        wsh = jax.device_put(ws, NamedSharding(mesh, P("stage")))
        y, aux = jax.jit(piped)(wsh, x, scale)
        g = jax.jit(jax.grad(lambda w, x: piped(w, x, scale)[0].sum(), argnums=(0, 1)))(wsh, x)
    y_ref, aux_ref = sequential(ws, x, scale)
    g_ref = jax.grad(lambda w, x: sequential(w, x, scale)[0].sum(), argnums=(0, 1))(ws, x)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)  # float32 sums in another order (5e-6 seen)
    for a, b in zip(g, g_ref, strict=True):  # float32 sums in another order: tolerance at the array's scale
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
    # Summed over layers; a mean over micro-batches of per-micro-batch means is the batch mean here.
    np.testing.assert_allclose(aux["aux"], aux_ref, rtol=1e-5)


def test_the_shift_is_one_collective_permute_per_iteration(data):
    ws, x, scale = data
    stages, micro = 4, 4
    mesh = pt.make_mesh({"stage": stages, "data": 2})
    rules = pt.Rules([("layers", "stage"), ("batch", "data")])

    def f(w, x):
        return gpipe(layer_fn, w, x, (scale,), stages=stages, microbatches=micro, batch_axes=("data",))[0]

    with pt.sharding_context(mesh, rules):
        wsh = jax.device_put(ws, NamedSharding(mesh, P("stage")))
        text = jax.jit(f).lower(wsh, x).compile().as_text()
    permutes = [c for c in collectives(text) if c.kind == "collective-permute"]
    assert len(permutes) == 1
    (c,) = permutes
    assert c.executions == micro + stages - 1
    # One micro-batch's rows on this device: (B / M) / data rows of D floats.
    assert c.bytes == (B // micro // 2) * D * 4
    # No weight moves: nothing is gathered over `stage`.
    assert not [c for c in collectives(text) if c.kind == "all-gather"]
