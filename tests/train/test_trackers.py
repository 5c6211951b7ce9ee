"""Trackers (partitioning.train.trackers), the loss-plot hook and the loop's plain log lines and MFU."""

import types

import jax
import jax.numpy as jnp
import pytest

from partitioning.train.hooks import JsonlLogger
from partitioning.train.loop import fit, format_line
from partitioning.train.plots import LossPlot
from partitioning.train.trackers import TensorBoardLogger, WandbLogger, scalars, tag


def _events(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}


def _state(step):
    return types.SimpleNamespace(step=jnp.asarray(step, jnp.int32))


def test_tags_group_metrics_as_tensorboard_shows_them():
    assert [tag(k) for k in ("loss", "eval_loss", "lr", "tokens_per_s", "mfu", "eval_accuracy")] == [
        "train/loss",
        "eval/loss",
        "train/lr",
        "perf/tokens_per_s",
        "perf/mfu",
        "eval/accuracy",
    ]
    assert scalars({"step": 3, "loss": 2.0, "grad_norm": float("nan"), "note": "x", "ok": True}) == {"train/loss": 2.0}


def test_a_resumed_run_replaces_the_events_after_the_restored_step(tmp_path):
    first = TensorBoardLogger(tmp_path)
    first.on_start(_state(0))
    for step in (1, 2, 3, 4):
        first.on_step_end(step, None, {"loss": 10.0 + step})
    first.on_exit(None, "preempted")
    resumed = TensorBoardLogger(tmp_path)  # restored from the checkpoint of step 2
    resumed.on_start(_state(2))
    for step in (3, 4, 5):
        resumed.on_step_end(step, None, {"loss": 20.0 + step, "eval_loss": 1.0})
    resumed.on_exit(None, "done")
    events = _events(tmp_path)
    assert events["train/loss"] == {1: 11.0, 2: 12.0, 3: 23.0, 4: 24.0, 5: 25.0}
    assert events["eval/loss"] == {3: 1.0, 4: 1.0, 5: 1.0}


def test_wandb_offline_logs_the_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    hook = WandbLogger(tmp_path / "run", config={"train": {"steps": 2}})
    hook.on_start(_state(0))
    run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
    hook.on_step_end(1, None, {"loss": 3.0, "tokens_per_s": 10.0})
    hook.on_step_end(2, None, {"loss": 2.5, "eval_loss": 2.7})
    assert hook.run.id == run_id and dict(hook.run.config)["train"] == {"steps": 2}
    hook.on_exit(None, "done")
    assert list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert wandb.run is None
    wandb.teardown()  # stop W&B's background service now, not when pytest exits


def test_fit_logs_tflops_and_mfu_and_prints_one_line_per_logged_step(mlp_fsdp, tokens, batches, tmp_path, capsys):
    logger = JsonlLogger(None)
    plot = LossPlot(logger, tmp_path / "loss.png", title="t")
    fit(
        mlp_fsdp,
        mlp_fsdp.init(jax.random.key(0)),
        batches(mlp_fsdp, tokens),
        steps=4,
        log_every=2,
        hooks=[logger, plot],
        progress="lines",
        flops_per_step=2e9,
        peak_tflops=0.5,
    )
    recs = logger.records
    assert [r["step"] for r in recs] == [1, 2, 4]
    for r in recs:
        assert r["tflops_per_device"] == pytest.approx(2e9 / r["step_time_s"] / 1e12)
        assert r["mfu"] == pytest.approx(r["tflops_per_device"] / 0.5)
    out = capsys.readouterr().out
    assert "\r" not in out
    assert out.splitlines() == [format_line(r, 4) for r in recs]
    assert "MFU" in out.splitlines()[0] and (tmp_path / "loss.png").exists()
    assert not list(tmp_path.glob("*.jsonl"))  # no path: records in memory only


def test_fit_measures_flops_from_the_trainer(mlp_fsdp, tokens, batches):
    logger = JsonlLogger(None)
    fit(mlp_fsdp, mlp_fsdp.init(jax.random.key(0)), batches(mlp_fsdp, tokens), steps=1, hooks=[logger], progress=False)
    flops = mlp_fsdp.step_flops()
    assert flops > 0 and "mfu" not in logger.records[0]  # no peak for CPUs
    assert logger.records[0]["tflops_per_device"] == pytest.approx(flops / logger.records[0]["step_time_s"] / 1e12)


def test_format_line():
    line = format_line(
        {
            "step": 10,
            "loss": 3.21,
            "eval_loss": 3.3,
            "lr": 3e-3,
            "tokens_per_s": 12345.0,
            "tflops_per_device": 0.52,
            "mfu": 0.031,
            "step_time_s": 0.08,
        },
        200,
    )
    assert line == (
        "step 10/200  loss 3.21  eval_loss 3.3  lr 0.003  12,345 tok/s  0.52 TFLOP/s/device  MFU 3.1%  0.08 s/step"
    )
