"""`partitioning ckpt ls|inspect|reshard` (partitioning.cli.ckpt)."""

import json
import re

import jax
import pytest

import partitioning as pt
from partitioning.checkpoint import checkpoint_metadata, restore_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see tests/checkpoint


def test_ls(saved_run, run_cli_in_process):
    _, root = saved_run
    result = run_cli_in_process("ckpt", "ls", root)
    assert result.returncode == 0
    out = result.stdout
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["3", "6", "9"]
    assert [r.split("│")[2].strip() for r in rows] == ["complete", "complete", "INCOMPLETE (save unfinished or killed)"]
    assert "eval_loss 2.75, loss 2.25" in rows[1]
    # On-disk size varies with orbax's chunking: check its form, not its value.
    assert all(re.fullmatch(r"\d+(\.\d\d)? (B|KiB|MiB)", r.split("│")[3].strip()) for r in rows[:2])
    assert out.rstrip().endswith("latest complete step: 6")


def test_inspect(saved_run, run_cli_in_process):
    _, root = saved_run
    result = run_cli_in_process("ckpt", "inspect", root, "--config")
    assert result.returncode == 0
    out = result.stdout
    first = out.splitlines()[0]
    assert first.startswith(f"checkpoint {root / 'checkpoints' / '6'}: step 6, 38 arrays, ")
    assert first.endswith("files: OK")
    assert f"jax {jax.__version__}" in out and "model gpt; mesh {data: 1, fsdp: 8} (8 devices)" in out
    assert "rules: [batch, [data, fsdp]], [embed, fsdp], [vocab, fsdp], [mlp, fsdp]" in out
    assert "metrics: eval_loss 2.75, loss 2.25" in out
    row = next(line for line in out.splitlines() if "│ params/blocks/attn/q " in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [
        "params/blocks/attn/q",
        "(2, 32, 4, 8)",
        "float32",
        "(layers, embed, heads, kv)",
        "P(None, 'fsdp', None, None) on {data: 1, fsdp: 8}",
    ]
    assert "config:\nmodel:\n  name: gpt" in out
    result = run_cli_in_process("ckpt", "inspect", root, "--step", "3", "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["step"] == 3 and data["problems"] == [] and data["metadata"]["metrics"] == {"loss": 2.5}
    assert data["arrays"]["opt_state/0/nu/embedding"] == {
        "shape": [64, 32],
        "dtype": "float32",
        "sharding": "P(None, 'fsdp') on {data: 1, fsdp: 8}",
        "names": ["vocab", "embed"],
    }


@pytest.mark.parametrize(
    "mesh_yaml,rules,n,spec_q",
    [
        ("{data: 1, fsdp: 2, tensor: 4}", "fsdp_tp", 8, "P(None, 'fsdp', 'tensor', None)"),
        ("{data: 2, tensor: 4}", "tp", 8, "P(None, None, 'tensor', None)"),
        ("{data: 1, fsdp: 1}", "fsdp", 1, "P(None, 'fsdp', None, None)"),
    ],
    ids=["to-fsdp_tp", "to-tp", "to-1-device"],
)
def test_reshard(
    saved_run, tmp_path, mesh_yaml, rules, n, spec_q, run_cli_in_process, assert_bit_exact, ckpt_model_yaml, mesh_of
):
    s, root = saved_run
    cfg = tmp_path / "new.yaml"
    cfg.write_text(
        ckpt_model_yaml + f"mesh: {{shape: {mesh_yaml}, devices: {n}}}\nrules: {rules}\n"
        "train: {batch_size: 8, seq_len: 8}\n"
    )
    out = tmp_path / "out"
    result = run_cli_in_process("ckpt", "reshard", root, "--config", cfg, "--out", out)
    assert result.returncode == 0
    assert result.stdout.startswith(
        "resharded step 6: 38 arrays from mesh {data: 1, fsdp: 8} to {" + mesh_yaml[1:-1] + "}"
    )
    # The new checkpoint is laid out for the new mesh, with the same values ...
    result = run_cli_in_process("ckpt", "inspect", out, "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["arrays"]["params/blocks/attn/q"]["sharding"].startswith(spec_q)
    assert data["metadata"]["resharded_from"] == str(root / "checkpoints" / "6")
    assert data["metadata"]["rules"] == pt.Rules.preset(rules).to_list()
    src_mesh = mesh_of({"data": 1, "fsdp": 8})
    original = restore_checkpoint(root, s.target(src_mesh, "fsdp"))
    assert_bit_exact(restore_checkpoint(out, s.target(src_mesh, "fsdp")), original)
    # ... and is what a run with the new config resumes from, reading only local slices.
    sizes = {k: int(v) for k, v in (kv.split(": ") for kv in mesh_yaml[1:-1].split(", "))}
    dst = mesh_of(sizes, n)
    back = restore_checkpoint(out, s.target(dst, rules))
    assert_bit_exact(back, original)
    assert str(back.params["blocks"]["attn"]["q"].sharding.spec) == spec_q


def test_reshard_plain_orbax_checkpoint(
    saved_run, tmp_path, run_cli_in_process, assert_bit_exact, mesh_of, ckpt_model_yaml
):
    """No toolkit metadata: params take their names from the config's model, moments from their param."""
    import orbax.checkpoint as ocp

    s, _ = saved_run
    state = s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp", step=11)
    with ocp.CheckpointManager(tmp_path / "plain") as mngr:
        mngr.save(11, args=ocp.args.StandardSave(state))
    cfg = tmp_path / "new.yaml"
    cfg.write_text(ckpt_model_yaml + "mesh: {shape: {data: 1, fsdp: 2, tensor: 4}, devices: 8}\nrules: fsdp_tp\n")
    result = run_cli_in_process("ckpt", "reshard", tmp_path / "plain", "--config", cfg, "--out", tmp_path / "out")
    assert result.returncode == 0
    assert result.stdout.startswith(
        "resharded step 11: 38 arrays from mesh {data: 1, fsdp: 8} to {data: 1, fsdp: 2, tensor: 4}"
    )
    meta = checkpoint_metadata(tmp_path / "out")
    for p in ("params/embedding", "opt_state/0/mu/embedding", "opt_state/0/nu/embedding"):
        assert meta["arrays"][p]["names"] == ["vocab", "embed"] and meta["arrays"][p]["spec"] == ["tensor", "fsdp"]
    assert meta["arrays"]["opt_state/0/count"]["spec"] == []
    dst = mesh_of({"data": 1, "fsdp": 2, "tensor": 4})
    assert_bit_exact(restore_checkpoint(tmp_path / "out", s.target(dst, "fsdp_tp")), state)


# -- bad input: one line on stderr, exit 2 --------------------------------------------------------


def test_ls_missing_dir(tmp_path, one_line_error, run_cli_subprocess):
    assert (
        one_line_error(run_cli_subprocess("ckpt", "ls", tmp_path / "nope"))
        == f"error: {tmp_path / 'nope'}: no such checkpoint directory"
    )


def test_inspect_truncated_checkpoint(saved_run, tmp_path, run_cli_subprocess, one_line_error):
    import shutil

    _, root = saved_run
    ck = tmp_path / "6"
    shutil.copytree(root / "checkpoints" / "6", ck)
    victim = max((ck / "state").glob("ocdbt.process_*/d/*"), key=lambda f: f.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(10)
    r = run_cli_subprocess("ckpt", "inspect", ck)
    line = one_line_error(r)
    assert line.startswith(f"error: checkpoint {ck}: truncated file {victim} (10 bytes, needs at least ")
    # The tree is still shown: shapes and shardings come from the intact metadata.
    assert "files: DAMAGED: truncated file" in r.stdout.splitlines()[0] and "params/blocks/attn/q" in r.stdout
    # --json too: the JSON lists the problem, the exit status says damaged, and relative paths work.
    r = run_cli_subprocess("ckpt", "inspect", "6", "--json", cwd=tmp_path)
    assert one_line_error(r).startswith("error: checkpoint 6: truncated file ")
    assert json.loads(r.stdout)["problems"][0].startswith("truncated file ")


def test_reshard_bad_inputs(saved_run, tmp_path, one_line_error, run_cli_subprocess, ckpt_model_yaml):
    _, root = saved_run
    indivisible = tmp_path / "ind.yaml"
    indivisible.write_text(ckpt_model_yaml + "mesh: {shape: {data: 1, tensor: 8}, devices: 8}\nrules: tp\n")
    line = one_line_error(run_cli_subprocess("ckpt", "reshard", root, "--config", indivisible, "--out", tmp_path / "o"))
    assert line.startswith(
        f"error: {indivisible}:3: rules: params/blocks/attn/k, params/blocks/attn/v: dim 2 ('kv_heads', size 4) is "
        "not divisible by mesh axes ('tensor',) of size 8"
    )
    # The same message `partitioning check` gives for that config (the init's layout step).
    assert one_line_error(run_cli_subprocess("check", indivisible)) == line
    other = tmp_path / "other.yaml"
    other.write_text(
        ckpt_model_yaml.replace("mlp: 64", "mlp: 128") + "mesh: {shape: {data: 1, fsdp: 8}, devices: 8}\nrules: fsdp\n"
    )
    line = one_line_error(run_cli_subprocess("ckpt", "reshard", root, "--config", other, "--out", tmp_path / "o"))
    assert line.startswith(
        f"error: checkpoint {root / 'checkpoints' / '6'} does not fit the model (3 of 12 arrays differ): "
        "params/blocks/mlp/wi_0: checkpoint (2, 32, 64) vs model (2, 32, 128)"
    )
    assert not (tmp_path / "o").exists()
