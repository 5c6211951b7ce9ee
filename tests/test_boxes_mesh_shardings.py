"""Boxes with Flax transforms and optax, activation constraints, meshes, shardings."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.boxes import LogicallyPartitioned


class Dense(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x):
        w = self.param("w", pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                       (x.shape[-1], self.features))
        return x @ w


class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        def body(mdl, c, _):
            return nn.Dense(
                c.shape[-1], use_bias=False,
                kernel_init=pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
            )(c), None

        scan = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True}, length=3,
                       metadata_params={nn.PARTITION_NAME: "layers"})
        return scan(self, x, None)[0]


def test_box_names_and_shape_check():
    init = pt.with_logical_partitioning(nn.initializers.zeros_init(), ("embed", "mlp"))
    box = init(jax.random.key(0), (4, 8))
    assert isinstance(box, LogicallyPartitioned) and isinstance(box, nn.LogicallyPartitioned)
    assert box.names == ("embed", "mlp")
    with pytest.raises(pt.RuleError, match=r"returned an array of shape \(4,\) but 2 logical names \('embed', 'mlp'\) were given"):
        init(jax.random.key(0), (4,))


def test_scan_inserts_layers_axis_and_get_partition_spec_reads_it():
    abstract = jax.eval_shape(Scanned().init, jax.random.key(0), jnp.zeros((2, 16)))
    box = abstract["params"]["ScanBody_0"]["Dense_0"]["kernel"] if "ScanBody_0" in abstract["params"] else \
        jax.tree.leaves(abstract, is_leaf=pt.is_box)[0]
    assert box.names == ("layers", "embed", "mlp")
    specs = nn.get_partition_spec(abstract)
    assert jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)) == [P("layers", "embed", "mlp")]
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    [layout] = pt.tree_layouts(abstract, mesh, "fsdp_tp")
    assert layout.spec == P(None, "fsdp", "tensor") and layout.shape == (3, 16, 16)


def test_vmap_inserts_axis():
    vm = nn.vmap(Dense, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=0,
                 metadata_params={nn.PARTITION_NAME: "layers"})
    abstract = jax.eval_shape(vm(8).init, jax.random.key(0), jnp.zeros((2, 3, 4)))
    [box] = jax.tree.leaves(abstract, is_leaf=pt.is_box)
    assert box.names == ("layers", "embed", "mlp") and box.value.shape == (2, 4, 8)


def test_optax_state_carries_param_names():
    params = jax.eval_shape(Dense(8).init, jax.random.key(0), jnp.zeros((2, 4)))
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    specs = {l.path: l.spec for l in pt.tree_layouts(opt, mesh, "fsdp_tp")}
    assert specs["0/mu/params/w"] == P("fsdp", "tensor")
    assert specs["0/nu/params/w"] == P("fsdp", "tensor")
    assert specs["0/count"] == P()


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
    tree = {"params": {"decoder": {"mlp": {"wi": {"kernel": nn.LogicallyPartitioned(
        jax.ShapeDtypeStruct((64, 3004), jnp.float32), ("embed", "mlp"))}}}}}
    mesh = pt.make_mesh({"tensor": 8})
    with pytest.raises(pt.ShardingError) as e:
        pt.tree_shardings(tree, mesh, "tp")
    assert str(e.value).startswith(
        "params/decoder/mlp/wi/kernel: dim 1 ('mlp', size 3004) is not divisible by mesh axes ('tensor',) of size 8"
    )
    with pytest.warns(pt.IndivisibleWarning, match="params/decoder/mlp/wi/kernel: dim 1"):
        specs = pt.tree_specs(tree, mesh, "tp", on_indivisible="replicate")
    assert specs["params"]["decoder"]["mlp"]["wi"]["kernel"] == P(None, None)


def test_per_device_bytes_match_real_shards():
    model = Dense(16)
    x = jnp.zeros((8, 32))
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    layouts = pt.tree_layouts(abstract, mesh, "fsdp_tp")
    params = jax.jit(model.init, out_shardings=pt.tree_shardings(abstract, mesh, "fsdp_tp"))(jax.random.key(0), x)
    [w] = jax.tree.leaves(pt.unbox(params))
    assert w.sharding.spec == P("fsdp", "tensor")
    assert pt.per_device_bytes(layouts) == w.addressable_shards[0].data.nbytes == 32 * 16 * 4 // 8


# -- activation constraints --------------------------------------------------------

def _constraint_specs(f, *args):
    text = jax.jit(f).lower(*args).as_text()
    return text.count("sharding_constraint") + text.count("mhlo.sharding")


def test_constraint_identity_outside_mesh_or_rules():
    x = jnp.ones((8, 4))
    assert pt.with_logical_constraint(x, ("batch", "embed")) is x
    with pt.axis_rules([("batch", "data")]):
        assert pt.with_logical_constraint(x, ("batch", "embed")) is x  # no mesh


def test_constraint_applies_on_cpu_with_auto_axes():
    mesh = pt.make_mesh({"data": 8})
    x = jnp.ones((8, 4))

    def f(a):
        return pt.with_logical_constraint(a * 2, ("batch", "embed"))

    with pt.sharding_context(mesh, "dp"):
        text = jax.jit(f).lower(x).as_text()
        out = jax.jit(f)(x)
    assert "sharding_constraint" in text
    assert out.sharding.spec == P("data", None) or out.sharding.is_equivalent_to(
        NamedSharding(mesh, P("data", None)), 2)


def test_constraint_reshards_on_explicit_axes():
    mesh = pt.make_mesh({"data": 8}, axis_types="explicit")
    with pt.sharding_context(mesh, "dp"):
        x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
        y = jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "embed")))(x)
        assert jax.typeof(y).sharding.spec == P("data", None)


def test_constraint_fallbacks():
    mesh = pt.make_mesh({"data": 8})
    with pt.sharding_context(mesh, [("batch", "data")]):
        text = jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "other"), fallback="unconstrained")).lower(
            jnp.ones((8, 4))).as_text()
        assert "unspecified_dims" in text or "?" in text
        with pytest.raises(pt.RuleError, match=r"activation dimension 1 has logical name 'other' but no rule mentions it"):
            jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "other"), fallback="error")).lower(jnp.ones((8, 4)))
        with pytest.raises(pt.RuleError, match="fallback must be one of"):
            pt.with_logical_constraint(jnp.ones((8, 4)), ("batch", "x"), fallback="nope")


def test_boxed_param_unbox_constrains_inside_apply():
    model = Dense(16)
    x = jnp.zeros((8, 32))
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    variables = model.init(jax.random.key(0), x)
    with pt.sharding_context(mesh, "fsdp_tp"):
        text = jax.jit(model.apply).lower(variables, x).as_text()
    assert "sharding_constraint" in text


# -- meshes -------------------------------------------------------------------------

def test_make_mesh_fills_minus_one_in_order():
    mesh = pt.make_mesh({"data": 2, "fsdp": -1, "tensor": 1})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    mesh = pt.make_mesh({"a": 4, "b": 2}, axis_types="explicit")
    assert all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


@pytest.mark.parametrize(
    "shape, msg",
    [
        ({"data": 3, "fsdp": 2}, r"mesh \{data: 3, fsdp: 2\} needs 6 devices, but there are 8"),
        ({"data": 3, "fsdp": -1}, r"the fixed axes need a multiple of 3 devices, but there are 8"),
        ({"data": -1, "fsdp": -1}, r"has more than one -1"),
        ({"data": 0}, r"mesh axis 'data': size must be a positive integer or -1, got 0"),
        ({}, r"mesh needs at least one axis"),
    ],
)
def test_mesh_errors(shape, msg):
    with pytest.raises(pt.MeshError, match=msg):
        pt.make_mesh(shape)


def test_sharding_context_sets_and_restores_both():
    mesh = pt.make_mesh({"data": 2, "fsdp": 4})
    assert jax.sharding.get_abstract_mesh().empty
    with pt.sharding_context(mesh, "fsdp") as (m, rules):
        assert m is mesh and rules == pt.Rules.preset("fsdp")
        assert dict(jax.sharding.get_abstract_mesh().shape) == {"data": 2, "fsdp": 4}
        assert pt.get_logical_axis_rules() == rules
    assert jax.sharding.get_abstract_mesh().empty
    assert pt.get_logical_axis_rules() == ()


def test_sharding_context_validates_rules_against_mesh():
    mesh = pt.make_mesh({"data": 8})
    with pytest.raises(pt.RuleError, match=r"mesh axis 'fsdp' is not a mesh axis \(data\)"):
        with pt.sharding_context(mesh, "fsdp"):
            pass
    assert pt.get_logical_axis_rules() == ()
