"""Layouts (partitioning.layout): specs, shardings and per-device bytes of whole trees,
for Linen boxes, Flax's own boxes and NNX variables (one rule table means the same for both)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt


def test_flax_own_boxes_are_accepted():
    tree = {
        "logical": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((8, 4), jnp.float32), ("embed", "mlp")),
        "mesh_named": nn.Partitioned(jax.ShapeDtypeStruct((8, 4), jnp.float32), ("fsdp", None)),
        "plain": jax.ShapeDtypeStruct((8, 4), jnp.float32),
        "scalar": jax.ShapeDtypeStruct((), jnp.int32),
    }
    mesh = pt.make_mesh({"fsdp": 8})
    specs = pt.tree_specs(tree, mesh, [("embed", "fsdp")])
    assert specs == {"logical": P("fsdp", None), "mesh_named": P("fsdp", None), "plain": P(), "scalar": P()}
    shardings = pt.tree_shardings(tree, mesh, [("embed", "fsdp")])
    assert shardings["logical"] == NamedSharding(mesh, P("fsdp", None))


def test_tree_sharding_divisibility_error_names_path():
    tree = {
        "params": {
            "decoder": {
                "mlp": {
                    "wi": {
                        "kernel": nn.LogicallyPartitioned(
                            jax.ShapeDtypeStruct((64, 3004), jnp.float32), ("embed", "mlp")
                        )
                    }
                }
            }
        }
    }
    mesh = pt.make_mesh({"tensor": 8})
    with pytest.raises(pt.ShardingError) as e:
        pt.tree_shardings(tree, mesh, "tp")
    assert str(e.value).startswith(
        "params/decoder/mlp/wi/kernel: dim 1 ('mlp', size 3004) is not divisible by mesh axes ('tensor',) of size 8"
    )
    with pytest.warns(pt.IndivisibleWarning, match="params/decoder/mlp/wi/kernel: dim 1") as caught:
        specs = pt.tree_specs(tree, mesh, "tp", on_indivisible="replicate")
    # Reported at the caller's line (this file), not at a line of the library's rule walk.
    assert [w.filename for w in caught if w.category is pt.IndivisibleWarning] == [__file__]
    assert specs["params"]["decoder"]["mlp"]["wi"]["kernel"] == P(None, None)


def test_per_device_bytes_match_real_shards(dense_module):
    model = dense_module(16)
    x = jnp.zeros((8, 32))
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    layouts = pt.tree_layouts(abstract, mesh, "fsdp_tp")
    params = jax.jit(model.init, out_shardings=pt.tree_shardings(abstract, mesh, "fsdp_tp"))(jax.random.key(0), x)
    [w] = jax.tree.leaves(pt.unbox(params))
    assert w.sharding.spec == P("fsdp", "tensor")
    assert pt.layout.per_device_bytes(layouts) == w.addressable_shards[0].data.nbytes == 32 * 16 * 4 // 8


# -- Flax NNX ----------------------------------------------------------------------


class Block(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.wi = nnx.Linear(
            16, 64, use_bias=False, rngs=rngs, kernel_init=nnx.with_partitioning(init, ("embed", "mlp"))
        )
        self.wo = nnx.Linear(
            64, 16, use_bias=False, rngs=rngs, kernel_init=nnx.with_partitioning(init, ("mlp", "embed"))
        )
        self.scale = nnx.Param(jnp.ones((16,)))  # no names: replicated

    def __call__(self, x):
        return self.wo(jax.nn.gelu(self.wi(x))) * self.scale


def test_nnx_state_layouts_and_eager_sharding_agree():
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    with pt.sharding_context(mesh, "fsdp_tp"):
        abstract = nnx.eval_shape(lambda: Block(nnx.Rngs(0)))
        model = Block(nnx.Rngs(0))  # NNX shards eagerly through the same (mirrored) rules
    layouts = {leaf.path: leaf for leaf in pt.tree_layouts(nnx.state(abstract), mesh, "fsdp_tp")}
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
