"""Boxes (partitioning.boxes): logical names through Flax transforms and optax, and activation constraints."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.boxes import LogicallyPartitioned


class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        def body(mdl, c, _):
            return nn.Dense(
                c.shape[-1],
                use_bias=False,
                kernel_init=pt.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
            )(c), None

        scan = nn.scan(
            body,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=3,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        return scan(self, x, None)[0]


def test_box_names_and_shape_check():
    init = pt.with_logical_partitioning(nn.initializers.zeros_init(), ("embed", "mlp"))
    box = init(jax.random.key(0), (4, 8))
    assert isinstance(box, LogicallyPartitioned) and isinstance(box, nn.LogicallyPartitioned)
    assert box.names == ("embed", "mlp")
    # An initializer may be called with a flattened shape (DenseGeneral reshapes the box's value
    # afterwards), so the names are checked when the parameter is laid out, by its path.
    short = init(jax.random.key(0), (4,))
    assert short.names == ("embed", "mlp")
    with pytest.raises(
        pt.ShardingError,
        match=r"^params/w: 2 logical names \('embed', 'mlp'\) for an array of rank 1 "
        r"\(shape \(4,\)\); give at most one name per dimension$",
    ):
        pt.tree_layouts({"params": {"w": short}}, {"fsdp": 4}, "fsdp")


def test_scan_inserts_layers_axis_and_get_partition_spec_reads_it():
    abstract = jax.eval_shape(Scanned().init, jax.random.key(0), jnp.zeros((2, 16)))
    [(path, box)] = jax.tree_util.tree_flatten_with_path(abstract, is_leaf=pt.boxes.is_box)[0]
    assert jax.tree_util.keystr(path) == "['params']['Dense_0']['kernel']"
    assert box.names == ("layers", "embed", "mlp")
    specs = nn.get_partition_spec(abstract)
    assert jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)) == [P("layers", "embed", "mlp")]
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    [layout] = pt.tree_layouts(abstract, mesh, "fsdp_tp")
    assert layout.spec == P(None, "fsdp", "tensor") and layout.shape == (3, 16, 16)


def test_vmap_inserts_axis(dense_module):
    vm = nn.vmap(
        dense_module,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=0,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    abstract = jax.eval_shape(vm(8).init, jax.random.key(0), jnp.zeros((2, 3, 4)))
    [box] = jax.tree.leaves(abstract, is_leaf=pt.boxes.is_box)
    assert box.names == ("layers", "embed", "mlp") and box.value.shape == (2, 4, 8)


def test_optax_state_carries_param_names(dense_module):
    params = jax.eval_shape(dense_module(8).init, jax.random.key(0), jnp.zeros((2, 4)))
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    mesh = pt.make_mesh({"fsdp": 4, "tensor": 2})
    specs = {leaf.path: leaf.spec for leaf in pt.tree_layouts(opt, mesh, "fsdp_tp")}
    assert specs["0/mu/params/w"] == P("fsdp", "tensor")
    assert specs["0/nu/params/w"] == P("fsdp", "tensor")
    assert specs["0/count"] == P()


# -- activation constraints --------------------------------------------------------


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
        NamedSharding(mesh, P("data", None)), 2
    )


def test_constraint_reshards_on_explicit_axes():
    mesh = pt.make_mesh({"data": 8}, axis_types="explicit")
    with pt.sharding_context(mesh, "dp"):
        x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
        y = jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "embed")))(x)
        assert jax.typeof(y).sharding.spec == P("data", None)


def test_constraint_fallbacks():
    mesh = pt.make_mesh({"data": 8})
    with pt.sharding_context(mesh, [("batch", "data")]):
        text = (
            jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "other"), fallback="unconstrained"))
            .lower(jnp.ones((8, 4)))
            .as_text()
        )
        # dim 1 is left open to the compiler ({?}); the default fallback pins it unsharded ({}).
        assert '<@mesh, [{"data"}, {?}]>' in text
        text = jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "other"))).lower(jnp.ones((8, 4))).as_text()
        assert '<@mesh, [{"data"}, {}]>' in text
        with pytest.raises(
            pt.RuleError, match=r"activation dimension 1 has logical name 'other' but no rule mentions it"
        ):
            jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", "other"), fallback="error")).lower(
                jnp.ones((8, 4))
            )
        with pytest.raises(pt.RuleError, match="fallback must be one of"):
            pt.with_logical_constraint(jnp.ones((8, 4)), ("batch", "x"), fallback="nope")


def test_boxed_param_unbox_constrains_inside_apply(dense_module):
    model = dense_module(16)
    x = jnp.zeros((8, 32))
    mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    variables = model.init(jax.random.key(0), x)
    with pt.sharding_context(mesh, "fsdp_tp"):
        text = jax.jit(model.apply).lower(variables, x).as_text()
    assert "sharding_constraint" in text


# -- Flax's signatures and fallbacks -----------------------------------------------


def test_flax_signatures_positional_mesh_and_rules():
    mesh = pt.make_mesh({"data": 2, "model": 4})
    rules = (("a", "data"), ("b", "model"))
    init = pt.with_logical_partitioning(nn.initializers.ones_init(), ("a", "b"), mesh, rules)
    box = init(jax.random.key(0), (4, 8))
    assert box.mesh is mesh and box.rules == rules
    text = jax.jit(lambda: box.unbox()).lower().as_text()  # the box's own mesh and rules, no context needed
    assert '<@mesh, [{"data"}, {"model"}]>' in text
    x = jnp.ones((4, 8))
    text = jax.jit(lambda a: pt.with_logical_constraint(a, ("a", "b"), rules, mesh)).lower(x).as_text()
    assert '<@mesh, [{"data"}, {"model"}]>' in text


def test_rules_fallback_exactly_as_flax():
    rf = nn.spmd.RulesFallback
    x = jnp.ones((8, 4))
    rules = [("batch", "data")]
    # RAISE_ERROR: a ValueError on an unmatched name, with or without a mesh (Flax resolves before looking for one).
    with pt.axis_rules(rules):
        for fallback in (rf.RAISE_ERROR, pt.RulesFallback.RAISE_ERROR):
            with pytest.raises(ValueError, match="activation dimension 1 has logical name 'other'"):
                pt.with_logical_constraint(x, ("batch", "other"), fallback=fallback)
    mesh = pt.make_mesh({"data": 8})

    def lower(names, fb):
        return jax.jit(lambda a: pt.with_logical_constraint(a, names, fallback=fb)).lower(x)

    with pt.sharding_context(mesh, rules):
        # NO_CONSTRAINT: x is left alone when any name is unassigned...
        assert "sharding_constraint" not in lower(("batch", "other"), rf.NO_CONSTRAINT).as_text()
        # ...and constrained as usual when every name is assigned.
        assert '<@mesh, [{"data"}, {}]>' in lower(("batch", None), rf.NO_CONSTRAINT).as_text()
        assert '<@mesh, [{"data"}, {}]>' in lower(("batch", "other"), rf.AXIS_IS_UNSHARDED).as_text()
    # Two names wanting one axis: the second is unassigned, as in Flax.
    with pt.sharding_context(mesh, [("batch", "data"), ("embed", "data")]):
        assert '<@mesh, [{"data"}, {}]>' in lower(("batch", "embed"), rf.AXIS_IS_UNSHARDED).as_text()
        assert "sharding_constraint" not in lower(("batch", "embed"), rf.NO_CONSTRAINT).as_text()
        with pytest.raises(ValueError, match="every rule for it wants a mesh axis another dimension already uses"):
            lower(("batch", "embed"), rf.RAISE_ERROR)


def test_unconstrained_as_a_rules_mesh_axes():
    u = P.UNCONSTRAINED
    rules = pt.Rules([("foo", None), ("bar", u), ("bar", "data")])
    assert rules.resolve(("foo", "bar")) == P(None, u)
    assert pt.logical_to_mesh_axes(("foo", "bar"), rules) == nn.logical_to_mesh_axes(("foo", "bar"), rules)
    mesh = pt.make_mesh({"data": 8})
    with pt.sharding_context(mesh, rules):
        text = jax.jit(lambda a: pt.with_logical_constraint(a, ("bar", "foo"))).lower(jnp.ones((8, 4))).as_text()
    assert "<@mesh, [{?}, {}]>" in text
