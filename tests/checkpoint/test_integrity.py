"""Checkpoints verified by default (partitioning.checkpoint.integrity): every damage is refused on restore in one
line naming the step, the file and the earlier good step; bytes are checksummed as they are read; a damaged
step never counts toward `keep`, is never silently skipped over, and a resume never falls back past it."""

import gc
import json
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import partitioning as pt
from partitioning.checkpoint import integrity
from partitioning.checkpoint.disk import list_steps, resolve_checkpoint
from partitioning.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def chunk(step_dir: Path, i: int = 0) -> tuple[Path, int]:
    """(data file, offset) of the middle of the i-th array chunk stored in a data file (off the OCDBT tree)."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "file", "path": str(step_dir / "state") + "/"}).result()
    root = ts.ocdbt.dump(kv).result()["versions"][-1]["root"]["location"]
    entry = [e for e in ts.ocdbt.dump(kv, root).result()["entries"] if "indirect_value" in e][i]
    head, off, length = entry["indirect_value"].rsplit(":", 2)
    _, base, rel = head.split(":", 2)
    return step_dir / "state" / base / rel, int(off) + int(length) // 2


def flip(f: Path, offset: int) -> None:
    b = bytearray(f.read_bytes())
    b[offset] ^= 0x40  # an exponent bit: the restored number would be far off
    f.write_bytes(bytes(b))


def largest(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("d/*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, ckpt_setup, mesh_of):
    """A checkpoints dir with good steps 3 and 7 of the small GPT (fsdp); tests copy it before damaging it."""
    s = ckpt_setup()
    root = tmp_path_factory.mktemp("two") / "ck"
    state = s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    with pt.CheckpointManager(root, keep=0, async_=False) as m:
        m.save(3, state)
        m.save(7, state)
    return s, root


@pytest.fixture
def ck(two_steps, tmp_path, monkeypatch):
    s, root = two_steps
    shutil.copytree(root, tmp_path / "ck")
    monkeypatch.chdir(tmp_path)  # paths as a user types them: relative
    return s, Path("ck")


DAMAGE = {
    "flipped bit": (lambda d: flip(*chunk(d)), "array ", ": checksum mismatch in slice ["),
    "no checksums": (
        lambda d: (d / "meta" / "checksums.0.json").unlink(),
        "missing file ck/7/meta/checksums.0.json (the step's checksums)",
        "",
    ),
    "no checksums and a flipped bit": (
        lambda d: ((d / "meta" / "checksums.0.json").unlink(), flip(*chunk(d))),
        "missing file ck/7/meta/checksums.0.json",
        "",
    ),
    "no state _METADATA": (lambda d: (d / "state" / "_METADATA").unlink(), "missing file ck/7/state/_METADATA", ""),
    "truncated data file": (
        lambda d: largest(d).write_bytes(largest(d).read_bytes()[:100]),
        "truncated file ck/7/",
        "",
    ),
    "deleted data file": (lambda d: largest(d).unlink(), "missing file ck/7/state/", " (holds array "),
    "no OCDBT manifest": (lambda d: (d / "state" / "manifest.ocdbt").unlink(), "missing file ck/7/state/manifest", ""),
    "unreadable state _METADATA": (
        lambda d: (d / "state" / "_METADATA").write_text("xx"),
        "damaged file ck/7/state/_METADATA (not valid JSON; truncated?)",
        "",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_damage_is_refused_by_default_naming_step_file_and_the_earlier_good_step(ck, mesh_of, damage):
    s, d = ck
    hurt, what, detail = DAMAGE[damage]
    hurt(d / "7")
    target = s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    with pytest.raises(CheckpointError) as e:
        pt.restore_checkpoint(d, target)  # the default: verified; never a silent fall back to step 3
    msg = str(e.value)
    assert msg.startswith("checkpoint step 7 (ck/7) is damaged: ") and what in msg and detail in msg, msg
    assert msg.endswith(
        "the latest good step is 3: choose it explicitly (train --resume-from 3; step=3 from Python)"
        ", or start over with --no-resume"
    ), msg
    assert "\n" not in msg
    assert np.asarray(pt.restore_checkpoint(d, target, step=3).step) == 7  # the earlier step, chosen explicitly
    steps = {st.step: (st.complete, st.damage) for st in list_steps(d)}
    if damage.startswith("no "):  # damage visible from names alone: never listed complete
        assert steps[7][0] is False and what.split(" ck/")[0] in steps[7][1]


def test_a_flipped_bit_is_caught_as_the_bytes_are_read_on_any_layout(ck, mesh_of):
    s, d = ck
    f, offset = chunk(d / "7")
    flip(f, offset)
    for shape, rules in (({"data": 1, "fsdp": 8}, "fsdp"), ({"data": 2, "tensor": 4}, "tp"), ({"data": 8}, "dp")):
        with pytest.raises(CheckpointError, match=r"checksum mismatch in slice \[.*\] \(files? ck/7/state/"):
            pt.restore_checkpoint(d, s.target(mesh_of(shape), rules))
    # Explicitly unverified, the same bytes restore as different numbers: what the default prevents.
    bad = pt.restore_checkpoint(d, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"), verify=False)
    good = pt.restore_checkpoint(d, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"), step=3)
    differ = [
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(bad), jax.tree.leaves(good), strict=True)
    ]
    assert sum(differ) == 1


def test_the_same_layout_checks_every_slice_from_the_read_bytes_alone(ck, mesh_of, monkeypatch):
    s, d = ck
    reread = []
    monkeypatch.setattr(integrity, "read_records", lambda ref, recs: reread.append(recs) or [])
    restored = pt.restore_checkpoint(d, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"))
    assert reread == [] and np.asarray(restored.step) == 7  # no second read: every record was inside a read
    pt.restore_checkpoint(d, s.target(mesh_of({"data": 2, "tensor": 4}), "tp"))
    assert reread == []  # another layout: the stored slices are read, checked and cut (tests/checkpoint/test_read_once)
    pt.restore_checkpoint(d, s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp", dtype=jnp.bfloat16))
    assert reread and all(recs for recs in reread)  # cast while read: the stored bytes are read back for their crc


def test_a_resume_refuses_a_damaged_latest_step_and_resumes_from_an_explicit_one(ck, mesh_of, capsys):
    s, d = ck
    (d / "7" / "state" / "_METADATA").unlink()
    target = s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    refused = pytest.raises(CheckpointError, match=r"^checkpoint step 7 \(.*ck/7\) is damaged: .*latest good step is 3")
    with pt.CheckpointManager(d, keep=2, async_=False) as m, refused:
        pt.checkpoint.CheckpointHook(m, target=target).initial_state(None, None)  # refused: never a fresh init
    with pt.CheckpointManager(d, keep=1, async_=False) as m:
        hook = pt.checkpoint.CheckpointHook(m, target=target, step=3, log=print)
        assert np.asarray(hook.initial_state(None, None).step) == 7  # the small GPT's saved counter
    out = capsys.readouterr().out
    assert "checkpoint: resuming from step 3: moved the later step 7 to " in out
    assert [st.step for st in list_steps(d)] == [3] and any(p.name.startswith("7.superseded-") for p in d.iterdir())


def test_a_damaged_step_never_counts_toward_keep_and_is_not_skipped_over(ck, mesh_of, capsys):
    s, d = ck
    state = s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    (d / "7" / "meta" / "checksums.0.json").unlink()  # step 7 damaged; step 3 the only good one
    with pt.CheckpointManager(d, keep=1, async_=False) as m:
        m.save(5, state)  # keep 1 good step: 5; step 3 may go, the damaged 7 stays as evidence
        assert sorted(st.step for st in list_steps(d) if st.complete) == [5]
        assert [st.step for st in list_steps(d) if st.damage] == [7]
        assert m.save(7, state) is True  # the save over a damaged step happens, moving it aside
    err = capsys.readouterr().err
    assert err.startswith("checkpoint: step 7 was damaged (missing file ") and "moved it to" in err
    aside = [p.name for p in d.iterdir() if p.name.startswith("7.damaged-")]
    assert len(aside) == 1 and sorted(st.step for st in list_steps(d) if st.complete) == [7]


def test_a_diverging_run_keeps_its_healthiest_step(tmp_path, ckpt_setup, mesh_of):
    s = ckpt_setup()
    state = s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp")
    with pt.CheckpointManager(tmp_path / "ck", keep=2, async_=False) as m:
        for step, loss in [(1, 3.0), (2, 2.0), (3, 2.5), (4, 9.0), (5, 40.0)]:  # finite, but ruined after 2
            m.save(step, state, metrics={"loss": loss})
    assert sorted(st.step for st in list_steps(tmp_path / "ck")) == [2, 4, 5]


def test_a_pristine_default_restore_is_bit_exact(ck, mesh_of, assert_bit_exact):
    s, d = ck
    m = mesh_of({"data": 1, "fsdp": 8})
    assert_bit_exact(pt.restore_checkpoint(d, s.target(m, "fsdp")), s.state(m, "fsdp"))


def test_a_python_restore_of_a_deleted_data_file_leaks_no_event_loop_errors(ck, mesh_of, monkeypatch):
    s, d = ck
    largest(d / "7").unlink()
    leaked = []
    monkeypatch.setattr(sys, "unraisablehook", leaked.append)  # where "Event loop is closed" tracebacks went
    for _ in range(3):  # the leak raced with the restore's failure: try it a few times
        with pytest.raises(CheckpointError, match=r"^checkpoint ck/7: (cannot read array .*: )?missing file .*ck/7/"):
            pt.restore_checkpoint("ck/7", s.target(mesh_of({"data": 1, "fsdp": 8}), "fsdp"), verify=False)
    gc.collect()
    assert [str(u.exc_value) for u in leaked] == []


def test_resolving_a_damaged_latest_step_never_falls_back(ck):
    _, d = ck
    (d / "7" / "meta" / "metadata").unlink()
    with pytest.raises(CheckpointError, match=r"step 7 .* is damaged: missing file ck/7/meta/metadata; .* step is 3"):
        resolve_checkpoint(d)
    assert resolve_checkpoint(d, 3).step == 3
    assert json.loads((d / "3" / "meta" / "metadata").read_text())["step"] == 3


def test_a_step_pruned_while_inspected_is_not_damage(ck, monkeypatch, run_cli_in_process):
    import partitioning.cli.ckpt as ckpt_cli

    real = ckpt_cli.verify_checksums

    def pruned_meanwhile(ref):  # the run's `keep: 1` renames the step away while its arrays are read
        if ref.step == 7 and ref.path.exists():
            shutil.rmtree(ref.path)
        return real(ref) if ref.path.exists() else ["missing file (gone)"]

    monkeypatch.setattr(ckpt_cli, "verify_checksums", pruned_meanwhile)
    _, d = ck
    r = run_cli_in_process("ckpt", "inspect", "ck/7")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: checkpoint ck/7: pruned during inspection (the run's checkpoint.keep removed it while it was read; "
        "not damage); inspect a step the run keeps"
    )
    shutil.copytree(d / "3", d / "7")  # a run dir: the newer latest step is inspected instead
    r = run_cli_in_process("ckpt", "inspect", "ck")
    assert r.returncode == 0 and r.stdout.startswith("checkpoint ck/3: step 3") and "files: OK" in r.stdout


def test_a_boxed_abstract_state_restores_given_a_mesh_and_is_one_line_without(ck, mesh_of, ckpt_setup):
    s, d = ck
    mesh = mesh_of({"data": 1, "fsdp": 8})
    abstract = s.trainer(mesh, "fsdp").abstract_state  # Flax boxes around unsharded ShapeDtypeStructs
    with pytest.raises(CheckpointError) as e:
        pt.restore_checkpoint(d, abstract)
    assert str(e.value) == (
        "restore_checkpoint: the target's leaf 'step' has no sharding to restore onto (an abstract or boxed "
        "state, e.g. trainer.abstract_state): pass mesh= and rules= to lay it out, or "
        "pt.abstract_target(abstract, shardings=trainer.state_shardings)"
    )
    state = pt.restore_checkpoint(d, abstract, mesh=mesh, rules="fsdp")
    assert int(state.step) == 7
    assert (
        state.params["blocks"]["mlp"]["wi_0"].sharding.spec
        == s.target(mesh, "fsdp").params["blocks"]["mlp"]["wi_0"].sharding.spec
    )
