"""The rule context (partitioning.context): one store shared with Flax, Flax's resolvers deferring to the
rule walk inside it, and the recorder plan uses."""

import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.context import recording
from partitioning.rules import Rules


def test_axis_rules_context_nests_and_mirrors_flax():
    assert pt.get_logical_axis_rules() == ()
    with pt.axis_rules([("embed", "fsdp")]):
        assert pt.logical_to_mesh_axes(("embed",)) == P("fsdp")
        assert nn.get_logical_axis_rules() == (("embed", "fsdp"),)
        with pt.axis_rules("tp"):
            assert pt.logical_to_mesh_axes(("mlp",)) == P("tensor")
        assert pt.logical_to_mesh_axes(("mlp",)) == P(None)
    assert pt.get_logical_axis_rules() == ()
    assert nn.get_logical_axis_rules() == ()


def test_flax_axis_rules_are_seen():
    with nn.logical_axis_rules((("embed", "fsdp"),)):
        assert pt.get_logical_axis_rules() == (("embed", "fsdp"),)


def test_rules_context_is_thread_local():
    barrier = threading.Barrier(8)
    results, errors = {}, []

    def worker(i):
        try:
            axis = f"axis{i}"
            with pt.axis_rules([("embed", axis)]):
                barrier.wait(timeout=10)  # every thread is inside its own context now
                for _ in range(200):
                    got = pt.logical_to_mesh_axes(("embed",))
                    if got != P(axis):
                        errors.append((i, got))
                results[i] = pt.logical_to_mesh_axes(("embed",))
        except Exception as e:  # pragma: no cover - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert results == {i: P(f"axis{i}") for i in range(8)}
    assert pt.get_logical_axis_rules() == ()


def test_set_logical_axis_rules():
    try:
        pt.set_logical_axis_rules([("embed", "fsdp")])
        assert pt.logical_to_mesh_axes(("embed",)) == P("fsdp")
        assert nn.get_logical_axis_rules() == (("embed", "fsdp"),)
    finally:
        pt.set_logical_axis_rules(None)
    assert pt.get_logical_axis_rules() == ()


def test_one_rule_store_shared_with_flax_nesting_in_any_order():
    a, b = pt.Rules.preset("fsdp"), (("embed", "tensor"),)
    with pt.axis_rules(a):
        assert nn.get_logical_axis_rules() is a and pt.get_logical_axis_rules() is a
        with nn.logical_axis_rules(b):
            # Flax's context inside ours: both see Flax's table.
            assert pt.get_logical_axis_rules() == Rules(b)
            assert pt.logical_to_mesh_axes(("embed", "mlp")) == P("tensor", None)
        assert pt.get_logical_axis_rules() is a
    with nn.logical_axis_rules(b):
        with pt.axis_rules(a):
            assert nn.get_logical_axis_rules() is a
            assert nn.logical_to_mesh_axes(("embed", "mlp")) == P("fsdp", None)
        assert pt.get_logical_axis_rules() == Rules(b)
    assert pt.get_logical_axis_rules() == Rules()


def test_rule_context_is_per_thread():
    seen = {}
    with pt.axis_rules("tp"):
        t = threading.Thread(target=lambda: seen.setdefault("other", pt.get_logical_axis_rules()))
        t.start()
        t.join()
        assert pt.get_logical_axis_rules() == Rules.preset("tp")
    assert seen["other"] == Rules()


def test_nnx_resolvers_use_the_walk_only_inside_the_toolkit_context():
    import flax.core.spmd as flax_spmd

    names = ("embed", "mlp")
    # A plain Flax table: Flax's own dict semantics, untouched (the last rule for a name wins).
    with nn.logical_axis_rules((("embed", "fsdp"), ("mlp", "fsdp"))):
        assert flax_spmd.apply_rules(P(*names), None) == P("fsdp", "fsdp")
    # A toolkit table: the ordered walk (fsdp is taken by embed, mlp falls through to unsharded).
    with pt.axis_rules([("embed", "fsdp"), ("mlp", "fsdp")]):
        assert flax_spmd.apply_rules(P(*names), None) == P("fsdp", None)
        assert flax_spmd.from_sharding_rules(names, flax_spmd.get_logical_axis_rules()) == ("fsdp", None)
    # A variable's own sharding_rules go first.
    with pt.axis_rules([("embed", "fsdp")]):
        assert flax_spmd.apply_rules(P(*names), (("mlp", "tensor"),)) == P("fsdp", "tensor")


def test_nnx_eager_sharding_agrees_with_the_layout_for_every_preset():
    class M(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Param(
                nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))(rngs.params(), (32, 64))
            )
            self.v = nnx.Param(jnp.zeros((64, 32)), out_sharding=("mlp", "embed"))

    meshes = {
        "dp": {"data": 8},
        "fsdp": {"data": 1, "fsdp": 8},
        "tp": {"data": 2, "tensor": 4},
        "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2},
        "seq": {"data": 1, "fsdp": 4, "tensor": 2},
    }
    for preset, shape in meshes.items():
        mesh = pt.make_mesh(shape)
        with pt.sharding_context(mesh, preset):
            m = M(nnx.Rngs(0))  # eager sharding on (Flax's default): under dp, fsdp, tp, seq this failed before
        layout = {leaf.path: leaf.spec for leaf in pt.tree_layouts(nnx.state(m), mesh, preset)}
        for name in ("w", "v"):
            arr = getattr(m, name).get_value()
            assert arr.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, layout[name]), 2), (preset, name)
    assert layout == {"w": P("fsdp", None), "v": P(None, "fsdp")}


def test_recording_sees_toolkit_and_flax_constraints():
    mesh = pt.make_mesh({"data": 1, "fsdp": 8})

    def f(x):
        x = pt.with_logical_constraint(x, ("batch", "embed"))
        return nn.with_logical_constraint(x, ("activation_batch", "activation_embed"))

    with recording() as seen, pt.sharding_context(mesh, "fsdp"):
        jax.eval_shape(f, jnp.zeros((8, 16)))
    assert seen == {("batch", "embed"), ("activation_batch", "activation_embed")}
    with recording() as outside:
        jax.eval_shape(f, jnp.zeros((8, 16)))
    assert outside == set()  # no rules, no mesh: nothing is constrained, nothing resolved


def test_flax_constraints_get_mesh_axis_names_inside_the_toolkit_context():
    mesh = pt.make_mesh({"data": 2, "tensor": 4})
    with pt.sharding_context(mesh, "tp"):
        text = jax.jit(lambda x: nn.with_logical_constraint(x, ("batch", "tensor"))).lower(jnp.zeros((8, 16))).as_text()
    assert '<@mesh, [{"data"}, {"tensor"}]>' in text
