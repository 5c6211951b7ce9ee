"""Training steps measured on a GPU by ``benchmarks/gpu/bench_gpu.py`` (its committed JSON), and what ``tune``
predicts for them: the one source the h200 profile's efficiency is calibrated on.

The benchmark's first H200 run (``benchmarks/results/gpu_h200_run1.json``) trained the 1.1B Llama-style decoder
of ``benchmarks/gpu/llama1b.yaml`` on one H200 at 16,384 tokens per step, sequence 2,048 and 4,096, with
``remat: auto`` (which chose ``dots``) and cuDNN's flash attention. The sequence-2,048 row calibrates; the
4,096 row checks. The H100 has no measured row and keeps the A100's published calibration.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from partitioning.config.load import load_config
from partitioning.config.remat import price_remat
from partitioning.tune.hardware import hardware
from tests.tune.published import _step_at

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "gpu_h200_run1.json"
CONFIG = ROOT / "benchmarks" / "gpu" / "llama1b.yaml"
CALIBRATION_SEQ = 2048


def rows() -> list[dict[str, Any]]:
    """The measured train rows (toolkit step time, sequence, batch, the remat policy the run chose)."""
    return json.loads(RESULTS.read_text())["sections"]["train"]["rows"]


def estimate(row: dict[str, Any]) -> Any:
    """tune's analytic estimate of the measured run at efficiency 1 (rescaled by ``_step_at``)."""
    cfg = load_config(
        str(CONFIG),
        [f"train.seq_len={row['seq_len']}", f"train.batch_size={row['batch_size']}", f"model.remat={row['remat']}"],
    )
    hw = dataclasses.replace(hardware("h200"), efficiency=1.0)
    choice = price_remat(cfg, {"data": 1, "fsdp": 1}, hw, row["tune"]["budget_bytes"], (row["remat"],))
    (result,) = choice.results
    return result.analytic


def calibrate() -> tuple[float, dict[int, float]]:
    """(the efficiency, to 3 decimals, at which tune's step equals the calibration row's measured step;
    per sequence, predicted / measured - 1 at that efficiency)."""
    est = {r["seq_len"]: (r, estimate(r)) for r in rows()}
    row, e = est[CALIBRATION_SEQ]
    lo, hi = 0.05, 1.0
    for _ in range(50):
        k = (lo + hi) / 2
        lo, hi = (k, hi) if _step_at(e, k) > row["toolkit_step_s"] else (lo, k)
    k = round(k, 3)
    return k, {seq: _step_at(e, k) / r["toolkit_step_s"] - 1 for seq, (r, e) in est.items()}
