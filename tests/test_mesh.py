"""Meshes (partitioning.mesh): make_mesh sizes and errors, sharding_context."""

import jax
import pytest

import partitioning as pt


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
    with (
        pytest.raises(pt.RuleError, match=r"mesh axis 'fsdp' is not a mesh axis \(data\)"),
        pt.sharding_context(mesh, "fsdp"),
    ):
        pass
    assert pt.get_logical_axis_rules() == ()


def test_too_few_devices_on_the_cpu_says_how_to_simulate_them():
    with pytest.raises(pt.MeshError) as e:
        pt.make_mesh({"data": 16})  # the tests simulate 8
    assert str(e.value) == (
        "mesh {data: 16} needs 16 devices, but there are 8; change a size or use -1 for one axis (on a CPU, simulate "
        "devices: call partitioning.simulate_devices(16) before any JAX computation, or set "
        "XLA_FLAGS=--xla_force_host_platform_device_count=16 before starting Python)"
    )
    with pytest.raises(pt.MeshError) as e:  # devices given: the caller chose them, no hint
        pt.make_mesh({"data": 16}, devices=jax.devices()[:8])
    assert "simulate" not in str(e.value)
