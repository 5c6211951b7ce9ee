"""The loop hook (partitioning.checkpoint.hook): save every K, resume, save on interrupt; a resumed run
continues the same curve; --no-resume moves old checkpoints aside."""

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioning as pt
from partitioning.checkpoint import CheckpointHook, CheckpointManager, abstract_target
from partitioning.checkpoint.disk import list_steps
from partitioning.models import MLP
from partitioning.train.loop import fit

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


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


def test_hook_saves_every_k_resumes_and_saves_on_interrupt(tmp_path, gathered, ckpt_setup, mesh_of):
    s = ckpt_setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    m = mesh_of({"data": 1, "fsdp": 8})
    init = s.state(m, "fsdp", step=0)
    first = _fake_fit(init, [CheckpointHook(CheckpointManager(tmp_path, every=3, keep=10))], steps=10, interrupt_at=7)
    assert [i.step for i in list_steps(tmp_path)] == [3, 6, 7]  # 7: saved on interrupt
    hook = CheckpointHook(CheckpointManager(tmp_path, every=3, keep=10))
    fresh = s.state(m, "fsdp", step=0, seed=1)
    final = _fake_fit(fresh, [hook], steps=10)
    assert hook.restored_step == 7
    assert all(x.is_deleted() for x in jax.tree.leaves(fresh))  # freed before reading
    assert [i.step for i in list_steps(tmp_path)] == [3, 6, 7, 9, 10]  # 10: saved at the end
    expected = jax.tree.map(lambda p: np.asarray(p) + 3, first.params)
    for a, b in zip(gathered(final.params), jax.tree.leaves(expected), strict=True):
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
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does: fit stops after this step


def test_resumed_training_continues_the_same_curve(tmp_path, ckpt_setup, mesh_of):
    """fit 0->12 uninterrupted == fit 0->5 (Ctrl-C, saved) + resume 5->12, bit for bit."""
    s = ckpt_setup(MLP(vocab_size=64, embed=16, mlp=32, layers=1))
    tr = s.trainer(mesh_of({"data": 2, "fsdp": 4}), "fsdp")
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
    assert [i.step for i in list_steps(tmp_path)] == [4, 5]  # every 4, and on Ctrl-C
    # A new run on another layout resumes from step 5 and sees the batches of steps 5..11.
    tr2 = s.trainer(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    second = _Recorder()
    hook2 = CheckpointHook(
        CheckpointManager(tmp_path, every=4), target=abstract_target(tr2.abstract_state, shardings=tr2.state_shardings)
    )
    state = hook2.initial_state(tr2, jax.random.key(1))
    assert hook2.restored_step == 5 and int(state.step) == 5
    out = fit(tr2, state, batch_at, steps=12, log_every=1, hooks=[hook2, second], progress=False)
    assert list(first.losses) == [1, 2, 3, 4, 5] and list(second.losses) == list(range(6, 13))
    resumed = {**first.losses, **second.losses}
    assert resumed == pytest.approx(whole.losses, rel=1e-5)
    assert [i.step for i in list_steps(tmp_path)] == [5, 8, 12]  # keep=3 (the default)
    assert np.allclose(np.asarray(out.params["embedding"]), np.asarray(ref.params["embedding"]), rtol=1e-5, atol=1e-6)


def test_no_resume_moves_checkpoints_aside(saved_run, tmp_path, ckpt_model_yaml, mesh_of):
    import shutil

    from partitioning.config import load_config
    from partitioning.config.run import checkpoint_hook_from_config as checkpoint_hook

    s, root = saved_run
    shutil.copytree(root, tmp_path / "run")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        ckpt_model_yaml + "mesh: {shape: {data: 1, fsdp: 8}}\nrules: fsdp\ntrain: {batch_size: 8, seq_len: 8}\n"
    )
    config = load_config(cfg)
    tr = s.trainer(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    said = []
    hook = checkpoint_hook(config, tr, tmp_path / "run", resume=False, log=said.append)
    assert not hook.resume and hook.manager.latest_step() is None
    moved = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoints.prev-")]
    assert len(moved) == 1 and [s.step for s in list_steps(moved[0]) if s.complete] == [3, 6]
    assert said == [f"checkpoint: --no-resume: moved existing checkpoints to {moved[0]}"]
    hook.manager.close()
    # resume=None (the default) resumes from whatever exists.
    shutil.copytree(moved[0], tmp_path / "run" / "checkpoints", dirs_exist_ok=True)
    hook = checkpoint_hook(config, tr, tmp_path / "run", log=said.append)
    state = hook.initial_state(tr, jax.random.key(0))
    assert hook.restored_step == 6 and int(state.step) == 6
    hook.manager.close()
    # --resume (resume=True) with nothing to resume from is bad input.
    with pytest.raises(pt.CheckpointError) as e:
        checkpoint_hook(config, tr, tmp_path / "fresh", resume=True)
    assert str(e.value) == f"--resume: no complete checkpoint in {tmp_path / 'fresh' / 'checkpoints'}"
