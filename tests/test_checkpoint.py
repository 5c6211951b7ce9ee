"""Sharded checkpoints of the Trainer's state: save/restore across meshes and rule tables,
metadata, interop with plain orbax, damaged files, the loop hook and a resumed run."""

import json
import os
import shutil
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import partitioning as pt
from partitioning.boxes import is_box
from partitioning.checkpoint import (
    CheckpointHook, CheckpointManager, abstract_target, checkpoint_metadata, restore_checkpoint, save_checkpoint,
)
from partitioning.checkpoint.restore import target_like
from partitioning.checkpoint.disk import list_steps, resolve_checkpoint
from partitioning.checkpoint.diagnose import verify
from partitioning.train.loop import fit
from partitioning.train import TrainState, Trainer
from partitioning.models import GPT, MLP

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _strip(tree):
    return jax.tree.map(lambda v: v.value if is_box(v) else v, tree, is_leaf=is_box)


class Setup:
    """The real Trainer's TrainState layout for a model, on any mesh and rules.

    ``state`` fills it with random values placed directly in their shards
    (no compile, so the many layouts below stay fast); ``target`` is what a
    resuming run restores into.
    """

    def __init__(self, model=None, tx=None):
        self.model = model or GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2)
        self.tx = tx or optax.adamw(1e-3)
        self.abstract = self.trainer(mesh({"data": 1, "fsdp": 1}, 1), "fsdp").abstract_state

    def trainer(self, m, rules, **kw):
        return Trainer(self.model, self.tx, m, rules, batch_size=8, seq_len=8, **kw)

    def state(self, m, rules, seed=0, step=7):
        tr = self.trainer(m, rules)
        rng = np.random.default_rng(seed)

        def value(a, s):
            if a.shape == ():  # the step and optax counts
                return jax.device_put(np.asarray(step, a.dtype), s)
            return jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), s)

        return jax.tree.map(value, _strip(tr.abstract_state), tr.state_shardings)

    def target(self, m, rules, **kw):
        tr = self.trainer(m, rules)
        return abstract_target(tr.abstract_state, shardings=tr.state_shardings, **kw)


def mesh(shape, n=None):
    return pt.make_mesh(shape, devices=jax.devices()[:n] if n else None)


def gathered(tree):
    """Host copies of every leaf (tests only: never gather a real state)."""
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_bit_exact(a, b):
    la, lb = gathered(a), gathered(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.fixture(scope="module")
def gpt():
    return Setup()


# -- save / restore across layouts ----------------------------------------------------

def test_save_restore_same_layout_and_metadata(gpt, tmp_path):
    m, rules = mesh({"data": 1, "fsdp": 8}), pt.Rules.preset("fsdp")
    state = gpt.state(m, rules)
    with CheckpointManager(tmp_path, rules=rules, abstract=gpt.abstract, model_name="gpt",
                           config={"model": {"name": "gpt"}}) as mngr:
        assert mngr.save(7, state, force=True)
        assert not mngr.save(7, state, force=True)      # already saved: skipped
    assert [s.step for s in list_steps(tmp_path)] == [7]
    back = restore_checkpoint(tmp_path, gpt.target(m, rules))
    assert_bit_exact(back, state)
    assert jax.tree.leaves(jax.tree.map(lambda a, b: a.sharding == b.sharding, back, state)) == [True] * len(jax.tree.leaves(state))
    meta = checkpoint_metadata(tmp_path)
    assert meta["step"] == 7 and meta["model"] == "gpt" and meta["config"] == {"model": {"name": "gpt"}}
    assert meta["rules"][:2] == [["batch", ["data", "fsdp"]], ["embed", "fsdp"]]
    assert meta["mesh"] == {"axis_names": ["data", "fsdp"], "shape": [1, 8], "axis_types": ["Auto", "Auto"], "devices": 8}
    assert meta["versions"]["jax"] == jax.__version__ and "orbax-checkpoint" in meta["versions"]
    q = meta["arrays"]["params/blocks/attn/q"]
    assert q == {"shape": [2, 32, 4, 8], "dtype": "float32", "spec": [None, "fsdp", None, None],
                 "names": ["layers", "embed", "heads", "kv"]}
    assert meta["arrays"]["opt_state/0/mu/embedding"]["names"] == ["vocab", "embed"]
    assert meta["arrays"]["step"] == {"shape": [], "dtype": "int32", "spec": []}


@pytest.mark.parametrize("src,dst", [
    (({"data": 1, "fsdp": 8}, "fsdp", None), ({"data": 1, "fsdp": 2, "tensor": 4}, "fsdp_tp", None)),
    (({"data": 8}, "dp", None), ({"data": 2, "tensor": 4}, "tp", None)),
    (({"data": 2, "tensor": 4}, "tp", None), ({"data": 8}, "dp", None)),
    (({"data": 1, "fsdp": 8}, "fsdp", None), ({"data": 1, "fsdp": 1}, "fsdp", 1)),
    (({"data": 1, "fsdp": 1}, "fsdp", 1), ({"data": 1, "fsdp": 2, "tensor": 4}, "fsdp_tp", None)),
], ids=["fsdp8-to-fsdp2xtp4", "dp-to-tp", "tp-to-dp", "8-to-1-device", "1-to-8-devices"])
def test_restore_onto_another_layout_bit_exact(gpt, tmp_path, src, dst):
    (s_shape, s_rules, s_n), (d_shape, d_rules, d_n) = src, dst
    src_mesh, dst_mesh = mesh(s_shape, s_n), mesh(d_shape, d_n)
    state = gpt.state(src_mesh, s_rules)
    save_checkpoint(tmp_path, 7, state, rules=s_rules)
    target = gpt.target(dst_mesh, d_rules)
    back = restore_checkpoint(tmp_path, target)
    assert_bit_exact(back, state)
    want = gpt.trainer(dst_mesh, d_rules).state_shardings
    for got, w in zip(jax.tree.leaves(back), jax.tree.leaves(want)):
        assert got.sharding == w
        assert {d.id for d in got.sharding.device_set} == {d.id for d in dst_mesh.devices.flat}
    # The layout really changed where the rules differ.
    q_before = state.params["blocks"]["attn"]["q"].sharding.spec
    q_after = back.params["blocks"]["attn"]["q"].sharding.spec
    assert (q_before != q_after) or (dict(src_mesh.shape) != dict(dst_mesh.shape))


def test_params_only_restore_and_bf16(gpt, tmp_path):
    m, rules = mesh({"data": 1, "fsdp": 8}), "fsdp"
    state = gpt.state(m, rules)
    save_checkpoint(tmp_path, 3, state)
    one = mesh({"data": 1, "fsdp": 1}, 1)
    params = restore_checkpoint(tmp_path, abstract_target(gpt.abstract.params, one, rules, dtype=jnp.bfloat16), params_only=True)
    assert set(params) == set(state.params)
    for got, src in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
        assert got.dtype == jnp.bfloat16 and got.sharding.mesh.size == 1
        assert np.array_equal(np.asarray(got), np.asarray(src).astype(jnp.bfloat16))
    # The {"params": ...} form (what model.apply takes) works too.
    variables = restore_checkpoint(tmp_path, {"params": abstract_target(gpt.abstract.params, m, rules)}, params_only=True)
    assert_bit_exact(variables["params"], state.params)


def test_dtype_change_whole_state_keeps_integers(gpt, tmp_path):
    m = mesh({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    save_checkpoint(tmp_path, 7, state)
    back = restore_checkpoint(tmp_path, gpt.target(m, "fsdp", dtype=jnp.bfloat16))
    assert isinstance(back, TrainState)
    assert back.step.dtype == jnp.int32 and int(back.step) == 7
    counts = [x for x in jax.tree.leaves(back.opt_state) if x.shape == ()]
    assert counts and all(c.dtype == jnp.int32 for c in counts)
    assert back.params["embedding"].dtype == jnp.bfloat16 and back.opt_state[0].mu["embedding"].dtype == jnp.bfloat16


def test_async_save_survives_a_donating_step(tmp_path):
    """The next train step donates the state while the write is still in flight."""
    m = mesh({"data": 1, "fsdp": 8})
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


def test_async_save_survives_donation_of_the_state(gpt, tmp_path):
    m = mesh({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    expected = gathered(state)
    mngr = CheckpointManager(tmp_path, every=5)
    assert not mngr.save(3, state)                  # not due
    assert mngr.save(5, state)
    for x in jax.tree.leaves(state):                # what train_step's donation does
        x.delete()
    mngr.close()
    back = restore_checkpoint(tmp_path, gpt.target(m, "fsdp"))
    for a, b in zip(gathered(back), expected):
        assert np.array_equal(a, b)


# -- keep policy, listing ------------------------------------------------------------------

def test_keep_last_n_and_best(tmp_path):
    s = Setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    m = mesh({"data": 1, "fsdp": 8})
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
    assert [i.step for i in list_steps(tmp_path)] == [14]


def test_resolve_errors(tmp_path):
    with pytest.raises(pt.CheckpointError, match=r"no such checkpoint"):
        resolve_checkpoint(tmp_path / "nope")
    (tmp_path / "5.orbax-checkpoint-tmp-123").mkdir()
    with pytest.raises(pt.CheckpointError) as e:
        resolve_checkpoint(tmp_path)
    assert str(e.value) == f"{tmp_path}: no complete checkpoint (unfinished saves: 5.orbax-checkpoint-tmp-123)"
    s = Setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    save_checkpoint(tmp_path, 4, s.state(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    assert resolve_checkpoint(tmp_path).step == 4
    with pytest.raises(pt.CheckpointError) as e:
        resolve_checkpoint(tmp_path, step=9)
    assert str(e.value) == f"{tmp_path}: no complete checkpoint for step 9 (steps: 4)"
    # A run dir holding checkpoints/ resolves too.
    run = tmp_path / "run"
    shutil.copytree(tmp_path / "4", run / "checkpoints" / "4")
    assert resolve_checkpoint(run).path == run / "checkpoints" / "4"


# -- interoperability with plain orbax -------------------------------------------------------

def test_plain_orbax_checkpoint_restores_through_toolkit(gpt, tmp_path):
    m = mesh({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    with ocp.StandardCheckpointer() as ck:
        ck.save(tmp_path / "plain", state)
    with ocp.CheckpointManager(tmp_path / "mngr") as mngr:        # single unnamed item
        mngr.save(3, args=ocp.args.StandardSave(state))
    target = gpt.target(mesh({"data": 1, "fsdp": 2, "tensor": 4}), "fsdp_tp")
    assert_bit_exact(restore_checkpoint(tmp_path / "plain", target), state)
    assert_bit_exact(restore_checkpoint(tmp_path / "mngr", target), state)
    assert checkpoint_metadata(tmp_path / "plain") == {"step": None, "path": str(tmp_path / "plain")}


def test_plain_orbax_reads_toolkit_checkpoints(gpt, tmp_path):
    m = mesh({"data": 1, "fsdp": 8})
    state = gpt.state(m, "fsdp")
    save_checkpoint(tmp_path, 7, state, rules="fsdp")
    target = target_like(state)
    with ocp.StandardCheckpointer() as ck:                         # the documented item path
        assert_bit_exact(ck.restore(tmp_path / "7" / "state", target), state)
    with ocp.CheckpointManager(tmp_path) as mngr:
        out = mngr.restore(7, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                       meta=ocp.args.JsonRestore()))
    assert_bit_exact(out["state"], state)
    assert out["meta"]["step"] == 7 and out["meta"]["state_item"] == "state"


# -- errors --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A pristine fsdp checkpoint of the small GPT; tests copy it before damaging it."""
    s = Setup()
    root = tmp_path_factory.mktemp("pristine")
    save_checkpoint(root, 7, s.state(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    return s, root


def _copy(saved, tmp_path):
    s, root = saved
    shutil.copytree(root, tmp_path / "ck")
    return s, tmp_path / "ck" / "7"


def _data_files(step_dir):
    files = sorted((step_dir / "state").glob("ocdbt.process_*/d/*"), key=lambda f: f.stat().st_size)
    return files


def test_truncated_data_file_names_checkpoint_and_file(saved, tmp_path):
    s, ck = _copy(saved, tmp_path)
    big = _data_files(ck)[-1]
    with open(big, "r+b") as f:
        f.truncate(100)
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {ck}: cannot read array ")
    assert f"truncated file {big} (100 bytes, needs at least " in msg
    assert "\n" not in msg and "tensorstore" not in msg.lower()
    assert any(f"truncated file {big}" in p for p in verify(resolve_checkpoint(ck)))


def test_missing_data_file(saved, tmp_path):
    s, ck = _copy(saved, tmp_path)
    gone = _data_files(ck)[-1]
    gone.unlink()
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    assert str(e.value).startswith(f"checkpoint {ck}: ")
    assert f"missing file {gone}" in str(e.value)


@pytest.mark.parametrize("victim,expect", [
    ("state/_METADATA", "missing file {ck}/state/_METADATA"),
    ("state/manifest.ocdbt", "missing file {ck}/state/manifest.ocdbt"),
    ("meta/metadata", "missing file {ck}/meta/metadata"),
])
def test_missing_metadata_files(saved, tmp_path, victim, expect):
    s, ck = _copy(saved, tmp_path)
    (ck / victim).unlink()
    fn = (lambda: checkpoint_metadata(ck)) if victim.startswith("meta") else (lambda: restore_checkpoint(ck, s.target(mesh({"data": 1, "fsdp": 8}), "fsdp")))
    with pytest.raises(pt.CheckpointError) as e:
        fn()
    assert str(e.value) == f"checkpoint {ck}: " + expect.format(ck=ck)


def test_truncated_json_files(saved, tmp_path):
    s, ck = _copy(saved, tmp_path)
    for name in ("state/_METADATA", "meta/metadata"):
        f = ck / name
        f.write_text(f.read_text()[:40])
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    assert str(e.value) == f"checkpoint {ck}: damaged file {ck}/state/_METADATA (not valid JSON; truncated?)"
    with pytest.raises(pt.CheckpointError) as e:
        checkpoint_metadata(ck)
    assert str(e.value) == f"checkpoint {ck}: damaged file {ck}/meta/metadata (not valid JSON; truncated?)"


def test_changed_model_lists_differing_paths(saved, tmp_path):
    s, ck = _copy(saved, tmp_path)
    other = Setup(GPT(vocab_size=64, embed=32, heads=4, mlp=128, layers=2))
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, other.target(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {ck} does not fit the model (9 of 38 arrays differ): "
                          "params/blocks/mlp/wi_0: checkpoint (2, 32, 64) vs model (2, 32, 128); "
                          "params/blocks/mlp/wi_1: checkpoint (2, 32, 64) vs model (2, 32, 128); "
                          "params/blocks/mlp/wo: checkpoint (2, 64, 32) vs model (2, 128, 32); ")
    assert msg.endswith("; … and 4 more")
    renamed = Setup(GPT(vocab_size=64, embed=32, heads=4, mlp=64, layers=2, norm="layer"))
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, renamed.target(mesh({"data": 1, "fsdp": 8}), "fsdp"))
    assert "params/blocks/attn_norm/bias: not in the checkpoint (model (2, 32))" in str(e.value)


def test_indivisible_on_restore_is_the_init_error(saved, tmp_path):
    s, ck = _copy(saved, tmp_path)
    bad_mesh = mesh({"data": 1, "tensor": 8})
    # Through the Python API (mesh + rules) ...
    with pytest.raises(pt.ShardingError) as at_init:
        pt.tree_shardings(s.abstract, bad_mesh, "tp")
    with pytest.raises(pt.ShardingError) as at_restore:
        restore_checkpoint(ck, abstract_target(s.abstract, bad_mesh, "tp"))
    assert str(at_restore.value) == str(at_init.value)
    assert str(at_init.value).startswith(
        "params/blocks/attn/k: dim 2 ('kv_heads', size 4) is not divisible by mesh axes ('tensor',) of size 8")
    # ... and through a Trainer, whose construction is the init's layout step.
    with pytest.raises(pt.ShardingError) as at_trainer:
        s.trainer(bad_mesh, "tp")
    assert str(at_trainer.value) == str(at_init.value)


# -- the loop hook --------------------------------------------------------------------------

def _fake_fit(state, hooks, steps, interrupt_at=None):
    """The loop contract: on_start -> on_step_end per step -> on_exit(reason)."""
    for h in hooks:
        state = h.on_start(state)
    start = int(state.step)
    reason = "done"
    for step in range(start + 1, steps + 1):
        state = state.replace(step=jnp.int32(step), params=jax.tree.map(lambda p: p + 1, state.params))
        for h in hooks:
            h.on_step_end(step, state, {"loss": 1.0})
        if step == interrupt_at:
            reason = "interrupted"
            break
    for h in hooks:
        h.on_exit(state, reason)
    return state


def test_hook_saves_every_k_resumes_and_saves_on_interrupt(tmp_path):
    s = Setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    m = mesh({"data": 1, "fsdp": 8})
    init = s.state(m, "fsdp", step=0)
    first = _fake_fit(init, [CheckpointHook(CheckpointManager(tmp_path, every=3, keep=10))], steps=10, interrupt_at=7)
    assert [i.step for i in list_steps(tmp_path)] == [3, 6, 7]      # 7: saved on interrupt
    hook = CheckpointHook(CheckpointManager(tmp_path, every=3, keep=10))
    fresh = s.state(m, "fsdp", step=0, seed=1)
    final = _fake_fit(fresh, [hook], steps=10)
    assert hook.restored_step == 7
    assert all(x.is_deleted() for x in jax.tree.leaves(fresh))       # freed before reading
    assert [i.step for i in list_steps(tmp_path)] == [3, 6, 7, 9, 10]  # 10: saved at the end
    expected = jax.tree.map(lambda p: np.asarray(p) + 3, first.params)
    for a, b in zip(gathered(final.params), jax.tree.leaves(expected)):
        assert np.array_equal(a, b)
    # Resuming with no checkpoint is a no-op; resume=False ignores existing ones.
    again = CheckpointHook(CheckpointManager(tmp_path / "empty"))
    st = s.state(m, "fsdp", step=0)
    assert again.on_start(st) is st
    off = CheckpointHook(CheckpointManager(tmp_path, every=3), resume=False)
    assert off.on_start(st) is st
    off.manager.close()
    again.manager.close()


class _Recorder:
    def __init__(self, stop_at=None):
        self.losses, self.stop_at = {}, stop_at

    def on_step_end(self, step, state, metrics):
        if metrics is not None:
            self.losses[step] = metrics["loss"]
        if step == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)   # what Ctrl-C does: fit stops after this step


def test_resumed_training_continues_the_same_curve(tmp_path):
    """fit 0->12 uninterrupted == fit 0->5 (Ctrl-C, saved) + resume 5->12, bit for bit."""
    s = Setup(MLP(vocab_size=64, embed=16, mlp=32, layers=1))
    tr = s.trainer(mesh({"data": 2, "fsdp": 4}), "fsdp")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, size=(12, 8, 9), dtype=np.int32)

    def batch_at(step):
        t = tokens[step]
        return {k: jax.device_put(v, tr.batch_sharding) for k, v in (("inputs", t[:, :-1]), ("targets", t[:, 1:]))}

    whole = _Recorder()
    ref = fit(tr, tr.init(jax.random.key(0)), batch_at, steps=12, log_every=1, hooks=[whole], progress=False)
    first = _Recorder(stop_at=5)
    hook = CheckpointHook(CheckpointManager(tmp_path, every=4))
    fit(tr, tr.init(jax.random.key(0)), batch_at, steps=12, log_every=1, hooks=[hook, first], progress=False)
    assert [i.step for i in list_steps(tmp_path)] == [4, 5]            # every 4, and on Ctrl-C
    # A new run on another layout resumes from step 5 and sees the batches of steps 5..11.
    tr2 = s.trainer(mesh({"data": 1, "fsdp": 8}), "fsdp")
    second = _Recorder()
    hook2 = CheckpointHook(CheckpointManager(tmp_path, every=4),
                           target=abstract_target(tr2.abstract_state, shardings=tr2.state_shardings))
    state = hook2.initial_state(tr2, jax.random.key(1))
    assert hook2.restored_step == 5 and int(state.step) == 5
    out = fit(tr2, state, batch_at, steps=12, log_every=1, hooks=[hook2, second], progress=False)
    assert list(first.losses) == [1, 2, 3, 4, 5] and list(second.losses) == list(range(6, 13))
    resumed = {**first.losses, **second.losses}
    assert resumed == pytest.approx(whole.losses, rel=1e-5)
    assert [i.step for i in list_steps(tmp_path)] == [5, 8, 12]             # keep=3 (the default)
    assert np.allclose(np.asarray(out.params["embedding"]), np.asarray(ref.params["embedding"]), rtol=1e-5, atol=1e-6)
