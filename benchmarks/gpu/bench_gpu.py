"""The GPU benchmark: one prepared run on one NVIDIA H100 (or any single GPU), <= 8 minutes from a fresh machine.

    python benchmarks/gpu/bench_gpu.py --out DIR          # on the GPU (benchmarks/gpu/run.sh installs first)
    python benchmarks/gpu/bench_gpu.py --cpu --out DIR    # the same sections at tiny sizes on the CPU, seconds

Writes ``DIR/gpu.json`` (every number, the device, the versions) and ``DIR/gpu.txt`` (a short table) after each
section, so a run cut short still leaves what it measured. Sections, each skipped with its reason when the time
left (``--budget-s``, default 420 s) is too short for it:

1. ``train``: the Llama-style decoder of ``llama1b.yaml`` (1.1B parameters, bf16 compute), sequence 2,048 and
   4,096, trained with the toolkit (``remat: auto`` on the device's own profile, the run's attention
   implementation) against a hand-written ``jax.jit`` step of the same Flax module, optax transformation,
   shardings and donation: step time of each (alternating, median), their ratio (target <= 1.02), and the MFU of
   each. Model FLOPs follow PaLM's convention: ``6 * N * tokens + 12 * layers * seq_len * heads * head_dim *
   tokens`` (the attention scores and values counted over the full square, not halved for causality), divided
   by the device's dense bf16 peak (``partitioning.plan.peak_tflops``). ``tune``'s estimate for the chosen remat
   policy on the device profile stands beside each measurement.
2. ``attention``: ``model.attention: xla`` (the toolkit's einsum attention) against ``cudnn``
   (``jax.nn.dot_product_attention``'s cuDNN flash kernel) on the same model and sequences: step time, the
   compiled step's temporary bytes, and the logits of the two on one batch (max |diff|, bf16 tolerance).
   On the CPU only ``xla`` runs (cuDNN needs an NVIDIA GPU).
3. ``remat_fit``: per remat policy (``full``, ``dots_no_batch``, ``none``), the deepest model of the same width
   that ``plan`` says fits the device at batch 1 x 2,048, then built, compiled and stepped: predicted peak
   against the compiled program's peak, and whether the step ran.
4. ``load_hf`` (run before ``remat_fit``, which takes the time left): a ~4 GiB bf16 Llama checkpoint (random
   values, written here) loaded by ``partitioning.hf.load_hf`` against ``safetensors.numpy.load_file`` +
   ``jax.device_put`` of every tensor, both from the page cache, alternating, median GiB/s of each and the ratio
   (target >= 0.8).
5. ``offload``: host offload on one device, the same model at sequence 2,048 and one remat policy (the one
   ``remat: auto`` picks without offload): no offload against ``train.offload: [optimizer]`` updated on the
   device and on the host (``offload_update``), and ``remat: offload`` (activations in host memory). Per
   variant: step time (median), its ratio to no offload, the compiled step's device peak and host bytes, the
   loss of its first step (the same for every variant), and tune's estimate on the device's profile. No
   variant clips gradients (``optimizer.clip_norm: null``): an update on the host cannot take that clip.

6. ``gemm``: the GEMM table ``tune`` prices each matmul by (``partitioning.tune.efficiency``): a bf16
   ``(m, k) x (k, n)`` matmul for every ``m, n, k`` of 256 ... 16,384 (343 shapes; float32 and 32 ... 128 on the
   CPU), each timed alone after its compile, TFLOP/s and share of the device's peak. Also written as
   ``DIR/gemm.json``: a hardware file's ``gemm:`` key reads it (``partitioning.tune.hardware_file``).

Every section works under JAX 0.10 and 0.11. Nothing here is imported by the package or its tests except
through ``--cpu`` (tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "llama1b.yaml"

# What each size means: the GPU's are the issue's, the CPU's run in seconds.
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "train": {"seqs": (2048, 4096), "tokens": 16384, "steps": 8, "rounds": 3},
        "model": [],
        "fit_seq": 2048,
        "fit_policies": ("full", "dots_no_batch", "none"),
        "fit_max_layers": 512,
        "fit_budget": [],  # the device's own memory
        "hf_gib": 4.0,
        "hf_rounds": 2,
        "offload": {"seq": 2048, "batch_size": 4, "steps": 5, "rounds": 3},
        "gemm": {"sizes": (256, 512, 1024, 2048, 4096, 8192, 16384), "dtype": "bfloat16", "min_s": 0.02},
    },
    "cpu": {
        "train": {"seqs": (64,), "tokens": 512, "steps": 1, "rounds": 1},
        "model": [
            "model.vocab_size=256",
            "model.embed=64",
            "model.heads=4",
            "model.kv_heads=2",
            "model.mlp=128",
            "model.layers=2",
        ],
        "fit_seq": 64,
        "fit_policies": ("full",),
        "fit_budget": ["mesh.device_memory=4MiB"],
        "fit_max_layers": 8,
        "hf_gib": 0.004,
        "hf_rounds": 1,
        "offload": {"seq": 64, "batch_size": 4, "steps": 1, "rounds": 1},
        "gemm": {"sizes": (32, 64, 128), "dtype": "float32", "min_s": 0.002},
    },
}
# Seconds each section needs at least on the GPU (compiles included), to skip what cannot finish.
NEEDS = {"train": 150, "gemm": 120, "attention": 90, "load_hf": 40, "remat_fit": 120, "offload": 150}
NO_GPU = "no GPU visible to jax (run with --cpu for the tiny CPU sizes)"


class Run:
    """The JSON being filled, written after every section."""

    def __init__(self, out: Path, budget_s: float, cpu: bool):
        self.out, self.t0, self.budget, self.cpu = out, time.monotonic(), budget_s, cpu
        self.results: dict[str, Any] = {"sections": {}}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def section(self, name: str, isolate: bool) -> None:
        need = 0 if self.cpu else NEEDS[name]
        if self.left() < need:
            self.results["sections"][name] = {"skipped": f"{self.left():.0f} s left, the section needs ~{need} s"}
        else:
            t = time.monotonic()
            print(f"== {name} ({self.left():.0f} s left)", flush=True)
            out = in_fresh_process(name, self.cpu, self.left()) if isolate else run_section(name, self.cpu)
            for key in ("device", "jax"):  # the same in every section: said once, at the top
                if key in out:
                    self.results[key] = out.pop(key)
            out["seconds"] = round(time.monotonic() - t, 1)
            self.results["sections"][name] = out
            if name == "gemm" and out.get("points"):
                (self.out / "gemm.json").write_text(json.dumps(gemm_table(out, self.results.get("device"))))
        self.write()

    def write(self) -> None:
        self.results["wall_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "gpu.json").write_text(json.dumps(self.results, indent=2, default=float))
        (self.out / "gpu.txt").write_text(table(self.results))


# -- building blocks -----------------------------------------------------------------------------------------


def load(sets: list[str]):
    from partitioning.config.load import load_config

    return load_config(str(CONFIG), sets)


def model_flops(cfg, tokens: int, num_params: int) -> float:
    """PaLM's convention (see the module docstring)."""
    o = cfg.model_options
    head_dim = o.get("head_dim") or o["embed"] // o["heads"]
    return 6 * num_params * tokens + 12 * o["layers"] * cfg.train.seq_len * o["heads"] * head_dim * tokens


def remat_estimates(cfg, mesh, policies: tuple[str, ...] | None = None) -> dict[str, Any]:
    """tune's priced step time and peak of every remat policy on this device's profile, and the one auto picks."""
    from partitioning.config.remat import price_remat
    from partitioning.plan.budget import device_memory
    from partitioning.tune.hardware import hardware
    from partitioning.tune.measure import local_profile

    hw, source = local_profile(mesh.size)
    hw = hw or hardware("h100")
    budget = cfg.mesh.memory_bytes or device_memory() or hw.memory
    choice = price_remat(cfg, {a: int(n) for a, n in mesh.shape.items()}, hw, budget, policies)
    return {
        "profile": hw.name,
        "profile_source": source,
        "budget_bytes": int(budget),
        "policy": choice.policy,
        "estimates": {
            r.candidate.remat: {"step_s": r.step_time, "peak_bytes": int(r.peak), "fits": bool(r.fits)}
            for r in choice.results
            if r.analytic is not None
        },
    }


def hand_written_step(trainer):
    """What a user writes with plain JAX: the same Flax module, optax transformation, loss, shardings, donation
    (``benchmarks/bench_train.py``'s, which the CPU benchmarks compare against too)."""
    sys.path.insert(0, str(HERE.parent))
    from bench_train import hand_written_step as hand

    return hand(trainer)


def random_batch(trainer, cfg, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (cfg.train.batch_size, cfg.train.seq_len)
    tokens = rng.integers(0, cfg.model_options["vocab_size"], size=(shape[0], shape[1] + 1), dtype=np.int32)
    return trainer.place({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})


def temp_bytes(compiled) -> int | None:
    try:
        return int(compiled.memory_analysis().temp_size_in_bytes)
    except Exception:  # backends without a memory analysis
        return None


def peak_tflops() -> float | None:
    import jax

    import partitioning as pt

    return pt.plan.peak_tflops(jax.devices()[0])


# -- 1. the toolkit against hand-written JAX -------------------------------------------------------------------


def build(sets: list[str]):
    from partitioning.config.build import mesh_from_config, trainer_from_config
    from partitioning.config.remat import resolve_remat

    cfg = load(sets)
    mesh = mesh_from_config(cfg, devices=1)
    resolved, note = resolve_remat(cfg, mesh)
    return cfg, resolved, mesh, trainer_from_config(resolved, mesh), note


def timed(fn, steps: int) -> float:
    import jax

    t = time.perf_counter()
    out = None
    for _ in range(steps):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / steps


def bench_train(size: dict[str, Any], extra: list[str]) -> dict[str, Any]:
    import jax

    from partitioning.mesh import sharding_context

    s, peak = size["train"], peak_tflops()
    rows = []
    for seq in s["seqs"]:
        sets = [*size["model"], *extra, f"train.seq_len={seq}", f"train.batch_size={max(1, s['tokens'] // seq)}"]
        cfg, resolved, mesh, trainer, note = build(sets)
        est = remat_estimates(cfg, mesh)
        batch = random_batch(trainer, resolved)
        state = trainer.init(jax.random.key(0))
        s0 = trainer.init(jax.random.key(0))
        hand, hand_state = hand_written_step(trainer), (s0.step, s0.params, s0.opt_state)
        del s0
        box: dict[str, Any] = {"tk": state, "hw": hand_state}

        def toolkit(box=box, trainer=trainer, batch=batch):
            box["tk"], m = trainer.train_step(box["tk"], batch)
            return m

        def handwritten(box=box, trainer=trainer, batch=batch, hand=hand):
            with sharding_context(trainer.mesh, trainer.rules):
                box["hw"], m = hand(box["hw"], batch)
            return m

        t = time.perf_counter()
        timed(toolkit, 1)
        compile_tk = time.perf_counter() - t
        t = time.perf_counter()
        timed(handwritten, 1)
        compile_hw = time.perf_counter() - t
        tk, hw = [], []
        for r in range(s["rounds"]):
            for side in (toolkit, handwritten) if r % 2 == 0 else (handwritten, toolkit):
                (tk if side is toolkit else hw).append(timed(side, s["steps"]))
        print(f"   seq {seq}: first steps {compile_tk:.1f} s / {compile_hw:.1f} s, timed {tk} / {hw}", flush=True)
        tokens = resolved.train.batch_size * seq
        flops = model_flops(resolved, tokens, trainer.num_params)
        tk_s, hw_s = statistics.median(tk), statistics.median(hw)
        policy = resolved.model_options.get("remat")
        rows.append(
            {
                "seq_len": seq,
                "batch_size": resolved.train.batch_size,
                "params": trainer.num_params,
                "attention": resolved.model_options.get("attention", "xla"),
                "remat": policy,
                "remat_note": note,
                "toolkit_step_s": tk_s,
                "hand_written_step_s": hw_s,
                "ratio": tk_s / hw_s,
                "model_tflops_per_step": flops / 1e12,
                "mfu_toolkit": None if peak is None else flops / tk_s / (peak * 1e12),
                "mfu_hand_written": None if peak is None else flops / hw_s / (peak * 1e12),
                "first_step_s": {"toolkit": compile_tk, "hand_written": compile_hw},
                "tune_estimate_step_s": est["estimates"].get(policy, {}).get("step_s"),
                "tune": est,
                "runs": {"toolkit": tk, "hand_written": hw},
            }
        )
        box.clear()  # the two states' buffers go before the next sequence's
    return {"peak_tflops": peak, "flops_convention": "PaLM: 6 N tokens + 12 L T H Q tokens", "rows": rows}


# -- 2. attention implementations ------------------------------------------------------------------------------


def bench_attention(size: dict[str, Any], cpu: bool) -> dict[str, Any]:
    """One implementation at a time, its state freed before the next: two 1.1B states and the einsum attention's
    scores at 4,096 do not fit one device together (the first H200 run ran out of memory holding both)."""
    import gc

    import jax
    import numpy as np

    impls = ("xla",) if cpu else ("xla", "cudnn")
    s, rows = size["train"], []
    for seq in s["seqs"]:
        sides: dict[str, Any] = {}
        for impl in impls:
            sets = [
                *size["model"],
                f"model.attention={impl}",
                f"train.seq_len={seq}",
                f"train.batch_size={max(1, s['tokens'] // seq)}",
            ]
            _, resolved, _, trainer, _ = build(sets)
            batch = random_batch(trainer, resolved)
            box = {"s": trainer.init(jax.random.key(0))}  # the same key: the same weights for both
            side: dict[str, Any] = {"remat": resolved.model_options.get("remat")}
            try:
                compiled = trainer.lower_train_step().compile()  # one compile: its memory analysis, then its steps
                side["temp_bytes"] = temp_bytes(compiled)
                if len(impls) > 1:
                    apply = jax.jit(trainer.model.module.apply)
                    logits = apply({"params": box["s"].params}, batch["inputs"][:1])
                    side["logits"] = np.asarray(jax.device_get(logits), np.float32)

                def step(box=box, compiled=compiled, batch=batch):
                    box["s"], m = compiled(box["s"], batch)
                    return m

                timed(step, 1)
                side["times"] = [timed(step, s["steps"]) for _ in range(s["rounds"])]
            except Exception as e:  # out of memory at one implementation is a result; the other still runs
                side["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            box.clear()
            gc.collect()
            sides[impl] = side
        print(f"   seq {seq}: " + ", ".join(f"{k} {v.get('times') or v.get('error')}" for k, v in sides.items()))
        row: dict[str, Any] = {"seq_len": seq}
        for impl, side in sides.items():
            row[impl] = {"remat": side["remat"], "temp_bytes": side.get("temp_bytes")}
            if "times" in side:
                row[impl]["step_s"] = statistics.median(side["times"])
            else:
                row[impl]["error"] = side["error"]
        if all("logits" in sides.get(i, {}) for i in ("xla", "cudnn")):
            a, b = sides["xla"]["logits"], sides["cudnn"]["logits"]
            row["logits_max_abs_diff"] = float(np.abs(a - b).max())
            row["logits_scale"] = float(np.abs(a).max())
        if all("step_s" in row.get(i, {}) for i in ("xla", "cudnn")):
            row["step_ratio_cudnn_over_xla"] = row["cudnn"]["step_s"] / row["xla"]["step_s"]
        rows.append(row)
    return {"implementations": list(impls), "rows": rows}


# -- 3. the deepest model each remat policy fits ---------------------------------------------------------------


def predicted_peak(sets: list[str], mesh, policy: str) -> tuple[int, int]:
    """(priced peak bytes, budget) of a config under one remat policy."""
    est = remat_estimates(load(sets), mesh, (policy,))
    (only,) = est["estimates"].values()
    return only["peak_bytes"], est["budget_bytes"]


def fit_run(sets: list[str]) -> dict[str, Any]:
    """Build, compile and step one config: what ran."""
    import jax

    _, resolved, _, trainer, _ = build(sets)
    row: dict[str, Any] = {"params": trainer.num_params}
    try:
        compiled = trainer.lower_train_step().compile()
        ma = compiled.memory_analysis()
        row["compiled_peak_bytes"] = int(
            ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes
        )
        state = trainer.init(jax.random.key(0))
        state, m = compiled(state, random_batch(trainer, resolved))
        row["ran"], row["loss"] = True, float(m["loss"])
    except Exception as e:  # out of memory is the answer being measured
        row["ran"], row["error"] = False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return row


def fit_policy(size: dict[str, Any], policy: str, layers: int | None) -> dict[str, Any]:
    """The deepest model ``policy`` is priced to fit (or ``layers`` of it), then built and stepped: run in a
    process of its own, whose device no earlier model fragmented and no parent holds."""
    import jax

    from partitioning.mesh import make_mesh

    mesh = make_mesh({"data": 1, "fsdp": -1}, devices=jax.devices()[:1])
    sets = [*size["model"], *size["fit_budget"], "train.batch_size=1", f"train.seq_len={size['fit_seq']}"]
    sets.append(f"model.remat={policy}")

    def peak_at(n: int) -> tuple[int, int]:
        return predicted_peak([*sets, f"model.layers={n}"], mesh, policy)

    if layers is None:
        lo, hi = 1, size["fit_max_layers"] + 1
        peak, budget = peak_at(lo)
        if peak > budget:
            return {"remat": policy, "layers": 0, "ran": False, "note": "one layer does not fit"}
        while hi - lo > 1:  # the deepest model whose priced peak fits the budget
            mid = (lo + hi) // 2
            peak, budget = peak_at(mid)
            lo, hi = (mid, hi) if peak <= budget else (lo, mid)
        layers = lo
    peak, budget = peak_at(layers)
    row: dict[str, Any] = {"remat": policy, "layers": layers, "predicted_peak_bytes": peak, "budget_bytes": budget}
    return {**row, **fit_run([*sets, f"model.layers={layers}"])}


def bench_remat_fit(size: dict[str, Any], cpu: bool) -> dict[str, Any]:
    """Each policy in a fresh process; this one never touches the device (a parent holding jax's memory pool
    left its children a quarter of the GPU: every model failed in the second H200 run)."""
    rows = []
    for policy in size["fit_policies"]:
        row = child(["--fit-policy", policy], cpu)
        if row.get("error") == NO_GPU:
            return row
        if not row.get("ran") and row.get("layers"):  # how far under the priced limit a model must stay to run
            again = child(["--fit-policy", policy, "--fit-layers", str(max(1, int(row["layers"] * 0.95)))], cpu)
            row["fallback"] = again
        rows.append(row)
        print(f"   {policy}: {row.get('layers')} layers, ran: {row.get('ran')}", flush=True)
    return {"seq_len": size["fit_seq"], "rows": rows}


# -- 4. load_hf against safetensors + device_put ---------------------------------------------------------------


def write_bf16_llama(directory: Path, gib: float) -> int:
    """A random-valued bf16 Llama checkpoint of about ``gib`` GiB (one repeated random block: cheap to write)."""
    d, h, g, k, m, vocab = 2048, 16, 8, 128, 8192, 32000
    per_layer = 2 * (d * (h + 2 * g) * k + h * k * d + 3 * d * m + 2 * d)
    layers = max(1, round((gib * 2**30 - 4 * vocab * d) / per_layer))
    if gib < 0.1:  # the CPU's tiny one
        d, h, g, k, m, vocab, layers = 64, 4, 2, 16, 128, 256, 2
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": d,
        "intermediate_size": m,
        "num_hidden_layers": layers,
        "num_attention_heads": h,
        "num_key_value_heads": g,
        "head_dim": k,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    sys.path.insert(0, str(HERE.parent))
    from bench_hf import write_llama

    return write_llama(directory, cfg, "bfloat16", shard_bytes=2 * 10**9, fresh=False)


def bench_load_hf(size: dict[str, Any], workdir: Path) -> dict[str, Any]:
    import jax
    from safetensors.numpy import load_file

    import partitioning as pt

    ckpt = workdir / "llama_bf16"
    t = time.perf_counter()
    nbytes = write_bf16_llama(ckpt, size["hf_gib"])
    write_s = time.perf_counter() - t
    mesh = pt.make_mesh({"data": 1, "fsdp": -1}, devices=jax.devices()[:1])
    device = jax.devices()[0]

    def ours() -> float:
        t = time.perf_counter()
        _, variables = pt.hf.load_hf(ckpt, mesh, "fsdp", param_dtype="bfloat16")
        jax.block_until_ready(variables)
        dt = time.perf_counter() - t
        del variables
        return dt

    def baseline() -> float:
        t = time.perf_counter()
        arrays = []
        for f in sorted(ckpt.glob("*.safetensors")):
            arrays += [jax.device_put(a, device) for a in load_file(f).values()]
        jax.block_until_ready(arrays)
        dt = time.perf_counter() - t
        del arrays
        return dt

    ours(), baseline()  # compile the loader's casts once, warm the page cache for both
    a, b = [], []
    for r in range(size["hf_rounds"]):
        for side in (ours, baseline) if r % 2 == 0 else (baseline, ours):
            (a if side is ours else b).append(side())
    gib = nbytes / 2**30
    return {
        "checkpoint_gib": gib,
        "write_s": write_s,
        "load_hf_gib_per_s": gib / statistics.median(a),
        "safetensors_device_put_gib_per_s": gib / statistics.median(b),
        "ratio": statistics.median(b) / statistics.median(a),
        "runs": {"load_hf_s": a, "safetensors_device_put_s": b},
    }


# -- 5. host offload ---------------------------------------------------------------------------------------------

OFFLOAD_VARIANTS = {
    "none": [],
    "optimizer": ["train.offload=[optimizer]", "train.offload_update=device"],
    "optimizer_host_update": ["train.offload=[optimizer]", "train.offload_update=host"],
    "remat_offload": ["model.remat=offload"],
}


def offload_estimate(cfg, mesh) -> dict[str, Any]:
    """tune's price of this config's own layout (its remat, its offload) on the device's profile."""
    from partitioning.config.planning import tune_inputs
    from partitioning.plan.budget import device_memory
    from partitioning.tune.hardware import hardware
    from partitioning.tune.measure import local_profile
    from partitioning.tune.price import price
    from partitioning.tune.space import Candidate

    hw, _ = local_profile(mesh.size)
    hw = hw or hardware("h100")
    inputs, t = tune_inputs(cfg), cfg.train
    sizes = tuple((a, int(n)) for a, n in mesh.shape.items())
    c = Candidate(
        sizes, "run", cfg.model_options.get("remat"), offload=tuple(t.offload), offload_update=t.offload_update
    )
    budget = cfg.mesh.memory_bytes or device_memory() or hw.memory
    r = price(inputs.params, inputs.opt_state, c, cfg.rules, inputs.workload, hw, budget, records=inputs.records)
    return {
        "profile": hw.name,
        "step_s": r.step_time if r.analytic else None,
        "peak_bytes": r.peak,
        "host_bytes": r.host,
    }


def bench_offload(size: dict[str, Any]) -> dict[str, Any]:
    """Each variant built, compiled, stepped and freed before the next (two 1.1B states do not share a device
    comfortably); the remat policy is the baseline's, so only where the state lives changes."""
    import gc

    import jax

    from partitioning.plan.compiled import memory_stats

    o = size["offload"]
    # No global-norm clip in any variant: an update on the host cannot take one (partitioning.train.offload).
    base = [
        *size["model"],
        f"train.seq_len={o['seq']}",
        f"train.batch_size={o['batch_size']}",
        "optimizer.clip_norm=null",
    ]
    policy, rows = None, {}
    for name, sets in OFFLOAD_VARIANTS.items():
        extra = list(sets) if policy is None or name == "remat_offload" else [*sets, f"model.remat={policy}"]
        try:
            cfg, resolved, mesh, trainer, _ = build([*base, *extra])
            policy = policy or resolved.model_options.get("remat")
            row: dict[str, Any] = {"remat": resolved.model_options.get("remat"), "offload": resolved.train.offload}
            row["offload_update"] = resolved.train.offload_update
            row["tune"] = offload_estimate(resolved, mesh)
            compiled = trainer.lower_train_step().compile()
            mem = memory_stats(compiled) or {}
            row["device_peak_bytes"], row["host_bytes"] = mem.get("peak_estimate"), mem.get("host")
            batch = random_batch(trainer, resolved)
            box = {"s": trainer.init(jax.random.key(0))}

            def step(box=box, compiled=compiled, batch=batch):
                box["s"], m = compiled(box["s"], batch)
                return m

            row["first_loss"] = float(step()["loss"])
            row["times"] = [timed(step, o["steps"]) for _ in range(o["rounds"])]
            row["step_s"] = statistics.median(row["times"])
            box.clear()
        except Exception as e:  # out of memory or an unsupported transfer is a result; the others still run
            row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        gc.collect()
        rows[name] = row
        print(f"   {name}: {row.get('step_s') or row.get('error')}", flush=True)
    none = rows["none"].get("step_s")
    for row in rows.values():
        if none and row.get("step_s"):
            row["ratio_to_none"] = row["step_s"] / none
    return {"seq_len": o["seq"], "batch_size": o["batch_size"], "variants": rows}


# -- 6. the GEMM table ----------------------------------------------------------------------------------------


def bench_gemm(size: dict[str, Any]) -> dict[str, Any]:
    """TFLOP/s of a ``(m, k) x (k, n)`` matmul for every ``m, n, k`` of the size's grid, each alone on the device."""
    import jax
    import jax.numpy as jnp

    g = size["gemm"]
    dtype, peak = jnp.dtype(g["dtype"]), peak_tflops()
    dot = jax.jit(jnp.dot)
    points = []
    for m in g["sizes"]:
        for k in g["sizes"]:
            a = jnp.ones((m, k), dtype)
            for n in g["sizes"]:
                b = jnp.ones((k, n), dtype)
                jax.block_until_ready(dot(a, b))  # compile, warm
                steps, t = 1, timed(lambda a=a, b=b: dot(a, b), 1)
                while steps * t < g["min_s"] and steps < 4096:
                    steps *= 4
                    t = timed(lambda a=a, b=b: dot(a, b), steps)
                points.append([m, n, k, float(f"{2 * m * n * k / t / 1e12:.4g}")])
        print(f"   m {m}: {len(points)} shapes", flush=True)
    best = max(p[3] for p in points)
    return {"dtype": g["dtype"], "peak_tflops": peak, "columns": ["m", "n", "k", "tflops"], "points": points,
            "best_tflops": best, "best_share": None if peak is None else best / peak}  # fmt: skip


def gemm_table(section: dict[str, Any], device: str | None) -> dict[str, Any]:
    """The section as a GEMM table a hardware file reads (``partitioning.tune.efficiency.GemmTable.from_json``):
    shares of the device's peak, or of the fastest shape measured where the device has no published peak."""
    peak = section["peak_tflops"] or section["best_tflops"]
    return {
        "name": f"{section['dtype']} GEMM on {device}",
        "source": f"measured by benchmarks/gpu/bench_gpu.py (gemm) on {device}",
        "date": time.strftime("%Y-%m-%d"),
        "measured": True,
        "peak_flops": peak * 1e12,
        "columns": section["columns"],
        "points": section["points"],
    }


# -- report ------------------------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    def f(x, spec=".3g"):
        return "-" if x is None else format(x, spec)

    lines = [f"device: {results.get('device')}  jax {results.get('jax')}  wall {results.get('wall_s')} s"]
    sec = results["sections"]
    for name, body in sec.items():
        if not any(k in body for k in ("rows", "ratio", "points", "variants")):
            lines.append(f"{name}: {body.get('skipped') or body.get('error') or body}")
    for r in sec.get("train", {}).get("rows", []):
        lines.append(
            f"train seq {r['seq_len']} x {r['batch_size']} ({r['remat']}, {r['attention']}): toolkit "
            f"{f(r['toolkit_step_s'])} s, hand-written {f(r['hand_written_step_s'])} s, ratio {f(r['ratio'])}; "
            f"MFU {f(r['mfu_toolkit'], '.1%')} vs {f(r['mfu_hand_written'], '.1%')}; "
            f"tune est. {f(r['tune_estimate_step_s'])} s"
        )
    for r in sec.get("attention", {}).get("rows", []):
        parts = [
            f"{k} {f(v.get('step_s'))} s, temp {f(v.get('temp_bytes') and v['temp_bytes'] / 2**30)} GiB"
            + (f" ({v['error'][:60]})" if "error" in v else "")
            for k, v in r.items()
            if isinstance(v, dict)
        ]
        diff = r.get("logits_max_abs_diff")
        lines.append(
            f"attention seq {r['seq_len']}: "
            + "; ".join(parts)
            + (f"; logits |diff| {f(diff)}" if diff is not None else "")
        )
    for r in sec.get("remat_fit", {}).get("rows", []):
        lines.append(
            f"remat {r.get('remat')}: deepest fitting {r.get('layers')} layers ({f(r.get('params'))} params), "
            f"predicted peak {f(r.get('predicted_peak_bytes') and r['predicted_peak_bytes'] / 2**30)} GiB, compiled "
            f"{f(r.get('compiled_peak_bytes') and r['compiled_peak_bytes'] / 2**30)} GiB, ran: {r.get('ran')}"
            + (f"; {r['fallback']['layers']} layers ran: {r['fallback'].get('ran')}" if "fallback" in r else "")
        )
    for name, r in sec.get("offload", {}).get("variants", {}).items():
        if "error" in r:
            lines.append(f"offload {name}: {r['error'][:120]}")
            continue
        lines.append(
            f"offload {name} ({r['remat']}): {f(r['step_s'])} s, x{f(r.get('ratio_to_none'))} of none; device "
            f"peak {f(r['device_peak_bytes'] and r['device_peak_bytes'] / 2**30)} GiB, host "
            f"{f(r['host_bytes'] and r['host_bytes'] / 2**30)} GiB; tune est. {f(r['tune']['step_s'])} s"
        )
    gm = sec.get("gemm", {})
    if gm.get("points"):
        lines.append(
            f"gemm: {len(gm['points'])} shapes ({gm['dtype']}), the fastest {f(gm['best_tflops'])} TFLOP/s"
            + (f" ({f(gm['best_share'], '.1%')} of peak)" if gm.get("best_share") else "")
        )
    h = sec.get("load_hf", {})
    if "ratio" in h:
        lines.append(
            f"load_hf {f(h['checkpoint_gib'])} GiB: {f(h['load_hf_gib_per_s'])} GiB/s vs safetensors + device_put "
            f"{f(h['safetensors_device_put_gib_per_s'])} GiB/s, ratio {f(h['ratio'])}"
        )
    return "\n".join(lines) + "\n"


def run_section(name: str, cpu: bool) -> dict[str, Any]:
    """One section in this process, its failure recorded rather than raised."""
    size = SIZES["cpu" if cpu else "gpu"]
    if name == "remat_fit":  # its children use the device: this process must not take jax's memory pool
        return bench_remat_fit(size, cpu)
    try:
        import jax

        if not cpu and jax.default_backend() == "cpu":
            return {"error": NO_GPU}
        with tempfile.TemporaryDirectory() as tmp:
            out = {
                "train": lambda: bench_train(size, [] if cpu else ["model.attention=auto"]),
                "attention": lambda: bench_attention(size, cpu),
                "load_hf": lambda: bench_load_hf(size, Path(tmp)),
                "offload": lambda: bench_offload(size),
                "gemm": lambda: bench_gemm(size),
            }[name]()
        dev = jax.devices()[0]
        return {**out, "device": f"{dev.platform}: {getattr(dev, 'device_kind', '')}", "jax": jax.__version__}
    except Exception as e:
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]}


def child(args: list[str], cpu: bool, timeout: float | None = None) -> dict[str, Any]:
    """This script in a new process (its output passes through); the JSON it leaves in a temp file."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, *args, "--result", str(result), *(["--cpu"] if cpu else [])]
        try:
            proc = subprocess.run(cmd, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if result.exists():
            return json.loads(result.read_text())
        return {"error": f"the process exited {proc.returncode} without a result"}


def in_fresh_process(name: str, cpu: bool, left: float) -> dict[str, Any]:
    """A section in a process of its own: a fresh allocator, and the GPU memory back when it ends."""
    return child(["--section", name], cpu, timeout=max(left, 30.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "out/gpu", help="folder for gpu.json and gpu.txt")
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what CI runs)")
    p.add_argument("--budget-s", type=float, default=420.0, help="seconds for all sections (default 420)")
    p.add_argument("--only", nargs="*", choices=tuple(NEEDS), help="run only these sections")
    # A child's work (this script runs itself): one section, or one remat_fit policy; its JSON to --result.
    p.add_argument("--section", choices=tuple(NEEDS), help=argparse.SUPPRESS)
    p.add_argument("--fit-policy", help=argparse.SUPPRESS)
    p.add_argument("--fit-layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    # The installed package, not the checkout: only an install maps models/ to partitioning.models.
    if args.section or args.fit_policy:
        size = SIZES["cpu" if args.cpu else "gpu"]
        if args.section:
            out = run_section(args.section, args.cpu)
        else:
            import jax

            gpu = args.cpu or jax.default_backend() != "cpu"
            out = fit_policy(size, args.fit_policy, args.fit_layers) if gpu else {"error": NO_GPU}
        Path(args.result).write_text(json.dumps(out, default=float))
        return 0
    run = Run(Path(args.out), args.budget_s, args.cpu)
    run.results.update(python=platform.python_version(), sizes="cpu" if args.cpu else "gpu")
    # On a GPU each section runs in a process of its own and this one never touches the device: jax keeps
    # 75% of the GPU for the life of the process that first uses it. The CPU runs them here (seconds saved).
    for name in args.only or list(NEEDS):
        run.section(name, isolate=not args.cpu)
        if run.results["sections"][name].get("error") == NO_GPU:
            print(f"error: {NO_GPU}", file=sys.stderr)
            return 2
    print(table(run.results))
    errors = [n for n, s in run.results["sections"].items() if "error" in s]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
