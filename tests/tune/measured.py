"""Training steps measured on a GPU by ``benchmarks/gpu/bench_gpu.py`` (its committed JSON), and what ``tune``
predicts for them from the config, as ``remat: auto`` and ``tune`` price it.

The benchmark's H200 runs (``benchmarks/results/gpu_h200_run{1,2}.json``) trained the 1.1B Llama-style decoder of
``benchmarks/gpu/llama1b.yaml`` on one H200 at 16,384 tokens per step, sequence 2,048 and 4,096, ``remat: dots``:
with cuDNN's flash attention (``attention: auto``, the train section) and with the einsums (``attention: xla``,
the attention section). None of them calibrates anything: the h200 profile shares the h100's efficiency
(one die), calibrated on the published H100 rows (tests/tune/validation.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from partitioning.config.load import load_config
from partitioning.config.remat import price_remat
from partitioning.tune.hardware import hardware

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "benchmarks" / "gpu" / "llama1b.yaml"


def rows() -> list[dict[str, Any]]:
    """Every measured step: ``id``, ``seq_len``, ``batch_size``, ``remat``, ``attention`` (auto | xla), ``step_s``."""
    run1 = json.loads((RESULTS / "gpu_h200_run1.json").read_text())["sections"]
    run2 = json.loads((RESULTS / "gpu_h200_run2.json").read_text())["sections"]
    out = [
        {"id": f"h200-train-{r['seq_len']}", "seq_len": r["seq_len"], "batch_size": r["batch_size"],
         "remat": r["remat"], "attention": "auto", "step_s": r["toolkit_step_s"]}
        for r in run1["train"]["rows"]
    ]  # fmt: skip
    for r in run2["attention"]["rows"]:
        out.append({"id": f"h200-xla-{r['seq_len']}", "seq_len": r["seq_len"], "batch_size": 16384 // r["seq_len"],
                    "remat": r["xla"]["remat"], "attention": "xla", "step_s": r["xla"]["step_s"]})  # fmt: skip
    return out


def estimate(row: dict[str, Any], efficiency: float | None = None) -> Any:
    """tune's priced Result of the measured run on the h200 profile (at ``efficiency`` if given)."""
    cfg = load_config(
        str(CONFIG),
        [
            f"train.seq_len={row['seq_len']}",
            f"train.batch_size={row['batch_size']}",
            f"model.remat={row['remat']}",
            f"model.attention={row['attention']}",
        ],
    )
    hw = hardware("h200")
    if efficiency is not None:
        hw = dataclasses.replace(hw, efficiency=efficiency)
    choice = price_remat(cfg, {"data": 1, "fsdp": 1}, hw, 141 * 10**9, (row["remat"],))
    (result,) = choice.results
    return result


def errors(efficiency: float | None = None) -> dict[str, float]:
    """Per measured row, predicted / measured step time - 1."""
    return {r["id"]: estimate(r, efficiency).step_time / r["step_s"] - 1 for r in rows()}


if __name__ == "__main__":  # python -m tests.tune.measured
    for k, v in errors().items():
        print(f"{k}: {v:+.1%}")
