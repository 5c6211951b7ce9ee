"""The `data:` section from a user's chair: token arrays train, and a missing, empty, unreadable,
wrongly-typed or too-small dataset — or a token outside the model's vocabulary — is one line naming the
file and the config key (file:line), exit 2, found by the pre-flight before anything compiles or is
written."""

import json
from pathlib import Path

import numpy as np
import pytest

from partitioning.data.corpus import load_corpus

CONFIG = """\
model:
  name: mlp
  vocab_size: 64
  embed: 32
  mlp: 64
  layers: 1
mesh:
  shape: {data: 1, fsdp: -1}
  devices: 8
  device_memory: 80GiB
rules: fsdp
train: {steps: 4, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 2, eval_batches: 1}
data:
"""
DATA_LINE = 13  # the line of `data:`; its keys follow


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    load_corpus.cache_clear()
    yield tmp_path
    load_corpus.cache_clear()


@pytest.fixture
def no_compile(monkeypatch):
    """Fails the test if anything compiles the step (the budget above would make the pre-flight compile)."""
    from partitioning.train.step import Trainer

    def refuse(self, *a, **k):
        raise AssertionError("compiled before the data was checked")

    monkeypatch.setattr(Trainer, "lower_train_step", refuse)


def write_config(data: str) -> str:
    Path("run.yaml").write_text(CONFIG + "".join(f"  {line}\n" for line in data.strip().splitlines()))
    return "run.yaml"


def tokens(name: str, n: int = 5000, high: int = 64, dtype=np.uint16) -> None:
    arr = np.random.default_rng(0).integers(0, high, n).astype(dtype)
    if name.endswith(".npy"):
        np.save(name, arr)
    else:
        arr.tofile(name)


CASES = [
    # (files to make, data: section, expected error after "error: ")
    ([], "path: nope.npy", f"run.yaml:{DATA_LINE + 1}: data.path: 'nope.npy': no such file or folder"),
    (["empty.npy:0"], "path: empty.npy", f"run.yaml:{DATA_LINE + 1}: data.path: 'empty.npy': holds no tokens"),
    (
        ["floats.npy"],
        "path: floats.npy",
        f"run.yaml:{DATA_LINE + 1}: data.path: 'floats.npy': holds float32 values; token arrays need an integer dtype",
    ),
    (
        ["train.bin"],
        "path: train.bin",
        f"run.yaml:{DATA_LINE}: data.dtype: 'train.bin': a .bin file has no header; say its dtype (e.g. uint16 for "
        f"GPT-2 tokens)",
    ),
    (
        ["train.bin:5001"],
        "path: train.bin\ndtype: int64",
        f"run.yaml:{DATA_LINE + 2}: data.dtype: 'train.bin': 10,002 bytes is not a whole number of int64 tokens "
        f"(8 bytes each); is the dtype right?",
    ),
    (
        ["train.npy"],
        "path: train.npy\nsource: text",
        f"run.yaml:{DATA_LINE + 1}: data.path: 'train.npy': binary data, not text; for token arrays (.npy, .bin) use "
        f"source: tokens",
    ),
    (
        ["small.npy:100"],
        "path: small.npy",
        f"run.yaml:{DATA_LINE + 1}: data.path: small.npy (train): 95 tokens make only 5 windows of 17 tokens, fewer "
        f"than the batch size 8; use more data or smaller train.batch_size / train.seq_len",
    ),
    (
        ["train.npy", "val.npy:100"],
        "path: train.npy\neval_path: val.npy",
        f"run.yaml:{DATA_LINE + 2}: data.eval_path: val.npy (eval): 100 tokens make only 6 windows of 17 tokens, "
        f"fewer than the batch size 8; use more data or smaller train.batch_size / train.seq_len",
    ),
    (
        ["big.npy:5000:70"],
        "path: big.npy",
        f"run.yaml:{DATA_LINE + 1}: data.path: big.npy: token 67 at index 14 is outside the model's vocabulary "
        f"[0, 64) (run.yaml:3: model.vocab_size)",
    ),
    (
        ["train.npy", "val.npy:5000:99"],
        "path: train.npy\neval_path: val.npy",
        f"run.yaml:{DATA_LINE + 2}: data.eval_path: val.npy: token 84 at index 0 is outside the model's vocabulary "
        f"[0, 64) (run.yaml:3: model.vocab_size)",
    ),
    (
        ["train.npy"],
        "path: train.npy\ndtype: float16",
        f"run.yaml:{DATA_LINE + 2}: data.dtype: must be one of uint8, uint16, uint32, uint64, int8, int16, int32, "
        "int64, "
        f"got 'float16'",
    ),
    (
        ["train.bin"],
        "path: train.bin\ndtype: int64",  # uint16 tokens read as int64: nonsense, caught
        f"run.yaml:{DATA_LINE + 1}: data.path: train.bin: token 4785212045656118 at index 0 is outside the model's "
        f"vocabulary [0, 64)",
    ),
]


def _make(spec: str) -> None:
    name, *rest = spec.split(":")
    n, high = (int(rest[0]) if rest else 5000), (int(rest[1]) if len(rest) > 1 else 64)
    if name.startswith("floats"):
        np.save(name, np.zeros(n, np.float32))
    else:
        tokens(name, n, high)


@pytest.mark.parametrize("files, data, error", CASES, ids=[c[1].split("\n")[0] + f"-{i}" for i, c in enumerate(CASES)])
def test_bad_data_is_one_line_at_the_config_key_before_compiling(
    in_tmp, run_cli_in_process, one_line_error, no_compile, files, data, error
):
    for spec in files:
        _make(spec)
    write_config(data)
    for command in ("check", "train"):
        line = one_line_error(run_cli_in_process(command, "run.yaml"))
        assert line.startswith("error: " + error), line
    assert not Path("runs").exists()  # refused before anything was written


def test_token_arrays_train_and_the_checkpoint_records_the_data_position(in_tmp, run_cli_in_process):
    tokens("train.bin", 6000)
    tokens("val.bin", 1000)
    write_config("path: train.bin\neval_path: val.bin\ndtype: uint16\nseed: 5\nlog_batches: true")
    r = run_cli_in_process("train", "run.yaml", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "data train.bin: 6,000 train / 1,000 eval tokens" in r.stdout
    from partitioning.checkpoint import checkpoint_metadata

    meta = checkpoint_metadata("runs/run/checkpoints")
    assert meta["step"] == 4
    assert meta["data"] == {
        "position": "step",
        "source": None,
        "path": "train.bin",
        "eval_path": "val.bin",
        "dtype": "uint16",
        "seed": 5,
        "batch_size": 8,
        "seq_len": 16,
    }
    records = [json.loads(line) for line in Path("runs/run/batches.0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    # the digests are those of the pure function of (seed, step)
    from partitioning.data.order import batch_digest

    expected = load_corpus("train.bin", dtype="uint16", eval_path="val.bin").batches("train", 8, 16, seed=5)
    assert records[2]["rows"] == batch_digest(expected.batch_at(2))

    # Resuming with another seed says so: the batches from here on differ from the saved run's.
    r = run_cli_in_process("train", "run.yaml", "--no-progress", "--set", "train.steps=5", "--set", "data.seed=6")
    assert r.returncode == 0, r.stderr
    assert (
        "data: changed since the checkpoint (seed 5 -> 6): the steps from here on see other batches than the "
        "saved run would have"
    ) in r.stdout


def test_a_target_that_returns_a_corpus_is_token_data(in_tmp, run_cli_in_process, one_line_error):
    tokens("train.npy", 5000)
    write_config("_target_: partitioning.data.corpus.load_corpus\npath: train.npy\nseed: 3")
    r = run_cli_in_process("check", "run.yaml")
    assert r.returncode == 0, r.stderr
    write_config("_target_: partitioning.data.corpus.load_corpus\npath: nope.npy")
    assert (
        one_line_error(run_cli_in_process("check", "run.yaml"))
        == f"error: run.yaml:{DATA_LINE + 2}: data.path: 'nope.npy': no such file or folder"
    )
