"""Every ``auto`` default resolved at run start (partitioning/config/defaults.py): measured where it pays, cached,
estimated otherwise, each in one line; what the run computes is what naming the choice computes."""

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

from partitioning.config.build import mesh_from_config
from partitioning.config.defaults import Trial, resolve_defaults
from partitioning.config.load import load_config

CONFIG = """model: {name: gpt, vocab_size: 256, embed: 32, heads: 2, mlp: 64, layers: 2}
mesh: {shape: {data: 1, fsdp: -1}, devices: 8}
rules: fsdp
train: {steps: 3, batch_size: 8, seq_len: 16, log_every: 1, eval_every: 0, tracker: [jsonl]}
"""


def _cli(*args) -> tuple[int, str, str]:
    from partitioning.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """The tests' own cache (the CPU measured once for all): an estimate is never a verdict a run cached."""
    monkeypatch.setenv("PARTITIONING_CACHE", str(tmp_path_factory.getbasetemp() / "estimates"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 3-step run three times: measured (train.measure_defaults: true), again (the verdict cached), and
    with the measured policy named in the config."""
    root = tmp_path_factory.mktemp("defaults")
    mp = pytest.MonkeyPatch()
    mp.setenv("PARTITIONING_CACHE", str(root / "cache"))
    config = root / "run.yaml"
    config.write_text(CONFIG)
    try:
        first = _cli(
            "train",
            config,
            "--no-progress",
            "--set",
            "train.measure_defaults=true",
            "--set",
            "run_dir=" + str(root / "a"),
        )
        again = _cli(
            "train",
            config,
            "--no-progress",
            "--set",
            "train.measure_defaults=true",
            "--set",
            "run_dir=" + str(root / "b"),
        )
        line = next(x for x in first[1].splitlines() if x.startswith("remat: auto -> "))
        policy = line.removeprefix("remat: auto -> ").split(":")[0]
        named = _cli(
            "train", config, "--no-progress", "--set", f"model.remat={policy}", "--set", "run_dir=" + str(root / "c")
        )
    finally:
        mp.undo()  # the other tests keep their own cache
    yield {"root": root, "first": first, "again": again, "named": named, "policy": policy, "line": line}


def test_train_times_the_policies_and_says_which_won_by_how_much(runs):
    code, out, err = runs["first"]
    assert code == 0, err
    line, policy = runs["line"], runs["policy"]
    assert policy in ("none", "dots", "dots_no_batch", "full")
    assert re.match(
        rf"remat: auto -> {policy}: measured, (the fastest|within \d\.\d% of the fastest) of \d policies", line
    )
    others = [p for p in ("none", "dots", "dots_no_batch", "full") if p != policy and f" {p} " in line]
    assert others and all("%" in line.split(f" {p} ")[1].split(")")[0] for p in others)  # each one's margin
    assert "; CPU time per simulated device" in line and " steps each in " in line and "budget 3 s each)" in line
    cached = Path(line.rsplit("; cached in ", 1)[1])
    assert cached.parent == runs["root"] / "cache" / "defaults" and json.loads(cached.read_text())["choice"] == policy
    assert len([x for x in out.splitlines() if x.startswith("remat: auto")]) == 1


def test_the_next_run_reads_the_verdict_and_computes_what_naming_the_policy_computes(runs):
    code, out, err = runs["again"]
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("remat: auto -> "))
    cached = runs["line"].rsplit("; cached in ", 1)[1]
    assert line.startswith(runs["line"].split(" per step ")[0])  # the same verdict, its numbers
    assert line.endswith(f"; from the cache {cached}") and " steps each in " not in line
    assert runs["named"][0] == 0 and not any(x.startswith("remat:") for x in runs["named"][1].splitlines())
    root = runs["root"]
    losses = _losses(root / "a")
    assert len(losses) == 3 and losses == _losses(root / "b") == _losses(root / "c")
    recorded = (root / "a" / "config.yaml").read_text()
    assert f"remat: {runs['policy']}" in recorded and "grad_accum: 1" in recorded


def test_a_short_run_is_estimated_and_says_why(tmp_path):
    (tmp_path / "run.yaml").write_text(CONFIG.replace("steps: 3", "steps: 20"))
    cfg = load_config(str(tmp_path / "run.yaml"))
    trial = Trial(batch=lambda: pytest.fail("a short run times nothing"))
    d = resolve_defaults(cfg, mesh_from_config(cfg), trial)
    [note] = d.notes()
    assert note.startswith(f"remat: auto -> {d.cfg.model_options['remat']}: the fastest of 4 policies, est. ")
    assert note.endswith(
        "; estimated, not measured: a 20-step run is too short to pay for timing 4 policies "
        "(train.measure_defaults: true times them anyway)"
    )
    assert cfg.model_options.get("remat") is None and d.cfg.train.grad_accum == 1  # the config itself left alone
    off = resolve_defaults(
        load_config(str(tmp_path / "run.yaml"), ["train.measure_defaults=false"]), mesh_from_config(cfg), trial
    )
    assert off.notes()[0].endswith("; estimated, not measured: train.measure_defaults is false")


def test_nothing_is_timed_or_written_when_a_check_fails(tmp_path, monkeypatch):
    (tmp_path / "run.yaml").write_text(CONFIG + "data: {path: missing.txt}\nrun_dir: out\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli("train", "run.yaml", "--set", "train.measure_defaults=true")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "missing.txt" in err
    assert not (tmp_path / "out").exists() and not (Path(os.environ["PARTITIONING_CACHE"]) / "defaults").exists()


def test_grad_accum_auto_accumulates_when_one_pass_does_not_fit(tmp_path):
    # Float32 GPT, 32 x 64 tokens on 8 devices: every remat policy needs more than 1.5 MB per device in one pass
    # (full: 2.2 MB, estimated); two micro-batches of 16 rows take 1.3 MB.
    (tmp_path / "run.yaml").write_text(CONFIG.replace("batch_size: 8, seq_len: 16", "batch_size: 32, seq_len: 64"))
    cfg = load_config(str(tmp_path / "run.yaml"), ["mesh.device_memory=1500000"])
    d = resolve_defaults(cfg, mesh_from_config(cfg))
    assert (d.cfg.model_options["remat"], d.cfg.train.grad_accum) == ("full", 2)
    remat, accum = d.notes()
    assert remat.startswith("remat: auto -> full: the smallest peak (none fits) of 4 policies, est. ")
    assert accum.startswith("grad_accum: auto -> 2: est. ") and "(fastest that fits; peak 1.17 MiB), 1 " in accum
    assert accum.endswith("; estimated, not measured: the others are priced over 1.1x slower")
    fits = resolve_defaults(load_config(str(tmp_path / "run.yaml")), mesh_from_config(cfg))
    assert fits.cfg.train.grad_accum == 1 and len(fits.notes()) == 1  # one pass fits: 1, without a line


def test_pipeline_micro_batches_are_a_default_too(tmp_path):
    (tmp_path / "run.yaml").write_text(
        CONFIG.replace("{data: 1, fsdp: -1}", "{stage: 2, data: 4}")
        .replace("rules: fsdp", "rules: pp")
        .replace("batch_size: 8", "batch_size: 64")
    )
    cfg = load_config(str(tmp_path / "run.yaml"))
    d = resolve_defaults(cfg, mesh_from_config(cfg))
    [note] = [n for n in d.notes() if n.startswith("microbatches: ")]
    m = d.cfg.train.microbatches
    assert m in (2, 4, 8, 16) and note.startswith(f"microbatches: auto -> {m}: est. ")
    assert all(f" {k} " in note for k in (2, 4, 8, 16) if k != m)  # every count the batch divides into, priced
