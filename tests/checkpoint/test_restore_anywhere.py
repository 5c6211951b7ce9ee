"""Restores a Python user makes without the Trainer: an explicit save, a plain pytree onto a new mesh in one call,
an NNX state as the target, and no orbax chatter from the toolkit's restores."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.checkpoint import CheckpointManager
from partitioning.checkpoint.disk import list_steps
from tests.byom.models.nnx_mesh_axes import DotReluDot


@pytest.fixture(scope="module")
def plain(tmp_path_factory, mesh_of):
    """A plain pytree sharded on {fsdp: 8}, saved with pt.save_checkpoint (no logical names) -> (dir, host values)."""
    m = mesh_of({"fsdp": 8})
    host = {"w": np.arange(64 * 32, dtype=np.float32).reshape(64, 32), "b": np.arange(32, dtype=np.float32)}
    state = {"w": jax.device_put(host["w"], NamedSharding(m, P("fsdp", None))), "b": jax.device_put(host["b"])}
    d = tmp_path_factory.mktemp("plain")
    pt.save_checkpoint(d, 1, state)
    return d, host


def test_an_explicit_save_saves_without_a_schedule(plain, tmp_path):
    _, host = plain
    with CheckpointManager(tmp_path) as mngr:  # every=0: no schedule, so save() means save
        assert mngr.save(4, {"b": jnp.asarray(host["b"])})
        assert not mngr.save(4, {"b": jnp.asarray(host["b"])})  # already there
    assert [s.step for s in list_steps(tmp_path)] == [4]


def test_a_plain_pytree_onto_a_new_mesh_in_one_call(plain, mesh_of):
    d, host = plain
    # Arrays without names keep the spec they were saved with, on the axes the new mesh has.
    m = mesh_of({"fsdp": 2, "tensor": 4})
    back = pt.restore_checkpoint(d, mesh=m)
    assert back["w"].sharding == NamedSharding(m, P("fsdp", None)) and back["b"].sharding.spec == P()
    assert np.array_equal(np.asarray(back["w"]), host["w"]) and np.array_equal(np.asarray(back["b"]), host["b"])
    # A mesh without that axis: replicated there.
    dp = mesh_of({"data": 8})
    assert pt.restore_checkpoint(d, mesh=dp)["w"].sharding.spec == P(None, None)
    # Or say where each array goes: a pytree of shardings (shapes and dtypes are the saved ones).
    want = {"w": NamedSharding(m, P(None, "tensor")), "b": NamedSharding(m, P("tensor"))}
    back = pt.restore_checkpoint(d, want)
    assert back["w"].sharding == want["w"] and back["b"].sharding == want["b"]
    assert np.array_equal(np.asarray(back["w"]), host["w"])


def test_recorded_names_follow_the_new_rules(tmp_path, mesh_of):
    m = mesh_of({"fsdp": 8})
    w = jax.device_put(jnp.ones((64, 32)), NamedSharding(m, P("fsdp", None)))
    pt.save_checkpoint(tmp_path, 2, {"params": {"w": w}}, names={"params/w": ["embed", "mlp"]})
    tp = mesh_of({"data": 2, "tensor": 4})
    back = pt.restore_checkpoint(tmp_path, mesh=tp, rules="tp")
    assert back["params"]["w"].sharding.spec == P(None, "tensor")
    params = pt.restore_checkpoint(tmp_path, mesh=tp, rules="tp", params_only=True)
    assert set(params) == {"w"} and params["w"].sharding.spec == P(None, "tensor")
    with pytest.raises(TypeError, match="needs a target, or a mesh"):
        pt.restore_checkpoint(tmp_path)


def test_an_nnx_state_is_a_target(tmp_path, mesh_of):
    mesh, rules = mesh_of({"fsdp": 4, "tensor": 2}, 8), [("batch", "fsdp")]
    batch = {"inputs": jnp.ones((8, 16)), "targets": jnp.zeros((8, 16))}
    trainer = pt.Trainer(
        pt.NNXModel(lambda rngs: DotReluDot(16, rngs=rngs)),
        optax.sgd(0.1),
        mesh,
        rules,
        batch=batch,
        task=lambda y, b: jnp.mean((y - b["targets"]) ** 2),
    )
    state = trainer.init(jax.random.key(0))
    pt.save_checkpoint(tmp_path, 1, state)
    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: DotReluDot(16, rngs=nnx.Rngs(1)))
    target = pt.abstract_target(nnx.state(model, nnx.Param), mesh, rules)
    params = pt.restore_checkpoint(tmp_path, target, params_only=True)
    assert isinstance(params, nnx.State) and isinstance(params["dot1"]["kernel"], nnx.Param)
    kernel = params["dot1"]["kernel"].get_value()
    assert kernel.sharding.spec == P("fsdp", "tensor")
    assert np.array_equal(np.asarray(kernel), np.asarray(state.params["dot1"]["kernel"]))
    nnx.update(model, params)
    assert np.array_equal(np.asarray(model.w2[...]), np.asarray(state.params["w2"]))


def test_restores_are_quiet_but_orbax_elsewhere_still_speaks(plain, caplog):
    d, _ = plain
    caplog.set_level(logging.WARNING, logger="absl")  # an in-process CLI run may have raised it
    pt.restore_checkpoint(d, mesh=jax.make_mesh((8,), ("fsdp",)))
    assert not [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
    ocp.PyTreeCheckpointer().metadata((d / "1" / "state").absolute())  # the user's own orbax call
    assert [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
