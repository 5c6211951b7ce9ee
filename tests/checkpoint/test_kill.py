"""A real process SIGKILLed during an asynchronous save never loses the previous checkpoint.

The child saves a ~200 MiB state (8 shards) every step, asynchronously, and
prints a marker at each point of interest; the parent SIGKILLs it on reading
the marker, then restores "latest" and checks it is the last *complete* step,
bit-exact. Step k's state is ``base + k`` so the parent knows every value.
"""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning as pt
from partitioning.checkpoint import CheckpointManager, restore_checkpoint
from partitioning.checkpoint.disk import list_steps
from partitioning.errors import CheckpointError
from tests.checkpoint.kill_state import SHAPES, base_values

CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, {repo!r})
    import jax, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from partitioning.checkpoint import CheckpointManager
    from tests.checkpoint.kill_state import SHAPES, base_values

    mesh = jax.make_mesh((8,), ("fsdp",))
    sh = NamedSharding(mesh, P("fsdp"))
    base = base_values()
    def state_at(k):
        return {{"step": np.int32(k), **{{n: jax.device_put(v + np.float32(k), sh) for n, v in base.items()}}}}
    mngr = CheckpointManager(sys.argv[1], every=1, keep=2, async_=True)
    def say(msg):
        print(msg, flush=True)
    for k in range(1, 6):
        state = state_at(k)
        say(f"SAVING {{k}}")
        mngr.save(k, state)
        say(f"SAVE_RETURNED {{k}}")      # the write continues in the background
        time.sleep(0.05)
        say(f"WRITING {{k}}")
        mngr.wait()
        say(f"COMMITTED {{k}}")
        time.sleep(0.05)
        say(f"BETWEEN {{k}}")
    mngr.close()
    say("EXIT")
""")


def _run_until(repo, tmp_path, marker):
    """Starts the child and SIGKILLs it as soon as it prints ``marker``; returns its output."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(repo)))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=repo,
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            if line.strip() == marker:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert marker in seen, f"child ended before {marker!r}: {seen}"
    return seen


def _target():
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    shardings = {n: NamedSharding(mesh, P("data", "fsdp")) for n in SHAPES}
    shardings["step"] = NamedSharding(mesh, P())
    abstract = {n: jax.ShapeDtypeStruct(s, np.float32) for n, s in SHAPES.items()}
    abstract["step"] = jax.ShapeDtypeStruct((), np.int32)
    return pt.checkpoint.abstract_target(abstract, shardings=shardings)


def _check_latest(ckpt_dir, step):
    state = restore_checkpoint(ckpt_dir, _target())
    assert int(state["step"]) == step
    base = base_values()
    for n in SHAPES:
        assert np.array_equal(np.asarray(state[n]), base[n] + np.float32(step)), n


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker,last_complete,in_flight",
    [
        ("SAVING 3", 2, None),  # before / inside the blocking part of the save call
        ("SAVE_RETURNED 3", 2, 3),  # right after the save call: the write has just started
        ("WRITING 3", 2, 3),  # 50 ms into the background write
        ("BETWEEN 2", 2, None),  # between saves: everything committed
    ],
)
def test_sigkill_keeps_last_complete_checkpoint(repo, tmp_path, marker, last_complete, in_flight):
    _run_until(repo, tmp_path, marker)
    ckpt = tmp_path / "ckpt"
    steps = list_steps(ckpt)
    complete = [s.step for s in steps if s.complete]
    assert complete[-1] == last_complete and complete == sorted(set(complete))
    if in_flight is not None:
        # Killed mid-write: the step exists only as orbax's temporary directory.
        assert [s.step for s in steps if not s.complete] == [in_flight]
    _check_latest(ckpt, last_complete)
    # The next run starts cleanly: stale temporary dirs are dropped, the step can be saved again.
    with CheckpointManager(ckpt, every=1, keep=2) as mngr:
        assert mngr.latest_step() == last_complete
        assert all(s.complete for s in list_steps(ckpt))  # the killed save's temp dir is gone
        mesh = jax.make_mesh((8,), ("fsdp",))
        sh = NamedSharding(mesh, P("fsdp"))
        base = base_values()
        mngr.save(
            last_complete + 1,
            {
                "step": np.int32(last_complete + 1),
                **{n: jax.device_put(v + np.float32(last_complete + 1), sh) for n, v in base.items()},
            },
        )
    _check_latest(ckpt, last_complete + 1)


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["COMMITTED 3", "BETWEEN 3", "COMMITTED 4"])
def test_sigkill_around_pruning_leaves_only_steps_that_restore(repo, tmp_path, marker):
    # keep=2: committing step k prunes step k-2 (renamed into _pruned, then deleted) around these markers.
    _run_until(repo, tmp_path, marker)
    ckpt = tmp_path / "ckpt"
    complete = [s.step for s in list_steps(ckpt) if s.complete]
    assert complete and complete == sorted(set(complete))
    base = base_values()
    for step in complete:  # every step `ls` calls complete restores, bit for bit
        state = restore_checkpoint(ckpt, _target(), step=step)
        assert all(np.array_equal(np.asarray(state[n]), base[n] + np.float32(step)) for n in SHAPES), step


def test_a_half_deleted_step_is_not_complete(tmp_path):
    mesh = jax.make_mesh((8,), ("fsdp",))
    sh = NamedSharding(mesh, P("fsdp"))
    with CheckpointManager(tmp_path / "ckpt", keep=0, async_=False) as mngr:
        for k in (1, 2):
            mngr.save(k, {"step": np.int32(k), "w": jax.device_put(np.full((64,), k, np.float32), sh)}, force=True)
    # What an interrupted in-place delete leaves: the step's folder, part of its files gone.
    (tmp_path / "ckpt" / "2" / "state" / "_METADATA").unlink()
    steps = {s.step: s.complete for s in list_steps(tmp_path / "ckpt")}
    assert steps == {1: True, 2: False}
    mesh1 = jax.make_mesh((8,), ("fsdp",))
    target = {
        "step": jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh1, P())),
        "w": jax.ShapeDtypeStruct((64,), np.float32, sharding=sh),
    }
    # Never a silent fall back to step 1 (issue 30): refused, naming the damaged step and the good one.
    with pytest.raises(CheckpointError, match=r"step 2 .* is damaged: missing file .*the latest good step is 1"):
        restore_checkpoint(tmp_path / "ckpt", target)
    assert int(restore_checkpoint(tmp_path / "ckpt", target, step=1)["step"]) == 1


def test_pruned_steps_are_moved_then_deleted(tmp_path):
    mesh = jax.make_mesh((8,), ("fsdp",))
    sh = NamedSharding(mesh, P("fsdp"))
    with CheckpointManager(tmp_path / "ckpt", keep=1, async_=False) as mngr:
        for k in range(1, 5):
            mngr.save(k, {"w": jax.device_put(np.full((64,), k, np.float32), sh)}, force=True)
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["4"]  # the emptied _pruned folder goes too once the manager is closed
