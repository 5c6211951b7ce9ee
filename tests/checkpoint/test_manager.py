"""Saving (partitioning.checkpoint.manager): CheckpointManager and save_checkpoint, metadata, async saves
under donation, the keep policy, and a format plain orbax reads."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.checkpoint import CheckpointManager, checkpoint_metadata, restore_checkpoint, save_checkpoint
from partitioning.checkpoint.disk import list_steps
from partitioning.checkpoint.restore import target_like
from partitioning.models import MLP

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_save_restore_same_layout_and_metadata(gpt, tmp_path, assert_bit_exact, mesh_of):
    m, rules = mesh_of({"data": 1, "fsdp": 8}), pt.Rules.preset("fsdp")
    state = gpt.state(m, rules)
    with CheckpointManager(
        tmp_path, rules=rules, abstract=gpt.abstract, model_name="gpt", config={"model": {"name": "gpt"}}
    ) as mngr:
        assert mngr.save(7, state, force=True)
        assert not mngr.save(7, state, force=True)  # already saved: skipped
    assert [s.step for s in list_steps(tmp_path)] == [7]
    back = restore_checkpoint(tmp_path, gpt.target(m, rules))
    assert_bit_exact(back, state)
    assert jax.tree.leaves(jax.tree.map(lambda a, b: a.sharding == b.sharding, back, state)) == [True] * len(
        jax.tree.leaves(state)
    )
    meta = checkpoint_metadata(tmp_path)
    assert meta["step"] == 7 and meta["model"] == "gpt" and meta["config"] == {"model": {"name": "gpt"}}
    assert meta["rules"][:2] == [["batch", ["data", "fsdp"]], ["embed", "fsdp"]]
    assert meta["mesh"] == {
        "axis_names": ["data", "fsdp"],
        "shape": [1, 8],
        "axis_types": ["Auto", "Auto"],
        "devices": 8,
    }
    assert meta["versions"]["jax"] == jax.__version__ and "orbax-checkpoint" in meta["versions"]
    q = meta["arrays"]["params/blocks/attn/q"]
    assert q == {
        "shape": [2, 32, 4, 8],
        "dtype": "float32",
        "spec": [None, "fsdp", None, None],
        "names": ["layers", "embed", "heads", "kv"],
    }
    assert meta["arrays"]["opt_state/0/mu/embedding"]["names"] == ["vocab", "embed"]
    assert meta["arrays"]["step"] == {"shape": [], "dtype": "int32", "spec": []}


def test_async_save_survives_a_donating_step(tmp_path, mesh_of):
    """The next train step donates the state while the write is still in flight."""
    m = mesh_of({"data": 1, "fsdp": 8})
    sh = NamedSharding(m, P("fsdp"))
    host = {f"w{i}": np.random.default_rng(i).standard_normal((1024, 1024), dtype=np.float32) for i in range(4)}
    state = {k: jax.device_put(v, sh) for k, v in host.items()}
    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 0 - 1, s), donate_argnums=0)
    with CheckpointManager(tmp_path, async_=True) as mngr:
        mngr.save(1, state, force=True)
        new = step(state)
        jax.block_until_ready(new)
    back = restore_checkpoint(tmp_path, target_like(new))
    for k, v in host.items():
        assert np.array_equal(np.asarray(back[k]), v)
        assert np.all(np.asarray(new[k]) == -1)


def test_async_save_survives_donation_of_the_state(gpt, tmp_path, gathered, mesh_of):
    m = mesh_of({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    expected = gathered(state)
    mngr = CheckpointManager(tmp_path, every=5)
    assert not mngr.save(3, state)  # not due
    assert mngr.save(5, state)
    for x in jax.tree.leaves(state):  # what train_step's donation does
        x.delete()
    mngr.close()
    back = restore_checkpoint(tmp_path, gpt.target(m, "fsdp"))
    for a, b in zip(gathered(back), expected, strict=True):
        assert np.array_equal(a, b)


# -- keep policy, listing ------------------------------------------------------------------


def test_keep_last_n_and_best(tmp_path, ckpt_setup, mesh_of):
    s = ckpt_setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    m = mesh_of({"data": 1, "fsdp": 8})
    state = s.state(m, "fsdp")
    losses = {2: 3.0, 4: 1.0, 6: 2.0, 8: None, 10: 2.5, 12: None}
    with CheckpointManager(tmp_path, every=2, keep=2, keep_best=True) as mngr:
        for step, loss in losses.items():
            mngr.save(step, state, metrics=None if loss is None else {"eval_loss": loss, "loss": 9.0})
        mngr.wait()
        assert mngr.best_step() == 4
    assert [i.step for i in list_steps(tmp_path)] == [4, 10, 12]
    assert checkpoint_metadata(tmp_path, step=4)["metrics"] == {"eval_loss": 1.0, "loss": 9.0}
    with CheckpointManager(tmp_path, every=2, keep=1) as mngr:
        mngr.save(14, state)
    # Without keep_best step 4 stays all the same: the newest eval_loss (2.5 at step 10) is more than 1.5x
    # its 1.0, so the run is diverging and its healthiest step is never pruned (checkpoint/keep.py).
    assert [i.step for i in list_steps(tmp_path)] == [4, 14]


# -- interoperability with plain orbax -------------------------------------------------------


def test_plain_orbax_reads_toolkit_checkpoints(gpt, tmp_path, assert_bit_exact, mesh_of):
    m = mesh_of({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    save_checkpoint(tmp_path, 7, state, rules="fsdp")
    target = target_like(state)
    with ocp.StandardCheckpointer() as ck:  # the documented item path
        assert_bit_exact(ck.restore(tmp_path / "7" / "state", target), state)
    with ocp.CheckpointManager(tmp_path) as mngr:
        out = mngr.restore(
            7, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
    assert_bit_exact(out["state"], state)
    assert out["meta"]["step"] == 7 and out["meta"]["state_item"] == "state"
