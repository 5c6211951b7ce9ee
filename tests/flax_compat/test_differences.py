"""Where the toolkit deliberately differs from Flax, pinned (docs/coming-from-flax.md lists the same cases).

Everything else in this folder is Flax's own tests run against the toolkit's names: those pass unchanged.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from flax.core import meta
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt

TABLE = (("embed", "fsdp"), ("mlp", "fsdp"), ("mlp", "tensor"))


@pytest.fixture(scope="module")
def mesh():
    return pt.make_mesh({"fsdp": 4, "tensor": 2})


def _nnx_spec(names):
    v = nnx.Param(jnp.zeros((8, 8)), out_sharding=names, eager_sharding=False)
    return nnx.get_partition_spec({"w": v})["w"].get_value()


def test_nnx_last_rule_wins_becomes_the_ordered_walk_inside_the_toolkit_context():
    shared = (("embed", "fsdp"), ("mlp", "fsdp"))  # two names wanting one axis
    fallback = (("mlp", "tensor"), ("mlp", "fsdp"))  # a name with a fallback rule
    # Plain Flax NNX: a dict, the last rule for a name wins, an axis can be handed out twice.
    with nnx.logical_axis_rules(shared):
        assert _nnx_spec(("embed", "mlp")) == P("fsdp", "fsdp")
    with nnx.logical_axis_rules(fallback):
        assert _nnx_spec(("mlp", "embed")) == P("fsdp", "embed")
    # Inside the toolkit's context: the ordered walk, the specs Linen gives for the same table.
    with pt.axis_rules(shared):
        assert _nnx_spec(("embed", "mlp")) == P("fsdp", None) == nn.logical_to_mesh_axes(("embed", "mlp"))
    with pt.axis_rules(fallback):
        assert _nnx_spec(("mlp", "embed")) == P("tensor", None) == nn.logical_to_mesh_axes(("mlp", "embed"))


def test_nnx_eager_sharding_uses_the_walk(mesh):
    # Plain Flax would hand 'fsdp' to both dimensions (and fail); the walk gives it to the first rule's.
    with jax.set_mesh(mesh), pt.axis_rules((("embed", "fsdp"), ("mlp", "fsdp"))):
        w = nnx.Param(jnp.zeros((8, 8)), out_sharding=("embed", "mlp"))
    assert w.get_value().sharding.is_equivalent_to(NamedSharding(mesh, P("fsdp", None)), 2)


def test_mesh_axis_names_resolve_under_a_mesh_after_the_rules(mesh):
    names = ("embed", "tensor")
    with jax.set_mesh(mesh):
        with nn.logical_axis_rules(TABLE):  # plain Flax: 'tensor' is an unknown logical name
            assert nn.logical_to_mesh_axes(names) == P("fsdp", None)
        with pt.axis_rules(TABLE):  # the toolkit: a name no rule mentions that is a free mesh axis is that axis
            assert nn.logical_to_mesh_axes(names) == pt.logical_to_mesh_axes(names) == P("fsdp", "tensor")
            # ...never taking an axis a rule assigned: wherever Flax assigns an axis, the toolkit agrees.
            assert pt.logical_to_mesh_axes(("fsdp", "embed")) == P(None, "fsdp")
    assert pt.logical_to_mesh_axes(names, TABLE) == P("fsdp", None)  # no mesh: exactly Flax


def test_unbox_never_constrains(mesh):
    tree = {"w": nn.LogicallyPartitioned(jnp.zeros((8, 8)), ("embed", "mlp"))}
    with jax.set_mesh(mesh), pt.axis_rules(TABLE):
        flax_text = jax.jit(lambda t: meta.unbox(t)).lower(tree).as_text()
        ours_text = jax.jit(lambda t: pt.unbox(t)).lower(tree).as_text()
    assert "sharding_constraint" in flax_text and "sharding_constraint" not in ours_text


def test_constraints_reshard_on_explicit_axes():
    mesh = pt.make_mesh({"data": 8}, axis_types="explicit")
    rules = (("batch", "data"),)
    with jax.set_mesh(mesh), pt.axis_rules(rules):
        x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
        # Flax's with_sharding_constraint only asserts on Explicit axes; the toolkit reshards.
        with pytest.raises(AssertionError, match="acts as an assert"):
            jax.jit(lambda a: nn.with_logical_constraint(a, ("batch", None), rules=rules))(x)
        y = jax.jit(lambda a: pt.with_logical_constraint(a, ("batch", None)))(x)
    assert jax.typeof(y).sharding.spec == P("data", None)


def test_toolkit_extras_beside_flax_fallbacks(mesh):
    with pt.sharding_context(mesh, TABLE):
        # 'unconstrained' leaves just the unassigned dimension to XLA (Flax has no such mode).
        text = jax.jit(lambda a: pt.with_logical_constraint(a, ("embed", "other"), fallback="unconstrained"))
        assert '<@mesh, [{"fsdp"}, {?}]>' in text.lower(jnp.ones((8, 4))).as_text()
    # on_indivisible: replicate (a toolkit option) skips a rule a size does not divide, with a warning.
    with pytest.warns(pt.IndivisibleWarning):
        spec = pt.Rules(TABLE).resolve(("mlp",), (6,), {"fsdp": 4, "tensor": 2}, on_indivisible="replicate")
    assert spec == P("tensor")
