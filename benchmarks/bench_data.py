"""Data benchmark: a process's batch through grain against a hand-written numpy sampler, in one run.

    python benchmarks/bench_data.py [--rounds 30] [--json out.json]

For each batch shape, the host time to build one process's block of step
``k``'s batch from a memory-mapped ``uint16`` token file (10M tokens):

- grain: ``TokenBatches.host_batch_at`` — the toolkit's pipeline
  (``MapDataset.source(windows).seed(s).shuffle().repeat()`` and this
  process's rows);
- baseline: what the toolkit did before grain — a numpy permutation per epoch
  and one fancy-indexing gather of the same number of windows.

Rounds alternate the two; the ratio is of the medians. Also: the grain time
for one of two processes (half the rows) against all rows, which shows that
a process reads only its own rows. No target: this is the price of grain's
per-example index shuffle and its per-read metrics, to be read against a
step's time (the loop builds the next batch while the devices run the
previous step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partitioning.data.corpus import TokenBatches, load_corpus

SHAPES = [(32, 128), (256, 1024), (1024, 128)]


class Rows:
    """The sharding one of two processes sees: rows [0, batch/2)."""

    def __init__(self, rows: int):
        self.rows = rows

    def addressable_devices_indices_map(self, shape):
        return {0: (slice(0, self.rows), slice(None))}


def numpy_sampler(tokens: np.ndarray, batch: int, seq: int, seed: int = 0):
    n = (len(tokens) - 1) // seq
    perms: dict[int, np.ndarray] = {}

    def batch_at(step: int) -> dict[str, np.ndarray]:
        g = np.arange(step * batch, (step + 1) * batch)
        for e in np.unique(g // n):
            if e not in perms:
                perms[int(e)] = np.random.default_rng([seed, int(e)]).permutation(n)
        starts = np.array([perms[int(e)][p] for e, p in zip(g // n, g % n, strict=True)]) * seq
        w = tokens[starts[:, None] + np.arange(seq + 1)].astype(np.int32)
        return {"inputs": w[:, :-1], "targets": w[:, 1:]}

    return batch_at


def _time(fn, step: int) -> float:
    t = time.perf_counter()
    fn(step)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokens.npy"
        np.save(path, np.random.default_rng(0).integers(0, 50257, 10_000_000).astype(np.uint16))
        corpus = load_corpus(str(path))
        tokens = np.load(path, mmap_mode="r")
        results = []
        for batch, seq in SHAPES:
            grain_b = TokenBatches(corpus.train, batch, seq, seed=0)
            half = TokenBatches(corpus.train, batch, seq, Rows(batch // 2), seed=0)
            base = numpy_sampler(tokens, batch, seq)
            g, b, h = [], [], []
            for r in range(args.rounds + 1):
                step = 1000 + r
                times = (_time(grain_b.host_batch_at, step), _time(base, step), _time(half.host_batch_at, step))
                if r:  # round 0 warms up
                    g.append(times[0]), b.append(times[1]), h.append(times[2])
            row = {
                "batch": batch,
                "seq_len": seq,
                "grain_ms": statistics.median(g) * 1e3,
                "numpy_ms": statistics.median(b) * 1e3,
                "half_rows_ms": statistics.median(h) * 1e3,
            }
            row["ratio"] = row["grain_ms"] / row["numpy_ms"]
            row["half_over_all"] = row["half_rows_ms"] / row["grain_ms"]
            results.append(row)
    print(f"{'batch x seq_len':>16} {'grain ms':>9} {'numpy ms':>9} {'ratio':>6} {'half rows / all':>16}")
    for r in results:
        print(
            f"{r['batch']:>7} x {r['seq_len']:<6} {r['grain_ms']:>9.2f} {r['numpy_ms']:>9.2f} {r['ratio']:>6.2f} "
            f"{r['half_over_all']:>16.2f}"
        )
    out = json.dumps({"data": results})
    print(out)
    if args.json:
        Path(args.json).write_text(out)


if __name__ == "__main__":
    main()
