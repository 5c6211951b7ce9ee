"""Chat data benchmark: a large JSONL file through `load_instructions` against the way it was read before, in one run.

    python benchmarks/bench_chat_data.py [--mb 200] [--json out.json]

A chat file of about ``--mb`` MB (synthetic conversations of 1-3 turns, 20-400 words each) is tokenized with the
Qwen2 fixture's tokenizer and Qwen2.5's chat template, each way in a fresh process:

- toolkit: ``pt.data.load_instructions`` -- rows streamed, rendered and tokenized in groups, written to the
  example cache as they come (``partitioning/data/examples.py``); then the same call again, read from the cache;
- baseline: what it did before: every row read into a list (``str.splitlines``), each rendered and tokenized
  alone (``tokenizer.encode``), the per-example arrays joined at the end.

Reported: the seconds until the first progress line and in all, the peak RSS over the file's size, and the
ratios (baseline / toolkit). The targets (issue 38): progress from the first second, at most about 2x the file
in memory, a resume that starts at once.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "tests" / "fixtures" / "hf" / "qwen2"
TEMPLATE = REPO / "tests" / "fixtures" / "chat" / "qwen2"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "red",
    "blue",
    "green",
    "cats",
    "sleep",
    "under",
    "warm",
    "sun",
]

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
import numpy as np
import partitioning as pt
from partitioning.data.chat import ChatTemplate
mode, path, cache = sys.argv[1], sys.argv[2], sys.argv[3]


def old_spans(template, messages, full):  # what load_examples did before (the prefix renders)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = template.render(messages[:i], add_generation_prompt=True) if i else ""
            turn = template.render(messages[: i + 1])
            if full.startswith(head) and full.startswith(turn) and len(turn) > len(head):
                spans.append((len(head), len(turn)))
    return spans


base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("start", file=sys.stderr, flush=True)
t0 = time.perf_counter()
if mode == "toolkit":
    data = pt.data.load_instructions(path, "chat", {tok!r}, chat_template={tmpl!r}, cache_dir=cache, progress="lines")
    rows, tokens = len(data.train) + len(data.eval), len(data.train.tokens) + len(data.eval.tokens)
else:
    tok = pt.data.load_tokenizer({tok!r})
    template = ChatTemplate.from_dir({tmpl!r})
    rows_ = [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
    ids, masks = [], []
    for row in rows_:
        full = template.render(row["messages"])
        enc = tok.tokenizer.encode(full, add_special_tokens=False)
        where = np.asarray(enc.offsets, np.int64)
        mask = np.zeros(len(where), bool)
        for s, e in old_spans(template, row["messages"], full):
            mask |= (where[:, 1] > s) & (where[:, 0] < e)
        ids.append(np.asarray(enc.ids, np.int32))
        masks.append(mask.astype(np.uint8))
    rows, tokens = len(rows_), int(sum(len(i) for i in ids))
    joined = (np.concatenate(ids), np.concatenate(masks))
took = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": took, "rss_kib": max(peak - base, 0), "rows": rows, "tokens": tokens}}))
"""


def make_file(path: Path, mb: float) -> int:
    rng = random.Random(0)
    rows, size = 0, 0
    with path.open("w") as f:
        while size < mb * 1e6:
            msgs = []
            for _ in range(rng.choice([1, 1, 2, 3])):
                msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 300)))})
                msgs.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 400)))})
            line = json.dumps({"messages": msgs}) + "\n"
            f.write(line)
            size += len(line)
            rows += 1
    return rows


def run(mode: str, path: Path, cache: Path) -> dict:
    code = CHILD.format(repo=str(REPO), tok=str(TOKENIZER), tmpl=str(TEMPLATE))
    argv = [sys.executable, "-c", code, mode, str(path), str(cache)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = first = None
    assert proc.stderr is not None
    for line in proc.stderr:  # seconds from the start of the load (imports done) to its first progress line
        if line.startswith("start"):
            start = time.perf_counter()
        elif first is None and start is not None and line.startswith("data: tokenizing"):
            first = time.perf_counter() - start
    out = json.loads(proc.stdout.read() if proc.stdout else "{}")
    proc.wait()
    return {**out, "first_line_s": first}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=200.0, help="size of the chat file (MB)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chat.jsonl"
        rows = make_file(path, args.mb)
        size = path.stat().st_size
        toolkit = run("toolkit", path, Path(tmp) / "cache")
        cached = run("toolkit", path, Path(tmp) / "cache")
        baseline = run("baseline", path, Path(tmp) / "cache")
    kib = size / 1024
    results = {
        "file_mb": round(size / 1e6, 1),
        "rows": rows,
        "tokens": toolkit["tokens"],
        "toolkit_s": round(toolkit["seconds"], 2),
        "toolkit_first_line_s": toolkit["first_line_s"] and round(toolkit["first_line_s"], 2),
        "toolkit_rss_over_file": round(toolkit["rss_kib"] / kib, 2),
        "cached_s": round(cached["seconds"], 2),
        "baseline_s": round(baseline["seconds"], 2),
        "baseline_rss_over_file": round(baseline["rss_kib"] / kib, 2),
        "speedup": round(baseline["seconds"] / toolkit["seconds"], 2),
        "resume_speedup": round(toolkit["seconds"] / max(cached["seconds"], 1e-6), 1),
    }
    from common import report

    report(results, args.json)


if __name__ == "__main__":
    main()
