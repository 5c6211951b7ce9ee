"""Restoring (partitioning.checkpoint.restore): the Trainer's state onto other meshes, rule tables and dtypes,
plain orbax checkpoints, and checkpoints that do not fit the model or the mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import partitioning as pt
from partitioning.checkpoint import abstract_target, restore_checkpoint, save_checkpoint
from partitioning.checkpoint.restore import checkpoint_metadata
from partitioning.models import GPT
from partitioning.train import TrainState

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# -- restore across layouts ----------------------------------------------------------------


@pytest.mark.parametrize(
    "src,dst",
    [
        (({"data": 1, "fsdp": 8}, "fsdp", None), ({"data": 1, "fsdp": 2, "tensor": 4}, "fsdp_tp", None)),
        (({"data": 8}, "dp", None), ({"data": 2, "tensor": 4}, "tp", None)),
        (({"data": 2, "tensor": 4}, "tp", None), ({"data": 8}, "dp", None)),
        (({"data": 1, "fsdp": 8}, "fsdp", None), ({"data": 1, "fsdp": 1}, "fsdp", 1)),
        (({"data": 1, "fsdp": 1}, "fsdp", 1), ({"data": 1, "fsdp": 2, "tensor": 4}, "fsdp_tp", None)),
    ],
    ids=["fsdp8-to-fsdp2xtp4", "dp-to-tp", "tp-to-dp", "8-to-1-device", "1-to-8-devices"],
)
def test_restore_onto_another_layout_bit_exact(gpt, tmp_path, src, dst, assert_bit_exact, mesh_of):
    (s_shape, s_rules, s_n), (d_shape, d_rules, d_n) = src, dst
    src_mesh, dst_mesh = mesh_of(s_shape, s_n), mesh_of(d_shape, d_n)
    state = gpt.state(src_mesh, s_rules)
    save_checkpoint(tmp_path, 7, state, rules=s_rules)
    target = gpt.target(dst_mesh, d_rules)
    back = restore_checkpoint(tmp_path, target)
    assert_bit_exact(back, state)
    want = gpt.trainer(dst_mesh, d_rules).state_shardings
    for got, w in zip(jax.tree.leaves(back), jax.tree.leaves(want), strict=True):
        assert got.sharding == w
        assert {d.id for d in got.sharding.device_set} == {d.id for d in dst_mesh.devices.flat}
    # The layout really changed where the rules differ.
    q_before = state.params["blocks"]["attn"]["q"].sharding.spec
    q_after = back.params["blocks"]["attn"]["q"].sharding.spec
    assert (q_before != q_after) or (dict(src_mesh.shape) != dict(dst_mesh.shape))


def test_params_only_restore_and_bf16(gpt, tmp_path, assert_bit_exact, mesh_of):
    m, rules = mesh_of({"data": 1, "fsdp": 8}), "fsdp"
    state = gpt.state(m, rules)
    save_checkpoint(tmp_path, 3, state)
    one = mesh_of({"data": 1, "fsdp": 1}, 1)
    params = restore_checkpoint(
        tmp_path, abstract_target(gpt.abstract.params, one, rules, dtype=jnp.bfloat16), params_only=True
    )
    assert set(params) == set(state.params)
    for got, src in zip(jax.tree.leaves(params), jax.tree.leaves(state.params), strict=True):
        assert got.dtype == jnp.bfloat16 and got.sharding.mesh.size == 1
        assert np.array_equal(np.asarray(got), np.asarray(src).astype(jnp.bfloat16))
    # The {"params": ...} form (what model.apply takes) works too.
    variables = restore_checkpoint(
        tmp_path, {"params": abstract_target(gpt.abstract.params, m, rules)}, params_only=True
    )
    assert_bit_exact(variables["params"], state.params)


def test_dtype_change_whole_state_keeps_integers(gpt, tmp_path, mesh_of):
    m = mesh_of({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    save_checkpoint(tmp_path, 7, state)
    back = restore_checkpoint(tmp_path, gpt.target(m, "fsdp", dtype=jnp.bfloat16))
    assert isinstance(back, TrainState)
    assert back.step.dtype == jnp.int32 and int(back.step) == 7
    counts = [x for x in jax.tree.leaves(back.opt_state) if x.shape == ()]
    assert counts and all(c.dtype == jnp.int32 for c in counts)
    assert back.params["embedding"].dtype == jnp.bfloat16 and back.opt_state[0].mu["embedding"].dtype == jnp.bfloat16


# -- interoperability with plain orbax -------------------------------------------------------


def test_plain_orbax_checkpoint_restores_through_toolkit(gpt, tmp_path, assert_bit_exact, mesh_of):
    m = mesh_of({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    with ocp.StandardCheckpointer() as ck:
        ck.save(tmp_path / "plain", state)
    with ocp.CheckpointManager(tmp_path / "mngr") as mngr:  # single unnamed item
        mngr.save(3, args=ocp.args.StandardSave(state))
    target = gpt.target(mesh_of({"data": 1, "fsdp": 2, "tensor": 4}), "fsdp_tp")
    assert_bit_exact(restore_checkpoint(tmp_path / "plain", target), state)
    assert_bit_exact(restore_checkpoint(tmp_path / "mngr", target), state)
    assert checkpoint_metadata(tmp_path / "plain") == {"step": None, "path": str(tmp_path / "plain")}


# -- checkpoints that do not fit -----------------------------------------------------------


def test_changed_model_lists_differing_paths(saved_copy, ckpt_setup, mesh_of):
    s, ck = saved_copy
    other = ckpt_setup(GPT(vocab_size=64, embed=32, heads=4, mlp=128, layers=2))
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, other.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    msg = str(e.value)
    assert msg.startswith(
        f"checkpoint {ck} does not fit the model (9 of 38 arrays differ): "
        "params/blocks/mlp/wi_0: checkpoint (2, 32, 64) vs model (2, 32, 128); "
        "params/blocks/mlp/wi_1: checkpoint (2, 32, 64) vs model (2, 32, 128); "
        "params/blocks/mlp/wo: checkpoint (2, 64, 32) vs model (2, 128, 32); "
    )
    assert msg.endswith("; … and 4 more")
    renamed = ckpt_setup(GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2, norm="layer"))
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, renamed.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    assert "params/blocks/attn_norm/bias: not in the checkpoint (model (2, 32))" in str(e.value)


def test_indivisible_on_restore_is_the_init_error(saved_copy, mesh_of):
    s, ck = saved_copy
    bad_mesh = mesh_of({"data": 1, "tensor": 8})
    # Through the Python API (mesh + rules) ...
    with pytest.raises(pt.ShardingError) as at_init:
        pt.tree_shardings(s.abstract, bad_mesh, "tp")
    with pytest.raises(pt.ShardingError) as at_restore:
        restore_checkpoint(ck, abstract_target(s.abstract, bad_mesh, "tp"))
    assert str(at_restore.value) == str(at_init.value)
    # Every array that fails, k and v together, each with the rule that asked for the split
    assert str(at_init.value) == (
        "params/blocks/attn/k, params/blocks/attn/v: dim 2 ('kv_heads', size 4) is not divisible by mesh axes "
        "('tensor',) of size 8 (presets/tp.yaml:13: rules[2]); params/blocks/attn/o: dim 1 ('heads', size 4) is not "
        "divisible by mesh axes ('tensor',) of size 8 (presets/tp.yaml:12: rules[1]); params/blocks/attn/q: dim 2 "
        "('heads', size 4) is not divisible by mesh axes ('tensor',) of size 8 (presets/tp.yaml:12: rules[1]); "
        "change the rule or the size, or set on_indivisible: replicate"
    )
    # ... and through a Trainer, whose construction is the init's layout step.
    with pytest.raises(pt.ShardingError) as at_trainer:
        s.trainer(bad_mesh, "tp")
    assert str(at_trainer.value) == str(at_init.value)
