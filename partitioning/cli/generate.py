"""``partitioning generate CONFIG --prompt TEXT``: let the model talk, greedy with a KV cache, on the config's mesh.

The weights are the run's latest checkpoint when it has one (``--step N``
another), else the config's Hugging Face checkpoint (``model: {hf: DIR}``;
``--from-hf`` forces it). The prompt is tokenized with the run's tokenizer
(``data.tokenizer``, else the checkpoint's ``tokenizer.json``) with its BOS,
or taken as UTF-8 bytes for a byte-level model; the decoded text (the prompt
and its continuation) goes to stdout, where the weights came from to stderr.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from partitioning.cli.args import config_args, load_with_devices, say
from partitioning.config.build import abstract_model, mesh_from_config, model_from_config
from partitioning.config.hf import hf_params_from_config, run_checkpoints, tokenizer_from_config
from partitioning.config.schema import Config
from partitioning.errors import CheckpointError, ConfigError

HELP = "greedy decoding with a KV cache from the run's latest checkpoint (or its Hugging Face weights)"
EXAMPLES = """examples:
  partitioning generate configs/hf_tiny.yaml --prompt "def main(" --max-tokens 24
  partitioning generate configs/hf_tiny.yaml --prompt "import " --from-hf
  partitioning generate configs/quickstart.yaml --prompt "class " --step 200"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step", type=int, default=None, metavar="N", help="the run's checkpoint at step N")
    g.add_argument("--from-hf", action="store_true", help="the config's Hugging Face weights, not the run's")


def _params(cfg: Config, args: argparse.Namespace, mesh: Any) -> tuple[Any, str]:
    """(params on ``mesh``, where they came from)."""
    from partitioning.checkpoint.disk import list_steps
    from partitioning.checkpoint.restore import abstract_target, restore_checkpoint

    directory = run_checkpoints(cfg)
    steps = [s.step for s in list_steps(directory) if s.complete] if directory.is_dir() else []
    if args.from_hf:
        if cfg.model_hf is None:
            raise ConfigError(f"--from-hf: {cfg.where('model')} is not a Hugging Face checkpoint (model: {{hf: DIR}})")
        return hf_params_from_config(cfg, mesh), f"the Hugging Face weights in {cfg.model_hf}"
    if steps:
        if args.step is not None and args.step not in steps:
            raise CheckpointError(f"--step {args.step}: no such checkpoint in {directory} (steps: {steps})")
        step = args.step if args.step is not None else steps[-1]
        _, variables = abstract_model(cfg)
        target = abstract_target(variables["params"], mesh, cfg.rules, on_indivisible=cfg.on_indivisible)
        params = restore_checkpoint(directory, target, step=step, params_only=True)
        return params, f"step {step} of {directory}"
    if args.step is not None:
        raise CheckpointError(f"--step {args.step}: no checkpoints in {directory}")
    if cfg.model_hf is not None:
        return hf_params_from_config(cfg, mesh), f"the Hugging Face weights in {cfg.model_hf}"
    raise CheckpointError(
        f"{directory}: no checkpoint to generate from; train the config first (or start from a "
        f"Hugging Face checkpoint with model: {{hf: DIR}})"
    )


def run(args: argparse.Namespace) -> int:
    from partitioning.train.generate import decoder_of, generate
    from partitioning.train.tokenize import load_tokenizer

    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}", arg="max_tokens")
    cfg = load_with_devices(args)
    model = model_from_config(cfg)
    mesh = mesh_from_config(cfg, args.devices)
    try:  # a model without a decode mode, or a pipelined mesh, fails before any weight is read
        decoder_of(model, mesh)
    except ConfigError as e:
        key = ("mesh", "shape", "stage") if e.arg == "stage" else ("model",)
        raise ConfigError(f"{cfg.where(*key)}: {e}", arg=e.arg) from None
    path = tokenizer_from_config(cfg)
    tok = load_tokenizer(path) if path is not None else None
    prompt = tok.encode(args.prompt, document=False) if tok is not None else list(args.prompt.encode("utf-8"))
    vocab = getattr(model, "vocab_size", None)
    if tok is None and vocab is not None and vocab < 256:
        raise ConfigError(f"{cfg.where('model')}: a byte-level prompt needs vocab_size >= 256, got {vocab}")
    params, source = _params(cfg, args, mesh)
    start = time.perf_counter()
    try:
        new = generate(
            model,
            params,
            prompt,
            mesh=mesh,
            rules=cfg.rules,
            max_tokens=args.max_tokens,
            stop_id=tok.stop_id if tok is not None else None,
            on_indivisible=cfg.on_indivisible,
        )
    except ConfigError as e:
        if e.arg != "max_positions":
            raise
        raise ConfigError(f"--max-tokens {args.max_tokens} + {len(prompt)} prompt tokens: {e}", arg=e.arg) from None
    took = time.perf_counter() - start
    text = (
        tok.decode(prompt + new)
        if tok is not None
        else bytes(t for t in prompt + new if t < 256).decode("utf-8", errors="replace")
    )
    say(f"generate: {len(new)} tokens from {source}, greedy with a KV cache on mesh {dict(mesh.shape)} ({took:.1f} s)")
    print(text)
    return 0
