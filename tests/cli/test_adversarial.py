"""An adversarial corpus: bad YAML, bad command lines, bad paths and damaged checkpoints, as a user or a
cluster makes them. Every one: exit 2, one line naming where (file:line and dotted key, the flag, the
path), no traceback, and nothing on disk changed. Paths are given as users type them: relative, with
`..`, through a symlink — each behaves as its absolute form."""

import shutil
from pathlib import Path

import pytest

from partitioning.checkpoint import save_checkpoint
from tests.conftest import CliResult

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

GOOD = """\
model: {name: gpt, vocab_size: 64, embed: 32, heads: 4, mlp: 64, layers: 2}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {steps: 2, batch_size: 8, seq_len: 8}
"""


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_dir() or p.read_bytes()) for p in sorted(root.rglob("*"))}


def refused(run, root: Path, *argv) -> str:
    """Runs the CLI; asserts exit 2, one line, no traceback, nothing changed under root; returns the line."""
    before = snapshot(root)
    r = run(*argv)
    assert r.returncode == 2, (argv, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("simulating ")]
    assert len(lines) == 1, (argv, r.stderr)
    assert lines[0].startswith("error: ")
    assert snapshot(root) == before, argv
    return lines[0][len("error: ") :]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- YAML -----------------------------------------------------------------------------------------------

DEEP_BLOCK = "model:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(300))

YAML_CASES = [
    (
        "train:\n  steps: 3\n  batch_size: 8\n  steps: 4\n",
        "run.yaml:4: train.steps: key appears twice (first at line 2)",
    ),
    ("data: {path: a.txt, path: b.txt}\n", "run.yaml:1: data.path: key appears twice (first at line 1)"),
    ("rules:\n  - [batch, data]\n  - {x: 1, x: 2}\n", "run.yaml:3: rules[1].x: key appears twice (first at line 3)"),
    ("train:\n  steps: 3\n  ? [a, b]\n  : 1\n", "run.yaml:3: train: keys must be names (strings), got a list"),
    (
        "optimizer:\n  lr: 0.1\n  ? {a: 1}\n  : 1\n",
        "run.yaml:3: optimizer: keys must be names (strings), got a mapping",
    ),
    ("train:\n  1: x\n", "run.yaml:2: train: keys must be names (strings), got int 1"),
    ("train:\n  null: x\n", "run.yaml:2: train: keys must be names (strings), got null"),
    ("model: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "run.yaml:1: nested more than 64 levels deep"),
    ("x: 1\n" + "y: " + "[" * 100 + "]" * 100 + "\n", "run.yaml:2: nested more than 64 levels deep"),
    (DEEP_BLOCK, "run.yaml:65: nested more than 64 levels deep"),
    ("model:\n\tname: gpt\n", "run.yaml:2: invalid YAML: found character '\\t' that cannot start any token"),
    ("model: *nope\n", "run.yaml:1: invalid YAML: found undefined alias 'nope'"),
    ("", "run.yaml: missing required sections 'model', 'mesh', 'rules'"),
    ("- a\n- b\n", "run.yaml: a run config is a mapping with sections model, mesh, rules"),
    ("just words\n", "run.yaml: a run config is a mapping with sections model, mesh, rules"),
]


@pytest.mark.parametrize("text, error", YAML_CASES)
def test_bad_yaml(here, run_cli_in_process, text, error):
    Path("run.yaml").write_text(text)
    assert refused(run_cli_in_process, here, "check", "run.yaml") == error


VALUE_CASES = [
    ("train: {on_nonfinite: skip}\n", "run.yaml:4: train.on_nonfinite: must be one of stop, skip_step, got 'skip'"),
    (
        "checkpoint: {on_error: ignore}\n",
        "run.yaml:4: checkpoint.on_error: must be one of stop, continue, got 'ignore'",
    ),
    ("checkpoint: {verify: 'yes'}\n", "run.yaml:4: checkpoint.verify: expected true or false, got str 'yes'"),
]


@pytest.mark.parametrize("extra, error", VALUE_CASES)
def test_bad_fault_settings(here, run_cli_in_process, extra, error):
    Path("run.yaml").write_text(GOOD.replace("train: {steps: 2, batch_size: 8, seq_len: 8}\n", "") + extra)
    assert refused(run_cli_in_process, here, "check", "run.yaml").startswith(error)


# -- the command line -------------------------------------------------------------------------------------

# A bare `partitioning` (or `partitioning ckpt`) lists its commands and exits 0: tests/cli/test_first_hour.py.
ARGV_CASES = [
    (["ckpt", "inspcet", "x"], "did you mean 'inspect'?"),
    (["ckpt", "inspect", "x", "--step", "abc"], "argument --step: invalid int value: 'abc'"),
    (["check", "run.yaml", "--set", "train..steps=3"], "--set train..steps=3: 'train..steps' is not a key"),
    (["check", "run.yaml", "--set", "=3"], "--set =3: '' is not a key"),
    (
        ["check", "run.yaml", "--set", "trian.steps=3"],
        "--set trian.steps=3: unknown key 'trian'; did you mean 'train'?",
    ),
    (["check", "run.yaml", "--devices", "0"], "--devices must be a positive number of devices, got 0"),
    (["check", "nope.yaml"], "nope.yaml: no such config file"),
    (["check", "../nope/run.yaml"], "../nope/run.yaml: no such config file"),
    (["check", "."], ".: is a folder, not a config file"),
    (
        [
            "train",
            "run.yaml",
            "--coordinator",
            "127.0.0.1:1",
            "--num-processes",
            "2",
            "--process-id",
            "0",
            "--peer-timeout",
            "0",
        ],
        "--peer-timeout must be a positive number of seconds, got 0",
    ),
]


@pytest.mark.parametrize("argv, error", ARGV_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_command_lines(here, capsys, argv, error):
    from partitioning.cli import main

    def run(*args):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    Path("run.yaml").write_text(GOOD)
    got = refused(run, here, *argv)
    assert error in got, got


# -- paths and damaged checkpoints ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, ckpt_setup, mesh_of):
    """A run dir holding one complete checkpoint of the small GPT (written through the manager)."""
    s = ckpt_setup()
    root = tmp_path_factory.mktemp("pristine")
    save_checkpoint(root / "run" / "checkpoints", 4, s.state(mesh_of({"data": 1, "fsdp": 8}), "fsdp", step=4))
    return root / "run"


@pytest.fixture
def tree(pristine, tmp_path, monkeypatch):
    """tmp_path/a/b (the cwd) beside tmp_path/run (a copy of the pristine run) and tmp_path/link -> run."""
    shutil.copytree(pristine, tmp_path / "run")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    return tmp_path


@pytest.mark.parametrize("form", ["../../run", "../../link", "../../a/../run", "ABS"])
def test_every_path_form_reads_like_the_absolute_one(tree, run_cli_in_process, form):
    path = str(tree / "run") if form == "ABS" else form
    r = run_cli_in_process("ckpt", "inspect", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"checkpoint {path}/checkpoints/4: step 4, 38 arrays, ")
    assert r.stdout.splitlines()[0].endswith("files: OK")
    r = run_cli_in_process("ckpt", "ls", path)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("latest complete step: 4")


def _chunk(step: Path) -> tuple[Path, int]:
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "file", "path": str(step / "state") + "/"}).result()
    root = ts.ocdbt.dump(kv).result()["versions"][-1]["root"]["location"]
    e = next(e for e in ts.ocdbt.dump(kv, root).result()["entries"] if "indirect_value" in e)
    head, off, n = e["indirect_value"].rsplit(":", 2)
    _, base, rel = head.split(":", 2)
    return step / "state" / base / rel, int(off) + int(n) // 2


def _flip(f: Path, at: int) -> None:
    b = bytearray(f.read_bytes())
    b[at] ^= 1
    f.write_bytes(bytes(b))


def _largest(step: Path) -> Path:
    return max((p for p in (step / "state").rglob("d/*") if p.is_file()), key=lambda p: p.stat().st_size)


DAMAGE = {
    "no _METADATA": (
        lambda s: (s / "state" / "_METADATA").unlink(),
        "missing file ../../run/checkpoints/4/state/_METADATA",
    ),
    "truncated _METADATA": (
        lambda s: (s / "state" / "_METADATA").write_bytes((s / "state" / "_METADATA").read_bytes()[:50]),
        "damaged file ../../run/checkpoints/4/state/_METADATA",
    ),
    "no manifest": (lambda s: (s / "state" / "manifest.ocdbt").unlink(), "manifest.ocdbt"),
    "garbage manifest": (lambda s: (s / "state" / "manifest.ocdbt").write_bytes(b"\0" * 40), "manifest.ocdbt"),
    "truncated data file": (lambda s: _largest(s).write_bytes(_largest(s).read_bytes()[:100]), "truncated file"),
    "missing data file": (lambda s: _largest(s).unlink(), "missing file"),
    "flipped bit": (lambda s: _flip(*_chunk(s)), ": checksum mismatch in slice ["),
    "no meta JSON": (
        lambda s: (s / "meta" / "metadata").unlink(),
        "missing file ../../run/checkpoints/4/meta/metadata",
    ),
    "garbage meta JSON": (
        lambda s: (s / "meta" / "metadata").write_text("{"),
        "damaged file ../../run/checkpoints/4/meta/metadata",
    ),
    "garbage checksums": (
        lambda s: (s / "meta" / "checksums.0.json").write_text("{"),
        "damaged file ../../run/checkpoints/4/meta/checksums.0.json",
    ),
    "no state dir": (lambda s: shutil.rmtree(s / "state"), "missing directory ../../run/checkpoints/4/state"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoints_are_one_line_naming_the_file(tree, run_cli_in_process, damage):
    hurt, expected = DAMAGE[damage]
    step = tree / "run" / "checkpoints" / "4"
    hurt(step)
    got = refused(run_cli_in_process, tree, "ckpt", "inspect", "../../run/checkpoints/4")
    assert expected in got, got
    assert got.startswith(("checkpoint ../../run/checkpoints/4", "../../run/checkpoints/4")), got


def test_paths_that_name_no_checkpoint(tree, run_cli_in_process):
    (tree / "empty").mkdir()
    (tree / "file.txt").write_text("x")
    (tree / "run" / "checkpoints" / "8.orbax-checkpoint-tmp-1").mkdir()
    assert refused(run_cli_in_process, tree, "ckpt", "inspect", "../../nope") == (
        "../../nope: no such checkpoint (expected a run dir, a checkpoints dir or a step dir)"
    )
    assert refused(run_cli_in_process, tree, "ckpt", "ls", "../../nope") == "../../nope: no such checkpoint directory"
    assert "no complete checkpoint" in refused(run_cli_in_process, tree, "ckpt", "inspect", "../../empty")
    assert refused(run_cli_in_process, tree, "ckpt", "inspect", "../../run", "--step", "9") == (
        "../../run/checkpoints: no complete checkpoint for step 9 (steps: 4)"
    )
    assert "this save never finished" in refused(
        run_cli_in_process, tree, "ckpt", "inspect", "../../run/checkpoints/8.orbax-checkpoint-tmp-1"
    )


def test_reshard_with_an_impossible_config_names_it(tree, run_cli_in_process, ckpt_model_yaml):
    Path("new.yaml").write_text(ckpt_model_yaml + "mesh: {shape: {data: 3, fsdp: 5}, devices: 8}\nrules: fsdp\n")
    got = refused(run_cli_in_process, tree, "ckpt", "reshard", "../../link", "--config", "new.yaml", "--out", "../../o")
    assert got.startswith("new.yaml:2: mesh.shape: mesh {data: 3, fsdp: 5} needs 15 devices, but there are 8")
    Path("new.yaml").write_text(ckpt_model_yaml + "mesh: {shape: {data: 1, fsdp: 3}, devices: 3}\nrules: fsdp\n")
    got = refused(run_cli_in_process, tree, "ckpt", "reshard", "../../run", "--config", "new.yaml", "--out", "../../o")
    assert got.startswith("new.yaml:3: rules: params/blocks/attn/k, params/blocks/attn/q, params/blocks/attn/v, ")
    assert "dim 1 ('embed', size 32) is not divisible by mesh axes ('fsdp',) of size 3" in got
