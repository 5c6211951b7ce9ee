"""Hugging Face import benchmark: ``load_hf`` in 2 processes x 4 devices against ``safetensors.numpy.load_file``.

    python benchmarks/bench_hf.py [--gib 1.0] [--json out.json] [--dir /tmp] [--keep DIR]

1. Writes a Llama-shaped checkpoint of about ``--gib`` GiB (float32 safetensors,
   sharded at 500MB with an index, random values; numpy + the toolkit's writer,
   no torch) and its ``config.json``.
2. Starts 2 processes with 4 simulated CPU devices each (``jax.distributed`` on
   127.0.0.1, gloo) that load it FSDP over all 8 devices (``load_hf(dir, mesh,
   "fsdp")``). Each process reports:

   - its peak resident memory during the import above its memory just before,
     as a fraction of the checkpoint's size (target <= 0.6: a process never holds
     much more than its half);
   - the import rate (checkpoint bytes / seconds) against reading the same files
     with ``safetensors.numpy.load_file`` in the same process (target >= 0.8x),
     median over rounds that alternate which side goes first, both processes
     running the same side at once;
   - the bytes it read from the files, and a check that its shards hold the
     values ``load_file`` read.

Both sides read from the page cache (the files were just written). The numbers
are noisy on a shared machine: re-measure on an idle one. Prints a table and a
JSON object (also written to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import report

REPO = Path(__file__).resolve().parent.parent
PROCESSES, LOCAL_DEVICES, ROUNDS = 2, 4, 4
EMBED, HEADS, KV_HEADS, MLP, VOCAB = 1024, 16, 8, 2816, 32000


def config_for(gib: float) -> dict:
    head = EMBED // HEADS
    per_layer = EMBED * (HEADS + 2 * KV_HEADS) * head + HEADS * head * EMBED + 3 * EMBED * MLP + 2 * EMBED
    layers = max(2, math.ceil((gib * 2**30 / 4 - 2 * VOCAB * EMBED - EMBED) / per_layer))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": EMBED,
        "intermediate_size": MLP,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def write_checkpoint(directory: Path, gib: float) -> int:
    """A random float32 Llama checkpoint of about ``gib`` GiB in HF names and layouts; returns its tensor bytes."""
    return write_llama(directory, config_for(gib))


def llama_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Llama ``config.json`` in its HF name and (out, in) layout."""
    d, h, m, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"], cfg["vocab_size"]
    g, k = cfg["num_key_value_heads"], cfg.get("head_dim", d // h)
    shapes = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (h * k, d),
                p + "self_attn.k_proj.weight": (g * k, d),
                p + "self_attn.v_proj.weight": (g * k, d),
                p + "self_attn.o_proj.weight": (d, h * k),
                p + "post_attention_layernorm.weight": (d,),
                p + "mlp.gate_proj.weight": (m, d),
                p + "mlp.up_proj.weight": (m, d),
                p + "mlp.down_proj.weight": (d, m),
            }
        )
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (vocab, d)})
    return shapes


def write_llama(directory: Path, cfg: dict, dtype: str = "float32", shard_bytes: int = 500 * 10**6, fresh=True) -> int:
    """The safetensors files, index and ``config.json`` of a Llama with random values; returns its tensor bytes.

    ``fresh``: new random values for every tensor (a misplaced slice cannot match by chance); else one
    repeated random block, which writes many GiB in seconds.
    """
    import ml_dtypes
    import numpy as np

    from partitioning.hf.files import INDEX, file_names, plan_shards, write_safetensors

    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    shapes = llama_shapes(cfg)
    sizes = [(n, math.prod(s) * dt.itemsize) for n, s in shapes.items()]
    shards = plan_shards(sizes, shard_bytes)
    names = file_names(len(shards))
    rng = np.random.default_rng(0)
    block = (rng.standard_normal(1 << 20, dtype=np.float32) * 0.02).astype(dt)

    def values(shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dt) if fresh else np.resize(block, shape)

    directory.mkdir(parents=True, exist_ok=True)
    for fname, tensors in zip(names, shards, strict=True):
        entries = [(t, dt, shapes[t]) for t in tensors]
        write_safetensors(directory / fname, entries, (values(shapes[t]) for t in tensors))
    weight_map = {t: f for f, tensors in zip(names, shards, strict=True) for t in tensors}
    total = sum(n for _, n in sizes)
    (directory / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps({**cfg, "torch_dtype": dtype}, indent=2))
    return total


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


# -- one process of the import ----------------------------------------------------------------


def worker(pid: int, port: int, ckpt: str, out: str) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.pop("XLA_FLAGS", None)
    sys.path.insert(0, str(REPO))
    import jax

    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=pid)
    import numpy as np
    from jax.experimental import multihost_utils
    from safetensors.numpy import load_file

    import partitioning as pt
    from partitioning.hf import weights as hf_module
    from partitioning.hf.files import discover

    readers = []

    class CountingReader(hf_module.Reader):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            readers.append(self)

    hf_module.Reader = CountingReader
    mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    files = sorted({s.file for s in discover(ckpt).values()})
    size = sum(s.dtype.itemsize * math.prod(s.shape) for s in discover(ckpt).values())
    pt.hf.hf_model(ckpt)  # imports and the model's construction outside the measured window

    def toolkit():
        multihost_utils.sync_global_devices("toolkit")
        t = time.perf_counter()
        _, variables = pt.hf.load_hf(ckpt, mesh, "fsdp")
        jax.block_until_ready(variables)
        return time.perf_counter() - t, variables

    def baseline():
        multihost_utils.sync_global_devices("baseline")
        t = time.perf_counter()
        arrays = {}
        for f in files:
            arrays.update(load_file(f))
        return time.perf_counter() - t, arrays

    # The peak memory of a first import in this process, from a reset high-water mark.
    try:
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    before = _status("VmRSS")
    first, variables = toolkit()
    peak = _status("VmHWM")
    bytes_read = readers[-1].bytes_read
    # Check: this process's shards hold what load_file reads (q of layer 0 is (h k, d) on disk, (h, k, d) here).
    _, arrays = baseline()
    q = variables["params"]["blocks"]["attn"]["q"]
    want = arrays["model.layers.0.self_attn.q_proj.weight"].reshape(HEADS, EMBED // HEADS, EMBED)
    ok = all(np.array_equal(np.asarray(s.data)[0], want[s.index[1:]]) for s in q.addressable_shards)
    del variables, arrays, q
    toolkit_s, baseline_s = [], []
    for r in range(ROUNDS):
        for side in (toolkit, baseline) if r % 2 == 0 else (baseline, toolkit):
            seconds, result = side()
            (toolkit_s if side is toolkit else baseline_s).append(seconds)
            del result
    record = {
        "process": pid,
        "checkpoint_bytes": size,
        "rss_before": before,
        "rss_peak": peak,
        "hwm_reset": reset,
        "peak_increase_over_checkpoint": (peak - before) / size,
        "bytes_read": bytes_read,
        "first_import_s": first,
        "import_s": toolkit_s,
        "load_file_s": baseline_s,
        "values_match_load_file": bool(ok),
        "local_devices": jax.local_device_count(),
        "devices": jax.device_count(),
    }
    Path(out).write_text(json.dumps(record))
    jax.distributed.shutdown()


# -- main ---------------------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="checkpoint size in GiB (default 1)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--dir", default=None, help="scratch directory (default: the system temp dir)")
    p.add_argument("--keep", default=None, help="use (or write once and keep) the checkpoint in this directory")
    p.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(int(args.worker[0]), int(args.worker[1]), args.worker[2], args.worker[3])
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(REPO))
    scratch = Path(tempfile.mkdtemp(prefix="bench_hf_", dir=args.dir))
    try:
        ckpt = Path(args.keep) if args.keep else scratch / "ckpt"
        t = time.perf_counter()
        if not (ckpt / "config.json").exists():
            write_checkpoint(ckpt, args.gib)
        print(f"checkpoint {ckpt}: written in {time.perf_counter() - t:.1f} s", flush=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(i), str(port), str(ckpt), str(scratch / f"w{i}.json")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(PROCESSES)
        ]
        outs = [proc.communicate(timeout=3600)[0] for proc in procs]
        for proc, out in zip(procs, outs, strict=True):
            if proc.returncode != 0:
                raise SystemExit(f"worker failed:\n{out[-3000:]}")
        workers = [json.loads((scratch / f"w{i}.json").read_text()) for i in range(PROCESSES)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    size = workers[0]["checkpoint_bytes"]
    res = {
        "checkpoint_bytes": size,
        "processes": PROCESSES,
        "devices_per_process": LOCAL_DEVICES,
        "layout": "fsdp over 8 devices",
        "peak_rss_increase_over_checkpoint": max(w["peak_increase_over_checkpoint"] for w in workers),
        "peak_rss_target": 0.6,
        "import_gib_per_s": [size / 2**30 / med(w["import_s"]) for w in workers],
        "load_file_gib_per_s": [size / 2**30 / med(w["load_file_s"]) for w in workers],
        "import_rate_ratio": min(med(w["load_file_s"]) / med(w["import_s"]) for w in workers),
        "import_rate_target": 0.8,
        "bytes_read_over_checkpoint": [w["bytes_read"] / size for w in workers],
        "values_match": all(w["values_match_load_file"] for w in workers),
        "workers": workers,
    }
    print(
        f"{size / 2**30:.2f} GiB Llama checkpoint into {PROCESSES} processes x {LOCAL_DEVICES} devices (fsdp):\n"
        f"  peak RSS increase / checkpoint: "
        + ", ".join(f"{w['peak_increase_over_checkpoint']:.2f}" for w in workers)
        + f"  (target <= 0.6: {'OK' if res['peak_rss_increase_over_checkpoint'] <= 0.6 else 'MISSED'})\n"
        f"  import rate vs safetensors.numpy.load_file: {res['import_rate_ratio']:.2f}x "
        f"(load_hf {', '.join(f'{r:.2f}' for r in res['import_gib_per_s'])} GiB/s, load_file "
        f"{', '.join(f'{r:.2f}' for r in res['load_file_gib_per_s'])} GiB/s; target >= 0.8x: "
        f"{'OK' if res['import_rate_ratio'] >= 0.8 else 'MISSED'})\n"
        f"  bytes read / checkpoint: {', '.join(f'{r:.2f}' for r in res['bytes_read_over_checkpoint'])}; "
        f"values match load_file: {res['values_match']}",
        flush=True,
    )
    report(res, args.json)


if __name__ == "__main__":
    main()
