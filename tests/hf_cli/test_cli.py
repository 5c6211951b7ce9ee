"""A Hugging Face checkpoint from YAML and the command line (its main, in this process), with relative paths.

One run of ``configs/hf_tiny.yaml`` (a tiny Llama made by transformers, trained on the
stdlib tokenized with its own tokenizer), in a copy of the repository's layout, is trained,
resumed, exported and made to talk in one test: its stages depend on each other, and one
test stays on one xdist worker, so the run is trained once.
"""

import contextlib
import io
import json
import os
import shutil
import sysconfig
from pathlib import Path

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import CliResult

REPO = Path(__file__).resolve().parents[2]
FIXTURE = "tests/fixtures/hf/llama"
STEPS = ["--set", "train.steps=20", "--set", "train.eval_every=10", "--set", "train.tracker=[jsonl]"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder laid out like the repository (configs/, tests/fixtures/hf/llama) and a token cache of its own."""
    root = tmp_path_factory.mktemp("hf_cli")
    (root / "configs").mkdir()
    shutil.copy(REPO / "configs" / "hf_tiny.yaml", root / "configs")
    shutil.copytree(REPO / FIXTURE, root / FIXTURE)
    return root


def cli(work: Path, *args: str) -> CliResult:
    """``partitioning ARGS`` from ``work``: the CLI's main in this process (8 simulated devices), output captured."""
    from partitioning.cli import main

    jax.devices()  # the backend is up: no "simulating" line from whichever call comes first
    out, err = io.StringIO(), io.StringIO()
    here, cache = os.getcwd(), os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
        if cache is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = cache
    return CliResult(code, out.getvalue(), err.getvalue())


def error_line(r: CliResult) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("simulating", "data: "))]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def records(work: Path) -> list[dict]:
    return [json.loads(x) for x in (work / "runs/hf_tiny/metrics.jsonl").read_text().splitlines()]


def test_fine_tune_resume_export_generate(work, monkeypatch, capsys):
    trained = cli(work, "train", "configs/hf_tiny.yaml", "--no-progress", *STEPS)
    assert trained.returncode == 0, trained.stderr[-3000:]
    check_train(work, trained)
    check_resume(work)
    check_export(work, monkeypatch)
    check_bad_exports(work, monkeypatch, capsys)
    check_generate(work)


def check_train(work, trained):
    """Train starts from the weights, on the checkpoint's tokens; the loss falls; the source is recorded."""
    assert "train: starting from the Hugging Face weights in tests/fixtures/hf/llama" in trained.stdout
    assert "tokens (tokenizer tests/fixtures/hf/llama/tokenizer.json)" in trained.stdout
    evals = [r["eval_loss"] for r in records(work) if "eval_loss" in r]
    assert [r["step"] for r in records(work) if "eval_loss" in r] == [1, 10, 20]
    assert evals[-1] < evals[0] - 1.0, evals  # ~6.3 -> ~4.3 nats per token of the checkpoint's tokenizer
    meta = json.loads((work / "runs/hf_tiny/checkpoints/20/meta/metadata").read_text())
    assert meta["hf"]["source"] == str((work / FIXTURE).resolve())
    assert meta["hf"]["config"]["architectures"] == ["LlamaForCausalLM"]
    options = meta["hf"]["options"]
    # remat: auto is resolved by the run (which policy is fastest depends on the machine); export rebuilds with it.
    assert options.pop("remat") in ("none", "full", "dots", "dots_no_batch")
    assert options == {
        "scan_layers": True,
        "dtype": None,
        "param_dtype": None,
        "capacity_factor": None,
        "attention": "xla",
        "context_parallel": "auto",
    }
    assert meta["data"]["tokenizer"]  # the digest of the tokenizer the text was cut with


def check_resume(work):
    """A resume reads the run's own checkpoint, not the weights (they are gone meanwhile)."""
    weights = work / FIXTURE / "model.safetensors"
    weights.rename(weights.with_suffix(".away"))
    try:
        r = cli(work, "train", "configs/hf_tiny.yaml", "--no-progress", *STEPS, "--set", "train.steps=24")
    finally:
        weights.with_suffix(".away").rename(weights)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checkpoint: resumed from step 20" in r.stdout
    assert "starting from the Hugging Face weights" not in r.stdout
    assert records(work)[-1]["step"] == 24


def check_export(work, monkeypatch):
    """The export loads back with the run's eval loss, on the run's own eval batches."""
    r = cli(work, "ckpt", "export-hf", "runs/hf_tiny", "exported", "--step", "20")
    assert r.returncode == 0, r.stderr[-3000:]
    files = "config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json"
    assert r.stdout.strip() == f"exported step 20 of runs/hf_tiny to exported: {files}"
    assert not [p for p in work.iterdir() if p.name.startswith(".exported")]  # no temporary folder left

    # The exported checkpoint, loaded as a user would, on the run's own eval batches: the run's eval loss.
    from partitioning.config import load_config
    from partitioning.config.build import mesh_from_config, trainer_from_config
    from partitioning.config.hf import hf_params_from_config
    from partitioning.config.run import data_from_config

    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(work / "cache"))
    cfg = load_config("configs/hf_tiny.yaml", [*STEPS[1::2], "model.hf=exported"])
    mesh = mesh_from_config(cfg)
    trainer = trainer_from_config(cfg, mesh)
    corpus, _, evals = data_from_config(cfg, trainer)
    params = hf_params_from_config(cfg, mesh)
    loss = np.mean([float(trainer.eval_step(params, b)["loss"]) for b in evals()])
    (trained_loss,) = [r["eval_loss"] for r in records(work) if r["step"] == 20 and "eval_loss" in r]
    assert abs(loss - trained_loss) < 1e-5, (loss, trained_loss)
    # The tokens it was trained on: each stdlib file opened by the checkpoint's BOS (1), no EOS (2).
    first = (Path(sysconfig.get_paths()["stdlib"]) / corpus.train_files[0]).read_text()
    ids = Tokenizer.from_file(str(work / FIXTURE / "tokenizer.json")).encode(first, add_special_tokens=False).ids
    assert corpus.train[: len(ids) + 2].tolist() == [1, *ids, 1]


def check_bad_exports(work, monkeypatch, capsys):
    """Bad input is one line, exit 2, nothing written."""
    assert error_line(cli(work, "ckpt", "export-hf", "runs/nothing", "out")) == "error: runs/nothing: no such run dir"
    full = work / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    line = error_line(cli(work, "ckpt", "export-hf", "runs/hf_tiny", "full"))
    assert line == "error: full: exists and is not empty; choose a new folder or pass --force to replace it"
    assert [p.name for p in full.iterdir()] == ["notes.txt"]
    # A run that did not start from a Hugging Face checkpoint: its metadata has no `hf`.
    shutil.copytree(work / "runs/hf_tiny", work / "runs/plain")
    for meta in (work / "runs/plain/checkpoints").glob("*/meta/metadata"):
        data = json.loads(meta.read_text())
        del data["hf"]
        meta.write_text(json.dumps(data))
    line = error_line(cli(work, "ckpt", "export-hf", "runs/plain", "out"))
    assert line.startswith("error: runs/plain: this run did not start from a Hugging Face checkpoint")
    assert not (work / "out").exists()
    # The same contract in this process (no interpreter start-up): a missing step, then --force.
    from partitioning.cli import main

    monkeypatch.chdir(work)
    capsys.readouterr()
    assert main(["ckpt", "export-hf", "runs/hf_tiny", "out", "--step", "7"]) == 2
    expected = "error: runs/hf_tiny/checkpoints: no complete checkpoint for step 7 (steps: 20, 24)\n"
    assert capsys.readouterr().err == expected
    assert not (work / "out").exists()
    assert main(["ckpt", "export-hf", "runs/hf_tiny", "full", "--force"]) == 0
    assert not (full / "notes.txt").exists() and (full / "model.safetensors").is_file()


def check_generate(work):
    """generate prints the decoded prompt and continuation, from the run or from the weights."""
    r = cli(work, "generate", "configs/hf_tiny.yaml", "--prompt", "def main(", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("def main(") and len(r.stdout.rstrip("\n")) > len("def main(")
    assert "generate: 8 tokens from step " in r.stderr and "greedy with a KV cache on mesh" in r.stderr
    r = cli(work, "generate", "configs/hf_tiny.yaml", "--prompt", "import", "--max-tokens", "4", "--from-hf")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("import")
    assert "generate: 4 tokens from the Hugging Face weights in tests/fixtures/hf/llama" in r.stderr


PLAN_ONLY = """\
model:
  hf: ckpt
mesh:
  shape: {data: 1, fsdp: -1, tensor: 2}
  devices: 8
rules: fsdp_tp
data:
  path: text.py
train:
  batch_size: 8
  seq_len: 32
"""


def test_plan_needs_only_config_json_and_check_refuses_what_train_refuses(work):
    folder = work / "plan_only"
    (folder / "ckpt").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no safetensors
        shutil.copy(work / FIXTURE / name, folder / "ckpt")
    (folder / "plan.yaml").write_text(PLAN_ONLY)
    (folder / "text.py").write_text("def add(x, y):\n    return x + y\n" * 400)
    # `check` makes every check `train` makes: no weights to start from is train's refusal, and check's.
    refusal = "error: plan.yaml:2: model.hf: ckpt has no *.safetensors weights (train starts from them; plan and tune"
    r = cli(folder, "check", "plan.yaml")
    assert r.returncode == 2 and refusal in r.stderr, r.stderr[-3000:]
    r = cli(folder, "plan", "plan.yaml", "--no-compile")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ckpt (39,072 parameters) on mesh {'data': 1, 'fsdp': 4, 'tensor': 2}")
    assert "params/blocks/attn/q" in r.stdout
    line = error_line(cli(folder, "train", "plan.yaml"))
    assert line.startswith(refusal)
    assert not (folder / "runs").exists()
