"""The on-disk layout (partitioning.checkpoint.disk): finding a checkpoint from a path, and why not."""

import shutil

import pytest

import partitioning as pt
from partitioning.checkpoint import save_checkpoint
from partitioning.checkpoint.disk import resolve_checkpoint
from partitioning.models import MLP

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_resolve_errors(tmp_path, ckpt_setup, mesh_of):
    with pytest.raises(pt.CheckpointError, match=r"no such checkpoint"):
        resolve_checkpoint(tmp_path / "nope")
    (tmp_path / "5.orbax-checkpoint-tmp-123").mkdir()
    with pytest.raises(pt.CheckpointError) as e:
        resolve_checkpoint(tmp_path)
    assert str(e.value) == f"{tmp_path}: no complete checkpoint (unfinished saves: 5.orbax-checkpoint-tmp-123)"
    s = ckpt_setup(model=MLP(vocab_size=32, embed=16, mlp=32, layers=1))
    save_checkpoint(tmp_path, 4, s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    assert resolve_checkpoint(tmp_path).step == 4
    with pytest.raises(pt.CheckpointError) as e:
        resolve_checkpoint(tmp_path, step=9)
    assert str(e.value) == f"{tmp_path}: no complete checkpoint for step 9 (steps: 4)"
    # A run dir holding checkpoints/ resolves too.
    run = tmp_path / "run"
    shutil.copytree(tmp_path / "4", run / "checkpoints" / "4")
    assert resolve_checkpoint(run).path == run / "checkpoints" / "4"
