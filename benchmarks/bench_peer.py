"""Peer benchmark: the toolkit against MaxText on matched configs, both on 8 simulated CPU devices.

    python benchmarks/bench_peer.py [--steps 30] [--runs 2] [--sizes S M] [--json out.json]
    python benchmarks/bench_peer.py --smoke          # 6 steps, size S, FSDP, default vs default: proves both run

MaxText is a benchmark-only dependency, never the project's: a venv outside the
repository (``--venv``, default ``~/.cache/partitioning-bench/maxtext-venv``),
made on first use with a Python >= 3.12 of the machine (``--python``, else
``python3.12`` / ``python3.13`` on PATH or under pyenv): ``pip install
maxtext==0.2.5 --no-deps``, then the requirements MaxText ships for running
without Google Cloud (its ``generated_requirements/decoupled-requirements.txt``)
less the GPU / TPU packages (``nvidia-*``, ``cuda-*``, ``libtpu``). Without such
a Python the benchmark says so and skips (``"skipped": reason`` in the JSON).

Matched configs: Llama-style decoders (RMSNorm, SwiGLU, rotary, untied
unembedding) of the same shapes in both — S: embed 128, 4 heads, MLP 512,
4 layers, sequence 128; M: embed 256, MLP 1024, sequence 256 — vocabulary
256, float32, scanned layers, AdamW, global batch 32. Layouts: FSDP (``fsdp``
8 / ``ici_fsdp_parallelism=8``) and FSDP x tensor (``fsdp_tp`` {fsdp 4,
tensor 2} / ``ici_fsdp_parallelism=4 ici_tensor_parallelism=2``). Remat
pairings: ``full`` vs ``full``; ``dots_no_batch`` vs ``minimal``; each tool's
default (every ``auto`` default of ours, decided as ``partitioning train``
decides it, against MaxText's defaults). Before the default pairing one
untimed process of ours times its ``auto`` defaults and caches the verdicts
(``train.measure_defaults: true``, what a run long enough to pay for measuring
does; ``--no-measure-defaults``: the estimate alone, a short first run's
default); the timed runs read them, with a cache of the benchmark's own (the
machine's CPU profile copied in). Data: one fixed batch
for both (MaxText's ``dataset_type=synthetic``; the toolkit's trainer steps on
one batch of real tokens).

Each run is a fresh process (MaxText's trainer, ``maxtext.trainers.pre_train.train``
with ``DECOUPLE_GCLOUD=TRUE hardware=cpu skip_jax_distributed_system=true``;
ours, a Trainer loop in this repo's Python); the two tools alternate,
``--runs`` times each. Per run: step time (median of steps 11..N; MaxText
reports a step's time when the next is dispatched, so its medians are read the
same way), compile time (ours: lower + compile; MaxText: its log's first
step), time to first step (process start to the first step done) and peak RSS
(the process's ``ru_maxrss``). Reported as ratios ours / MaxText; FLOP/s at a
common count, 6 N tokens with each tool's own parameter count N. Targets:
``step_time_ratio <= 1.0`` and ``rss_ratio <= 1.0`` at every pairing (idle
machine, two runs).

``--json FILE`` writes ``{"pairings": [{"name", "shape", "layout", "step_time_ratio",
"rss_ratio", "load_average": {"before", "after"}, "crashes", ...}], "skipped": reason-or-null}``: the
machine's 1/5/15-minute load averages beside each cell (an idle machine reads near 0), and each run that
crashed (either tool: its log's tail) — the matrix goes on with the next run and cell, and a cell whose tool
crashed every time keeps its crashes and no ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, report

DEVICES, BATCH, VOCAB = 8, 32, 256
SIZES = {
    "S": dict(embed=128, heads=4, mlp=512, layers=4, seq=128),
    "M": dict(embed=256, heads=4, mlp=1024, layers=4, seq=256),
}
LAYOUTS = {
    "fsdp": ({"data": 1, "fsdp": 8, "tensor": 1}, "fsdp"),
    "fsdp_tp": ({"data": 1, "fsdp": 4, "tensor": 2}, "fsdp_tp"),
}
# (name, ours, MaxText's); None: the tool's default
REMATS = [
    ("full vs full", "full", "full"),
    ("dots_no_batch vs minimal", "dots_no_batch", "minimal"),
    ("default vs default", None, None),
]
VENV = Path.home() / ".cache" / "partitioning-bench" / "maxtext-venv"
MAXTEXT = "maxtext==0.2.5"
NOT_ON_CPU = re.compile(r"^(nvidia-|cuda-|libtpu|jax\[tpu\]|jax\[cuda)", re.IGNORECASE)
RSS_SNIPPET = (
    "import atexit, resource; atexit.register(lambda: print('PEAK_RSS_KB', "
    "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True))"
)


# -- MaxText's venv ----------------------------------------------------------------------------------


def find_python(explicit: str | None) -> str | None:
    """A Python >= 3.12 of the machine (MaxText 0.2.5 needs it), or None."""
    candidates = [explicit] if explicit else []
    # 3.12 first: the oldest MaxText supports, the one its wheels' dependencies are surest to have.
    candidates += [shutil.which(n) for n in ("python3.12", "python3.13")]
    candidates += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3")))
    for c in candidates:
        if not c or not Path(c).exists():
            continue
        out = subprocess.run(
            [c, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True, text=True
        )
        if out.stdout.strip() == "True":
            return c
    return None


def ensure_venv(venv: Path, python: str | None) -> str | None:
    """MaxText's venv (made if missing); None when ready, else why not."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import maxtext"], capture_output=True).returncode == 0:
        return None
    base = find_python(python)
    if base is None:
        return "no Python >= 3.12 on this machine (MaxText 0.2.5 needs one): pass --python"
    print(f"making MaxText's venv {venv} with {base} (once; several minutes)", file=sys.stderr, flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[base, "-m", "venv", str(venv)], [str(py), "-m", "pip", "install", "-q", "--no-deps", MAXTEXT]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            return f"{' '.join(cmd[:4])}: failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    reqs = subprocess.run(
        [str(py), "-c", "import maxtext, pathlib; print(pathlib.Path(maxtext.__file__).parent.parent)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    src = Path(reqs) / "dependencies/requirements/generated_requirements/decoupled-requirements.txt"
    if not src.exists():
        return f"MaxText's decoupled requirements are not where 0.2.5 ships them ({src})"
    lines = [ln for ln in src.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    keep = [ln for ln in lines if not NOT_ON_CPU.match(ln.strip())]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(keep) + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", f.name], capture_output=True, text=True)
    if r.returncode:
        return f"installing MaxText's CPU requirements failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    return None


# -- one run of each tool -----------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
        DECOUPLE_GCLOUD="TRUE",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_maxtext(venv: Path, size: dict, layout: str, remat: str | None, steps: int, workdir: Path) -> dict:
    """One MaxText training run: per-step seconds from its log, time to first step, peak RSS."""
    py = venv / "bin" / "python"
    fsdp, tensor = (8, 1) if layout == "fsdp" else (4, 2)
    args = [
        f"run_name=peer_{int(time.time() * 1000)}",
        f"base_output_directory={workdir}",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "dataset_type=synthetic",
        "packing=false",
        "enable_checkpointing=false",
        f"steps={steps}",
        f"per_device_batch_size={BATCH / DEVICES:g}",
        f"max_target_length={size['seq']}",
        f"base_emb_dim={size['embed']}",
        f"base_num_query_heads={size['heads']}",
        f"base_num_kv_heads={size['heads']}",
        f"head_dim={size['embed'] // size['heads']}",
        f"base_mlp_dim={size['mlp']}",
        f"base_num_decoder_layers={size['layers']}",
        f"vocab_size={VOCAB}",
        "dtype=float32",
        "weight_dtype=float32",
        "scan_layers=true",
        "attention=dot_product",
        f"ici_fsdp_parallelism={fsdp}",
        f"ici_tensor_parallelism={tensor}",
        "log_period=1000000",
        # MaxText's base.yml keeps a persistent compilation cache (~/jax_cache): a later cell with the same
        # program skipped its compile, and the compiler's memory with it (its default is `full`: 711 MiB in the
        # default cell against 965 MiB in the full cell, the RSS spread). Every run compiles, as ours do.
        "jax_cache_dir=",
    ]
    if remat is not None:
        args.append(f"remat_policy={remat}")
    code = (
        f"{RSS_SNIPPET}\n"
        "import runpy, sys, maxtext, pathlib\n"
        "base = pathlib.Path(maxtext.__file__).parent / 'configs' / 'base.yml'\n"
        "sys.argv = ['train', str(base)] + sys.argv[1:]\n"
        "runpy.run_module('maxtext.trainers.pre_train.train', run_name='__main__')\n"
    )
    t0 = time.perf_counter()
    p = subprocess.run([str(py), "-c", code, *args], capture_output=True, text=True, env=_env(), cwd=workdir)
    out = p.stdout + p.stderr
    step_s = [float(m.group(2)) for m in re.finditer(r"completed step: (\d+), seconds: ([\d.]+)", out)]
    wall = time.perf_counter() - t0
    if p.returncode or not step_s:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise RuntimeError(f"MaxText run failed (exit {p.returncode}):\n{tail}")
    params = re.search(r"[Nn]umber of model params=([\d.]+)\s*billion", out)
    return {
        "step_s": step_s,
        "compile_s": step_s[0] - _median_tail(step_s),
        # The process's time up to its first step done: all but the later steps (teardown included).
        "first_step_s": wall - sum(step_s[1:]),
        "wall_s": wall,
        "rss_bytes": _rss(out),
        "params": float(params.group(1)) * 1e9 if params else None,
    }


def run_ours(size: dict, layout: str, remat: str | None, steps: int, measure: bool = False) -> dict:
    """One toolkit run in a fresh process: the config's Trainer stepping on one fixed batch of real tokens
    (``measure``: instead, the ``auto`` defaults timed and their verdicts cached, as a long run does)."""
    code = f"{RSS_SNIPPET}\n" + OURS.format(
        repo=str(REPO), size=size, layout=layout, remat=remat, steps=steps, batch=BATCH, vocab=VOCAB, measure=measure
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO)
    out = p.stdout + p.stderr
    m = re.search(r"^RESULT (.*)$", out, re.MULTILINE)
    if p.returncode or not m:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise RuntimeError(f"toolkit run failed (exit {p.returncode}):\n{tail}")
    res = json.loads(m.group(1))
    res["rss_bytes"] = _rss(out)
    return res


OURS = """
import json, sys, time
t_start = time.perf_counter()
sys.path.insert(0, {repo!r})
import jax
from partitioning.config.build import mesh_from_config, trainer_from_config
from partitioning.config.load import load_config
from partitioning.config.defaults import Trial, resolve_defaults
from partitioning.data.corpus import load_corpus
size = {size!r}
sets = ["model.embed=%d" % size["embed"], "model.heads=%d" % size["heads"], "model.mlp=%d" % size["mlp"],
        "model.layers=%d" % size["layers"], "model.vocab_size={vocab}", "train.seq_len=%d" % size["seq"],
        "train.batch_size={batch}", "rules={layout}",
        "mesh.shape=" + ("{{data: 1, fsdp: 8, tensor: 1}}" if {layout!r} == "fsdp"
                         else "{{data: 1, fsdp: 4, tensor: 2}}")]
if {remat!r} is not None:
    sets.append("model.remat={remat}")
asked = load_config("configs/quickstart.yaml", sets)
mesh = mesh_from_config(asked)
decided = resolve_defaults(asked, mesh)  # as `train` decides: a cached verdict, else the estimate
cfg, note = decided.cfg, "; ".join(decided.notes())
trainer = trainer_from_config(cfg, mesh)
data = load_corpus().batches("train", cfg.train.batch_size, cfg.train.seq_len, trainer.batch_sharding, seed=0)
batch = data.batch_at(0)
if {measure!r}:  # the defaults timed and cached (train.measure_defaults: true), nothing stepped
    asked = load_config("configs/quickstart.yaml", sets + ["train.measure_defaults=true"])
    note = "; ".join(resolve_defaults(asked, mesh, Trial(batch=lambda: batch)).notes())
    print("RESULT " + json.dumps({{"note": note}}), flush=True)
    sys.exit(0)
state = trainer.init(jax.random.key(0))
steps = []
first = None
for i in range({steps}):
    t = time.perf_counter()
    state, m = trainer.train_step(state, batch)
    jax.block_until_ready(m)
    steps.append(time.perf_counter() - t)
    if first is None:
        first = time.perf_counter() - t_start
tail = sorted(steps[10:] if len(steps) > 12 else steps[1:])
compile_s = steps[0] - tail[len(tail) // 2]  # the first step compiles
print("RESULT " + json.dumps({{"step_s": steps, "compile_s": compile_s, "first_step_s": first,
      "params": trainer.num_params, "remat": cfg.model_options.get("remat"), "note": note}}), flush=True)
"""


def _rss(out: str) -> int | None:
    m = re.findall(r"PEAK_RSS_KB (\d+)", out)
    return int(m[-1]) * 1024 if m else None


# -- the comparison -----------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float | None:
    """a / b; None when either is not a positive time (MaxText's log may time its first step after compiling it)."""
    return a / b if a > 0 and b > 0 else None


def _median_tail(xs: list[float]) -> float:
    tail = xs[10:] if len(xs) > 12 else xs[1:] or xs
    return statistics.median(tail)


def _load() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages: what else ran beside a measurement."""
    return [round(x, 2) for x in os.getloadavg()]


def _run(fn, crashes: list[str], who: str) -> list[dict]:
    """``[fn()]``, or ``[]`` with the crash recorded in ``crashes`` (its log's tail): one tool's crash in one
    cell does not end the matrix."""
    try:
        return [fn()]
    except RuntimeError as e:
        crashes.append(f"{who}: {e}")
        return []


def pairing(name, size_name, layout, ours_remat, mt_remat, runs, steps, venv, workdir, measure=True) -> dict:
    size = SIZES[size_name]
    ours, theirs, crashes = [], [], []
    verdict = None
    if ours_remat is None and measure:  # untimed: the verdict a run long enough to measure caches
        verdict = _run(lambda: run_ours(size, layout, None, 0, measure=True), crashes, "toolkit (measuring)")
        verdict = verdict[0]["note"] if verdict else None
    load_before = _load()
    for _ in range(runs):  # alternate: a drift in the machine's load hits both alike
        ours += _run(lambda: run_ours(size, layout, ours_remat, steps), crashes, "toolkit")
        theirs += _run(lambda: run_maxtext(venv, size, layout, mt_remat, steps, workdir), crashes, "maxtext")
    cell = {
        "name": name,
        "shape": size_name,
        "layout": layout,
        "maxtext_remat": mt_remat or "default",
        "load_average": {"before": load_before, "after": _load()},
        "crashes": crashes,
        "runs": runs,
        "steps": steps,
    }
    if not ours or not theirs:  # a tool crashed on every run: the cell records why, without ratios
        return cell | {"step_time_ratio": None, "rss_ratio": None, "compile_time_ratio": None}
    o_step = statistics.median(_median_tail(r["step_s"]) for r in ours)
    m_step = statistics.median(_median_tail(r["step_s"]) for r in theirs)
    tokens = BATCH * size["seq"]
    n_ours = ours[0]["params"]
    n_mt = theirs[0]["params"] or n_ours
    o_rss = max(r["rss_bytes"] or 0 for r in ours)
    m_rss = max(r["rss_bytes"] or 0 for r in theirs)
    return cell | {
        "ours_remat": ours[0].get("remat"),
        "ours_note": ours[0].get("note"),  # how each auto default was decided (cached, estimated)
        "ours_verdict": verdict,  # the measurement that cached it
        "ours_step_s": o_step,
        "maxtext_step_s": m_step,
        "step_time_ratio": o_step / m_step,
        "flops_ratio_6ND": (6 * n_ours * tokens / o_step) / (6 * n_mt * tokens / m_step),
        "params": {"ours": n_ours, "maxtext": n_mt},
        "compile_time_ratio": _ratio(
            statistics.median(r["compile_s"] for r in ours), statistics.median(r["compile_s"] for r in theirs)
        ),
        "ours_first_step_s": statistics.median(r["first_step_s"] for r in ours),
        "maxtext_first_step_s": statistics.median(r["first_step_s"] for r in theirs),
        "first_step_ratio": statistics.median(r["first_step_s"] for r in ours)
        / statistics.median(r["first_step_s"] for r in theirs),
        "ours_peak_rss_bytes": o_rss,
        "maxtext_peak_rss_bytes": m_rss,
        "rss_ratio": o_rss / m_rss if m_rss else None,
    }


def _own_cache(workdir: Path) -> None:
    """Our runs' verdict cache: the benchmark's own (no verdict of an earlier run decides), with this machine's
    CPU profile copied in (measured once per machine, as a user's runs find it)."""
    sys.path.insert(0, str(REPO))
    from partitioning.tune.measure import cache_dir

    own = workdir / "cache"
    own.mkdir()
    for f in Path(cache_dir()).glob("cpu-*.json"):
        shutil.copy(f, own / f.name)
    os.environ["PARTITIONING_CACHE"] = str(own)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="steps per run (medians of steps 11..N)")
    p.add_argument("--runs", type=int, default=2, help="runs of each tool per pairing, alternating")
    p.add_argument("--sizes", nargs="+", default=["S", "M"], choices=list(SIZES))
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--smoke", action="store_true", help="6 steps, one run, size S, fsdp, default vs default")
    p.add_argument(
        "--measure-defaults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before the default pairing, time our auto defaults once (untimed; cached as a long run caches them)",
    )
    p.add_argument("--venv", type=Path, default=VENV, help=f"MaxText's venv (default {VENV})")
    p.add_argument("--python", default=None, help="a Python >= 3.12 to make MaxText's venv with")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    skipped = ensure_venv(args.venv, args.python)
    if skipped:
        print(f"skipped: {skipped}", file=sys.stderr)
        report({"pairings": [], "skipped": skipped}, args.json)
        return 0
    plan = [(name, s, lay, o, m) for s in args.sizes for lay in args.layouts for name, o, m in REMATS]
    if args.smoke:
        plan, args.steps, args.runs = [("default vs default", "S", "fsdp", None, None)], 6, 1
    out = []
    with tempfile.TemporaryDirectory() as workdir:
        _own_cache(Path(workdir))
        for name, s, lay, o, m in plan:
            print(f"{name}, {s}, {lay} ...", file=sys.stderr, flush=True)
            out.append(
                pairing(name, s, lay, o, m, args.runs, args.steps, args.venv, Path(workdir), args.measure_defaults)
            )
    print(f"{'pairing':<26} {'size':>4} {'layout':>8} {'step ours/MT':>13} {'rss ours/MT':>12} {'compile':>8} load")
    for r in out:
        step = f"{r['step_time_ratio']:.3f}" if r["step_time_ratio"] else "crash"
        rss = f"{r['rss_ratio']:.2f}" if r["rss_ratio"] else "-"
        comp = f"{r['compile_time_ratio']:.2f}" if r["compile_time_ratio"] else "-"
        load = "/".join(f"{x:.2f}" for x in r["load_average"]["before"])
        print(f"{r['name']:<26} {r['shape']:>4} {r['layout']:>8} {step:>13} {rss:>12} {comp:>8} {load}")
        for c in r["crashes"]:
            print(f"  crashed: {c.splitlines()[0]}")
    report({"pairings": out, "skipped": None}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
