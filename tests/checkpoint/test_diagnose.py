"""Damaged checkpoints (partitioning.checkpoint.diagnose): one CheckpointError naming the checkpoint and the file."""

import pytest

import partitioning as pt
from partitioning.checkpoint import checkpoint_metadata, restore_checkpoint
from partitioning.checkpoint.diagnose import verify
from partitioning.checkpoint.disk import resolve_checkpoint

# After a read of a damaged file fails, orbax's other in-flight reads finish on a closed
# event loop and Python reports them as "unraisable" at some later garbage collection.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def damaged(ck, what: str) -> str:
    """The default (verifying) restore's line for a damaged step with no earlier good one."""
    return (
        f"checkpoint step 7 ({ck}) is damaged: {what}; not restored; no earlier good step: start over with --no-resume"
    )


def _data_files(step_dir):
    files = sorted((step_dir / "state").glob("ocdbt.process_*/d/*"), key=lambda f: f.stat().st_size)
    return files


def test_truncated_data_file_names_checkpoint_and_file(saved_copy, mesh_of):
    s, ck = saved_copy
    big = _data_files(ck)[-1]
    with open(big, "r+b") as f:
        f.truncate(100)
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    msg = str(e.value)
    assert msg.startswith(f"checkpoint step 7 ({ck}) is damaged: truncated file ")
    assert f"truncated file {big} (100 bytes, needs at least " in msg
    assert "\n" not in msg and "tensorstore" not in msg.lower()
    assert any(f"truncated file {big}" in p for p in verify(resolve_checkpoint(ck)))


def test_missing_data_file(saved_copy, mesh_of):
    s, ck = saved_copy
    gone = _data_files(ck)[-1]
    gone.unlink()
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    assert str(e.value).startswith(f"checkpoint step 7 ({ck}) is damaged: missing file {gone}")


@pytest.mark.parametrize(
    "victim,expect",
    [
        ("state/_METADATA", "missing file {ck}/state/_METADATA"),
        ("state/manifest.ocdbt", "missing file {ck}/state/manifest.ocdbt"),
        ("meta/metadata", "missing file {ck}/meta/metadata"),
    ],
)
def test_missing_metadata_files(saved_copy, victim, expect, mesh_of):
    s, ck = saved_copy
    (ck / victim).unlink()
    fn = (
        (lambda: checkpoint_metadata(ck))
        if victim.startswith("meta")
        else (lambda: restore_checkpoint(ck, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp")))
    )
    with pytest.raises(pt.CheckpointError) as e:
        fn()
    if victim.startswith("meta"):
        assert str(e.value) == f"checkpoint {ck}: " + expect.format(ck=ck)
    else:
        assert str(e.value) == damaged(ck, expect.format(ck=ck))


def test_truncated_json_files(saved_copy, mesh_of):
    s, ck = saved_copy
    for name in ("state/_METADATA", "meta/metadata"):
        f = ck / name
        f.write_text(f.read_text()[:40])
    with pytest.raises(pt.CheckpointError) as e:
        restore_checkpoint(ck, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    assert str(e.value) == damaged(ck, f"damaged file {ck}/meta/metadata (not valid JSON; truncated?)")
    with pytest.raises(pt.CheckpointError) as e:
        checkpoint_metadata(ck)
    assert str(e.value) == f"checkpoint {ck}: damaged file {ck}/meta/metadata (not valid JSON; truncated?)"
