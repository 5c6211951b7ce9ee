"""Checksums (partitioning.checkpoint.checksum): recorded at save, a flipped bit in a real data file is
named by array, slice and file — by `ckpt inspect` and by a restore with verify — never restored silently."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from partitioning.checkpoint import restore_checkpoint
from partitioning.checkpoint.checksum import read_checksums, verify_checksums
from partitioning.checkpoint.disk import resolve_checkpoint
from partitioning.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def one_line_error(r) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def a_chunk(step_dir: Path) -> tuple[Path, int]:
    """(data file, offset) of the middle of an array chunk stored in a data file (read off the OCDBT tree)."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "file", "path": str(step_dir / "state") + "/"}).result()
    root = ts.ocdbt.dump(kv).result()["versions"][-1]["root"]["location"]
    entry = next(e for e in ts.ocdbt.dump(kv, root).result()["entries"] if "indirect_value" in e)
    head, off, length = entry["indirect_value"].rsplit(":", 2)
    _, base, rel = head.split(":", 2)
    return step_dir / "state" / base / rel, int(off) + int(length) // 2


def flip(f: Path, offset: int) -> None:
    b = bytearray(f.read_bytes())
    b[offset] ^= 0x04  # one bit
    f.write_bytes(bytes(b))


def test_every_slice_is_recorded_and_a_pristine_checkpoint_verifies(saved_copy, mesh_of):
    s, step_dir = saved_copy
    sums = read_checksums(step_dir / "meta")
    state = s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    import jax

    from partitioning.layout import path_str

    leaves = {path_str(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    assert set(sums) == set(leaves)
    for path, x in leaves.items():  # one record per distinct slice (replicated copies once)
        assert len(sums[path]) == len({tuple(map(str, sh.index)) for sh in x.addressable_shards}), path
    assert json.loads((step_dir / "meta" / "checksums.0.json").read_text())["algorithm"] == "crc32c"
    assert verify_checksums(resolve_checkpoint(step_dir)) == []


def test_a_flipped_bit_is_named_by_inspect_and_refused_by_a_verifying_restore(
    saved_copy, monkeypatch, run_cli_in_process, mesh_of
):
    s, step_dir = saved_copy
    f, offset = a_chunk(step_dir)
    flip(f, offset)
    monkeypatch.chdir(step_dir.parent.parent)  # paths as a user types them: relative
    rel = os.path.relpath(step_dir)
    error = one_line_error(run_cli_in_process("ckpt", "inspect", rel))
    assert error.startswith(f"error: checkpoint {rel}: array ") and ": checksum mismatch in slice [" in error
    # The files that may hold the slice (its chunk, or the B-tree node it is inlined in): the flipped one first.
    named = error.rsplit("(file", 1)[1].lstrip("s ").rstrip(")").split(", ")
    assert named[0] == os.path.relpath(f), error
    array = error.split(": array ")[1].split(":")[0]
    # Without verification the flipped value would be restored as a different number.
    target = s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    with pytest.raises(CheckpointError) as e:
        restore_checkpoint(rel, target, verify=True)
    assert f"array {array}: checksum mismatch" in str(e.value) and str(e.value).endswith(
        "; not restored; no earlier good step: start over with --no-resume"
    )
    assert run_cli_in_process("ckpt", "inspect", rel, "--no-verify").returncode == 0  # the files are all there


def test_a_verifying_restore_of_a_pristine_checkpoint_is_bit_exact(saved_copy, mesh_of, assert_bit_exact):
    s, step_dir = saved_copy
    m = mesh_of({"data": 1, "fsdp": 8})
    restored = restore_checkpoint(step_dir, s.target(m, "fsdp"), verify=True)
    assert_bit_exact(restored, s.state(m, "fsdp"))
    assert np.asarray(restored.step) == 7
