"""``partitioning generate CONFIG --prompt TEXT``: let the model talk, with a KV cache, on the config's mesh.

The weights are the run's latest checkpoint when it has one (``--step N``
another), else the config's Hugging Face checkpoint (``model: {hf: DIR}``;
``--from-hf`` forces it). The prompt is tokenized with the run's tokenizer
(``data.tokenizer``, else the checkpoint's ``tokenizer.json``) with its BOS,
or taken as UTF-8 bytes for a byte-level model; the decoded text (the prompt
and its continuation) goes to stdout, where the weights came from to stderr.

Greedy unless ``--temperature`` > 0 (then ``--top-k`` / ``--top-p`` filter as
transformers does, ``--seed`` fixes the draws). Decoding stops at the
tokenizer's EOS and every ``eos_token_id`` of the checkpoint's
``generation_config.json``. ``--chat`` renders the prompt as a user turn with
the checkpoint's chat template, or the run's ``data.chat_template`` (and prints only the reply); ``--prompts FILE``
decodes a batch (one prompt a line, or JSONL rows with ``prompt`` or
``messages``) and prints one JSON line per prompt.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from partitioning.cli.args import config_args, load_with_devices, say
from partitioning.config.build import abstract_model, mesh_from_config, model_from_config
from partitioning.config.hf import hf_params_from_config, run_checkpoints, tokenizer_from_config
from partitioning.config.positions import check_generate_length, past_trained_positions
from partitioning.config.schema import Config
from partitioning.errors import CheckpointError, ConfigError, DataError

HELP = "decoding (greedy or sampled) with a KV cache from the run's latest checkpoint (or its Hugging Face weights)"
EXAMPLES = """examples:
  partitioning generate configs/hf_tiny.yaml --prompt "def main(" --max-tokens 24
  partitioning generate configs/hf_tiny.yaml --prompt "import " --from-hf
  partitioning generate configs/quickstart.yaml --prompt "class " --step 200
  partitioning generate configs/hf_tiny.yaml --prompt "def " --temperature 0.7 --top-p 0.9 --seed 1
  partitioning generate configs/hf_tiny.yaml --prompts prompts.jsonl --chat"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the text to continue")
    src.add_argument(
        "--prompts",
        metavar="FILE",
        help="a batch of prompts: one a line, or JSONL rows {prompt: TEXT} / {messages: [...]}; prints JSON lines",
    )
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy (default); > 0: sample")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest tokens (0: all)")
    p.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="sample among the likeliest tokens of mass P (0 < P <= 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="the random seed of sampling (same seed, same text)")
    p.add_argument("--chat", action="store_true", help="render the prompt with the checkpoint's chat template")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step", type=int, default=None, metavar="N", help="the run's checkpoint at step N")
    g.add_argument("--from-hf", action="store_true", help="the config's Hugging Face weights, not the run's")


def _params(cfg: Config, args: argparse.Namespace, mesh: Any, length: int) -> tuple[Any, str]:
    """(params on ``mesh``, where they came from); ``length``: the sequence generate runs (not train.seq_len)."""
    from partitioning.checkpoint.disk import list_steps, resolve_checkpoint, step_flag
    from partitioning.checkpoint.restore import abstract_target, restore_checkpoint

    directory = run_checkpoints(cfg)
    # Finished saves, damaged ones included: a damaged latest step is refused, never passed over in silence.
    steps = [s.step for s in list_steps(directory) if s.finalized] if directory.is_dir() else []
    if args.from_hf:
        if cfg.model_hf is None:
            raise ConfigError(f"--from-hf: {cfg.where('model')} is not a Hugging Face checkpoint (model: {{hf: DIR}})")
        return hf_params_from_config(cfg, mesh), f"the Hugging Face weights in {cfg.model_hf}"
    if steps:
        if args.step is not None and args.step not in steps:
            raise CheckpointError(f"--step {args.step}: no such checkpoint in {directory} (steps: {steps})")
        with step_flag("--step"):  # a damaged step (or base) is refused with advice naming --step
            step = resolve_checkpoint(directory, args.step).step
            _, variables = abstract_model(cfg, seq_len=length)
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


def _sampling(args: argparse.Namespace) -> Any:
    from partitioning.decode.sampling import Sampling

    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}", arg="max_tokens")
    try:
        return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    except ConfigError as e:
        raise ConfigError(f"--{str(e.arg).replace('_', '-')}: {e}", arg=e.arg) from None


def _template_dir(cfg: Config, tokenizer_path: Any) -> Any:
    """Where the chat template and generation_config.json live: the checkpoint, else the tokenizer's folder."""
    if cfg.model_hf is not None:
        return cfg.model_hf if cfg.model_hf.is_dir() else cfg.model_hf.parent
    return tokenizer_path.parent if tokenizer_path is not None else None


def _chat_template(cfg: Config, folder: Any) -> Any:
    from partitioning.data.chat import ChatTemplate

    if cfg.data.chat_template is not None:  # the template the run's chat data was rendered with
        from pathlib import Path

        from partitioning.config.hf import find_beside
        from partitioning.data.instruct import template_for

        found, looked = find_beside(cfg.data.chat_template, cfg.path, cfg.lines, ("data", "chat_template"))
        if found is None:
            raise DataError(
                f"{cfg.where('data', 'chat_template')}: no such chat template {cfg.data.chat_template!r} "
                f"(looked in {', '.join(looked)})"
            )
        return template_for(Path(folder) if folder is not None else found.parent, str(found))
    if folder is None:
        raise ConfigError("--chat: the run has no tokenizer, so no chat template; drop --chat", arg="chat")
    try:
        return ChatTemplate.from_dir(folder)
    except DataError as e:
        if "no chat template" in str(e):
            raise ConfigError(
                f"--chat: {folder} has no chat template (tokenizer_config.json chat_template or "
                f"chat_template.jinja); drop --chat for a base model",
                arg="chat",
            ) from None
        raise


def _encode(prompt: Any, tok: Any, template: Any, where: str) -> list[int]:
    """A prompt's token ids: a chat (or --chat text) through the template, without the tokenizer's BOS, as
    transformers' apply_chat_template tokenizes; plain text with the tokenizer's BOS; bytes without a tokenizer."""
    if isinstance(prompt, list) or template is not None:
        if template is None:
            raise ConfigError(f"{where}: a `messages` prompt needs --chat (the checkpoint's chat template)")
        if tok is None:
            raise ConfigError(f"{where}: a chat prompt needs a tokenizer")
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        text = template.render(messages, add_generation_prompt=True, where=where)
        return list(tok.tokenizer.encode(text, add_special_tokens=False).ids)
    return tok.encode(prompt, document=False) if tok is not None else list(prompt.encode("utf-8"))


def run(args: argparse.Namespace) -> int:
    import json

    from partitioning.data.prompts import read_prompts, stop_ids
    from partitioning.data.tokenize import load_tokenizer
    from partitioning.decode.generate import decoder_of, generate

    sampling = _sampling(args)
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
    folder = _template_dir(cfg, path)
    template = _chat_template(cfg, folder) if args.chat else None
    texts = read_prompts(args.prompts) if args.prompts is not None else [args.prompt]
    wheres = [f"{args.prompts}: prompt {i + 1}" if args.prompts else "--prompt" for i in range(len(texts))]
    prompts = [_encode(p, tok, template, w) for p, w in zip(texts, wheres, strict=True)]
    vocab = getattr(model, "vocab_size", None)
    if tok is None and vocab is not None and vocab < 256:
        raise ConfigError(f"{cfg.where('model')}: a byte-level prompt needs vocab_size >= 256, got {vocab}")
    stops = stop_ids(folder if cfg.model_hf is not None else None, tok)
    longest = max(len(p) for p in prompts)
    # generate's own length against the model's positions (train.seq_len is the training length: not checked)
    flag = "--prompts" if args.prompts else "--prompt"
    length = check_generate_length(cfg, longest, args.max_tokens, flag)
    beyond = past_trained_positions(cfg, longest, args.max_tokens, flag)
    if beyond is not None:
        say(f"warning: {beyond}")
    params, source = _params(cfg, args, mesh, length)
    start = time.perf_counter()
    try:
        new = generate(
            model,
            params,
            prompts,
            mesh=mesh,
            rules=cfg.rules,
            max_tokens=args.max_tokens,
            stop_id=stops,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=args.seed,
            on_indivisible=cfg.on_indivisible,
        )
    except ConfigError as e:
        if e.arg != "max_positions":
            raise
        raise ConfigError(f"--max-tokens {args.max_tokens} + {longest} prompt tokens: {e}", arg=e.arg) from None
    took = time.perf_counter() - start

    def text(ids: list[int]) -> str:
        if tok is not None:
            return tok.decode(ids)
        return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")

    count = sum(len(n) for n in new)
    say(
        f"generate: {count} tokens{f' for {len(prompts)} prompts' if len(prompts) > 1 else ''} from {source}, "
        f"{sampling.describe()} with a KV cache on mesh {dict(mesh.shape)} ({took:.1f} s)"
    )
    if args.prompts is not None:
        for p, n in zip(texts, new, strict=True):
            field = "messages" if isinstance(p, list) else "prompt"
            print(json.dumps({field: p, "completion": text(n), "tokens": len(n)}, ensure_ascii=False))
    else:
        print(text(new[0]) if template is not None else text(prompts[0] + new[0]))
    return 0
