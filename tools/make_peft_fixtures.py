"""Golden PEFT LoRA adapters for `partitioning.hf.load_hf(..., adapter=DIR)`, made by `peft` itself.

Run it with a Python that has torch, transformers, peft and safetensors (NOT the project's
dependencies; a separate venv, the same one as for tools/make_hf_fixtures.py)::

    /work/refvenv/bin/python tools/make_peft_fixtures.py        # writes tests/fixtures/peft/<name>/
    /work/refvenv/bin/python tools/make_peft_fixtures.py --check OUT --expect tests/fixtures/peft/llama
    /work/refvenv/bin/python tools/make_peft_fixtures.py --check-merged OUT --expect tests/fixtures/peft/llama

Each fixture directory holds what `PeftModel.save_pretrained` wrote (adapter_config.json +
adapter_model.safetensors) for a base fixture of tests/fixtures/hf/, `logits.npy` (base + adapter
through `PeftModel`, float32, eager attention) and `merged_logits.npy` (the same model after
`merge_and_unload()`) on the base fixture's tokens.npy. lora_A and lora_B are random (lora_B is
NOT zero as after PEFT's default init), so every adapter changes the logits.
`base_model_name_or_path` is rewritten to the base fixture's path relative to the repository.

`--check OUT` loads an adapter directory (e.g. one `partitioning ckpt export-hf` wrote) with
`PeftModel.from_pretrained` on the base (`--base`, default: the expected fixture's base) and
compares its logits with the expected fixture's `logits.npy`; `--check-merged OUT` loads a full
merged checkpoint with `transformers` and compares with `merged_logits.npy`. Exit 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import peft
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "peft"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name -> (base fixture under tests/fixtures/hf, LoraConfig kwargs)
FIXTURES: dict[str, tuple[str, dict]] = {
    # Every linear of attention and MLP, scale alpha / r = 2.
    "llama": ("llama", dict(r=4, lora_alpha=8, target_modules=ALL)),
    # rsLoRA (scale alpha / sqrt(r) = 4) and target_modules as a regex string (PEFT full-matches it).
    "llama_rslora": (
        "llama",
        dict(r=4, lora_alpha=8, use_rslora=True, target_modules=r".*\.(q_proj|v_proj|o_proj|down_proj)"),
    ),
    # Another family: q/k/v biases in the base (the adapters add none), tied embeddings.
    "qwen2": ("qwen2", dict(r=4, lora_alpha=8, target_modules=ALL)),
    # Issue 37's families. OLMo-3 and SmolLM3: every linear (NoPE and sliding layers alike).
    "olmo3": ("olmo3", dict(r=4, lora_alpha=8, target_modules=ALL)),
    "smollm3": ("smollm3", dict(r=4, lora_alpha=8, target_modules=ALL)),
    # Phi-4: the unfused projections (an adapter on the fused qkv_proj / gate_up_proj is not read).
    "phi4": ("phi4", dict(r=4, lora_alpha=8, target_modules=["o_proj", "down_proj"])),
    # GPT-OSS: the attention's projections (the experts are fused parameters, not Linear modules).
    "gpt_oss": ("gpt_oss", dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    # Gemma 4: every linear of attention and MLP (the global layers have no v_proj: their values are the adapted
    # keys), not the per-layer input projections.
    "gemma4": ("gemma4", dict(r=4, lora_alpha=8, target_modules=ALL)),
}


def base_model(base: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def logits(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


def randomize(model: torch.nn.Module, seed: int) -> None:
    """lora_A ~ N(0, 1/in), lora_B ~ N(0, 1/r): the update is as large as the base weight's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def make(name: str, seed: int) -> None:
    base_name, kwargs = FIXTURES[name]
    base = ROOT / "tests" / "fixtures" / "hf" / base_name
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    tokens = np.load(base / "tokens.npy")
    cfg = peft.LoraConfig(task_type="CAUSAL_LM", init_lora_weights=False, lora_dropout=0.0, **kwargs)
    model = peft.get_peft_model(base_model(base), cfg)
    randomize(model, seed)
    model.eval()
    got = logits(model, tokens)
    model.save_pretrained(out)
    acfg = json.loads((out / "adapter_config.json").read_text())
    acfg["base_model_name_or_path"] = str(base.relative_to(ROOT))
    (out / "adapter_config.json").write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model card template: nothing we read
    # The saved adapter reloads to the same logits, so the files (not just the live model) are golden.
    again = peft.PeftModel.from_pretrained(base_model(base), out).eval()
    assert np.array_equal(logits(again, tokens), got), "the saved adapter gives other logits"
    merged = again.merge_and_unload()
    want_merged = logits(merged, tokens)
    np.save(out / "logits.npy", got.astype(np.float32))
    np.save(out / "merged_logits.npy", want_merged.astype(np.float32))
    plain = logits(base_model(base), tokens)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(
        f"{name}: on {base_name}, max |adapter - base| {np.abs(got - plain).max():.3f}, "
        f"max |merged - adapter| {np.abs(want_merged - got).max():.2g}, {size / 1024:.0f} KiB"
    )


def base_of(expect: Path) -> Path:
    return ROOT / json.loads((expect / "adapter_config.json").read_text())["base_model_name_or_path"]


def compare(what: str, got: np.ndarray, want: np.ndarray, atol: float) -> int:
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    ok = diff <= atol
    print(f"{'OK' if ok else 'MISMATCH'} {what}: max |diff| {diff:.3g} (atol {atol})")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"fixtures to make (default all: {', '.join(FIXTURES)})")
    ap.add_argument("--check", type=Path, help="an adapter directory to load with PeftModel.from_pretrained")
    ap.add_argument("--check-merged", type=Path, help="a merged full checkpoint to load with transformers")
    ap.add_argument("--expect", type=Path, default=OUT / "llama", help="the fixture whose logits to compare with")
    ap.add_argument("--base", type=Path, help="the base checkpoint (default: the expected fixture's base)")
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    if args.check or args.check_merged:
        base = args.base or base_of(args.expect)
        tokens = np.load(base / "tokens.npy")
    if args.check:
        model = peft.PeftModel.from_pretrained(base_model(base), args.check).eval()
        return compare(
            f"peft {args.check} on {base}", logits(model, tokens), np.load(args.expect / "logits.npy"), args.atol
        )
    if args.check_merged:
        got = logits(base_model(args.check_merged), tokens)
        return compare(f"merged {args.check_merged}", got, np.load(args.expect / "merged_logits.npy"), args.atol)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    for name in args.names or FIXTURES:
        make(name, seed=100 + list(FIXTURES).index(name))  # the same seed whichever fixtures are made
    return 0


if __name__ == "__main__":
    sys.exit(main())
