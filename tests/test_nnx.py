"""Flax NNX: one rule table means the same thing for NNX variables as for Linen boxes."""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt


class Block(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.wi = nnx.Linear(16, 64, use_bias=False, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("embed", "mlp")))
        self.wo = nnx.Linear(64, 16, use_bias=False, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))
        self.scale = nnx.Param(jnp.ones((16,)))  # no names: replicated

    def __call__(self, x):
        return self.wo(jax.nn.gelu(self.wi(x))) * self.scale


def test_nnx_state_layouts_and_eager_sharding_agree():
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    with pt.sharding_context(mesh, "fsdp_tp"):
        abstract = nnx.eval_shape(lambda: Block(nnx.Rngs(0)))
        model = Block(nnx.Rngs(0))  # NNX shards eagerly through the same (mirrored) rules
    layouts = {l.path: l for l in pt.tree_layouts(nnx.state(abstract), mesh, "fsdp_tp")}
    assert layouts["wi/kernel"].names == ("embed", "mlp") and layouts["wi/kernel"].spec == P("fsdp", "tensor")
    assert layouts["wo/kernel"].spec == P("tensor", "fsdp")
    assert layouts["scale"].names is None and layouts["scale"].spec == P()
    assert layouts["wi/kernel"].per_device_bytes == 16 * 64 * 4 // 8
    assert model.wi.kernel[...].sharding.spec == layouts["wi/kernel"].spec
    assert model.wo.kernel[...].sharding.spec == layouts["wo/kernel"].spec


def test_nnx_state_shardings_drive_a_sharded_init():
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    with pt.sharding_context(mesh, "fsdp_tp"):
        graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: Block(nnx.Rngs(0))))
        shardings = pt.tree_shardings(abstract_state, mesh, "fsdp_tp")
        state = jax.jit(lambda: nnx.state(Block(nnx.Rngs(0))), out_shardings=shardings)()
        assert state["wi"]["kernel"][...].sharding == NamedSharding(mesh, P("fsdp", "tensor"))
        assert state["scale"][...].sharding.is_fully_replicated
        model = nnx.merge(graphdef, state)
        y = nnx.jit(lambda m, x: m(x))(model, jnp.ones((8, 16)))
    assert y.shape == (8, 16)
