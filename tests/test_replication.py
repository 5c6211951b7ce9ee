"""ReplicationWarning: tree_layouts / tree_shardings / Trainer say when most of the state is replicated because
nothing matched its names (a plain Flax model, names no rule or mesh axis knows); replication the table asks
for is never warned about."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning as pt


class Plain(nn.Module):  # Flax's wmt / lm1b style: no names anywhere
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.Dense(64)(x))


@pytest.fixture(scope="module")
def plain():
    return jax.eval_shape(Plain().init, jax.random.key(0), jnp.zeros((8, 32)))


@pytest.fixture(scope="module")
def fsdp_mesh():
    return pt.make_mesh({"data": 1, "fsdp": 8})


def test_a_plain_model_under_a_sharding_table_warns_with_share_and_arrays(plain, fsdp_mesh):
    with pytest.warns(pt.ReplicationWarning) as caught:
        pt.tree_shardings(plain, fsdp_mesh, "fsdp")
    [w] = caught
    assert str(w.message) == (
        "100% of the state (9.27 KiB of 9.27 KiB) is replicated on every device of mesh {data: 1, fsdp: 8}: "
        "4 arrays have no logical names (params/Dense_0/bias, params/Dense_0/kernel, params/Dense_1/bias "
        "and 1 more). Name the dimensions (pt.with_logical_partitioning, nnx.with_partitioning) or add rules "
        "for their names; a model you cannot edit is named by path (`annotations:`, which `partitioning annotate` "
        "proposes)"
    )
    assert w.filename == __file__  # points at the caller's line


def test_names_no_rule_or_axis_matches_are_named(fsdp_mesh):
    tree = {
        "w": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((64, 64), jnp.float32), ("hidden", "out")),
        "e": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((64, 8), jnp.float32), ("embed", None)),
    }
    with pytest.warns(pt.ReplicationWarning, match=r"^89% of the state .*: no rule or mesh axis matches the names "):
        layouts = pt.tree_layouts(tree, fsdp_mesh, "fsdp")
    with pytest.warns(pt.ReplicationWarning, match=r"matches the names 'hidden', 'out'\. Name the dimensions"):
        pt.tree_specs(tree, fsdp_mesh, "fsdp")
    assert [leaf.spec for leaf in layouts] == [P("fsdp", None), P(None, None)]


def test_no_warning_when_replication_is_asked_for_or_the_state_is_sharded(plain, fsdp_mesh, dense_module):
    named = jax.eval_shape(dense_module(64).init, jax.random.key(0), jnp.zeros((8, 32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", pt.ReplicationWarning)
        pt.tree_shardings(plain, pt.make_mesh({"data": 8}), "dp")  # pure data parallelism: replicated on purpose
        pt.tree_shardings(named, fsdp_mesh, "fsdp")  # named and sharded
        pt.tree_shardings(plain, fsdp_mesh, "fsdp", warn_replicated=False)
        pt.tree_shardings(plain, pt.make_mesh({"fsdp": 1}, devices=jax.devices()[:1]), "fsdp")  # one device
        pt.tree_layouts(plain, fsdp_mesh, [("batch", ("data", "fsdp")), ("embed", None), ("mlp", None)])


def mse(y, batch):
    return jnp.mean((y - batch["targets"]) ** 2)


def test_trainer_warns_once_and_the_warning_filters_like_any_other(fsdp_mesh):
    def make():
        batch = {"inputs": jnp.zeros((8, 32)), "targets": jnp.zeros((8, 4))}
        return pt.Trainer(Plain(), optax.sgd(0.1), fsdp_mesh, "fsdp", batch=batch, task=mse)

    with pytest.warns(pt.ReplicationWarning) as caught:
        make()
    assert len([w for w in caught if w.category is pt.ReplicationWarning]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", pt.ReplicationWarning)
        make()
