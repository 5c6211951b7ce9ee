"""Golden logits after transformers' sampling warpers, for `partitioning.decode.sampling.filter_logits`.

Run it with a Python that has torch and transformers (NOT the project's dependencies)::

    /work/refvenv/bin/python tools/make_sampling_fixture.py     # writes tests/fixtures/sampling/warpers.npz

The file holds `logits` (rows, vocab) float32 with ties and a peaked row, and for each setting
`t{temperature}_k{top_k}_p{top_p}` the scores transformers' TemperatureLogitsWarper, TopKLogitsWarper
and TopPLogitsWarper leave (in the order `generate` applies them; removed tokens are -inf).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sampling" / "warpers.npz"
SETTINGS = [(0.7, 0, 0.9), (1.0, 5, 1.0), (1.3, 10, 0.8), (1.0, 0, 0.3), (0.5, 3, 0.5), (2.0, 50, 0.95)]


def main() -> int:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 40)).astype(np.float32) * 2
    logits[1, :6] = 3.0  # ties at the top-k boundary
    logits[2] = -10.0
    logits[2, 7] = 10.0  # one token holds nearly all the mass
    out = {"logits": logits}
    for t, k, p in SETTINGS:
        warpers = LogitsProcessorList([TemperatureLogitsWarper(t)])
        if k:
            warpers.append(TopKLogitsWarper(k))
        if p < 1:
            warpers.append(TopPLogitsWarper(p))
        scores = warpers(None, torch.from_numpy(logits.copy()))
        out[f"t{t}_k{k}_p{p}"] = scores.numpy().astype(np.float32)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez(OUT, **out)
    print(f"transformers {transformers.__version__}: {len(SETTINGS)} settings -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
