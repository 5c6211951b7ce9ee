"""A model's learned-position limit (GPT-2's ``n_positions``), and the lengths checked against it.

Every command that traces the model at ``train.seq_len`` (``check``, ``train``,
``plan``, ``tune``, ``rules explain``, ...) refuses a longer sequence in one line
naming ``train.seq_len`` (file:line) and where the limit comes from;
``generate`` checks its own length (prompt + ``--max-tokens``) instead.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("model: {name: gpt, positions: learned, max_positions: 8}\\nmesh: {shape: {data: 1}}\\n"
    ...                     "rules: dp\\ntrain: {steps: 2, batch_size: 8, seq_len: 16}\\n")
    >>> from partitioning.config.positions import check_positions
    >>> try:
    ...     check_positions(pt.load_config(path))
    ... except pt.ConfigError as e:
    ...     print(str(e).replace(str(path), "run.yaml").replace(" (", "\\n("))
    run.yaml:4: train.seq_len: sequence length 16 is longer than the model's 8 learned positions
    (run.yaml:1: model.max_positions); lower train.seq_len to at most 8
"""

from __future__ import annotations

import json
from typing import Any

from partitioning.config.schema import Config
from partitioning.errors import ConfigError

# Where a Hugging Face config.json keeps the learned-position count (GPT-2, then the names its aliases use).
HF_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def position_limit(cfg: Config) -> tuple[int, str] | None:
    """(the model's learned positions, where that number is set); None for a model without a limit."""
    if cfg.model_hf is not None:
        from partitioning.config.hf import config_json, hf_model_from_config

        model: Any = hf_model_from_config(cfg)
        if getattr(model, "positions", None) != "learned" or model.max_positions is None:
            return None
        path = config_json(cfg.model_hf)
        data = json.loads(path.read_text())
        key = next((k for k in HF_KEYS if data.get(k) == model.max_positions), None)
        source = f"{key} in {path}" if key else f"the family's default, as {path} sets no {HF_KEYS[0]}"
        return int(model.max_positions), source
    options = cfg.model_options
    if options.get("positions") != "learned" or not isinstance(options.get("max_positions"), int):
        return None
    return options["max_positions"], cfg.where("model", "max_positions")


def check_positions(cfg: Config) -> Any:
    """``train.seq_len``, checked: it fits the model's learned positions, else one line naming both with
    their sources."""
    seq_len = cfg.train.seq_len
    found = position_limit(cfg) if isinstance(seq_len, int) else None
    if found is None or seq_len <= found[0]:
        return seq_len
    limit, source = found
    raise ConfigError(
        f"{cfg.where('train', 'seq_len')}: sequence length {seq_len} is longer than the model's {limit} "
        f"learned positions ({source}); lower train.seq_len to at most {limit}",
        arg="seq_len",
    )


def check_generate_length(cfg: Config, prompt_tokens: int, max_tokens: int, prompt_flag: str) -> int:
    """The length ``generate`` runs at (longest prompt + ``--max-tokens``), checked against the limit alone:
    ``train.seq_len`` does not matter to decoding."""
    total = prompt_tokens + max_tokens
    found = position_limit(cfg)
    if found is None or total <= found[0]:
        return total
    limit, source = found
    fix = (
        f"lower --max-tokens to at most {limit - prompt_tokens}"
        if prompt_tokens < limit
        else f"shorten {prompt_flag} to fewer than {limit} tokens"
    )
    raise ConfigError(
        f"--max-tokens {max_tokens} + {prompt_tokens} tokens of {prompt_flag}: sequence length {total} is longer "
        f"than the model's {limit} learned positions ({source}); {fix}",
        arg="max_tokens",
    )


def past_trained_positions(cfg: Config, prompt_tokens: int, max_tokens: int, prompt_flag: str) -> str | None:
    """A warning when ``generate`` runs a rotary-position (RoPE) checkpoint past its ``max_position_embeddings``:
    nothing stops the decoding, but the model never saw such positions; None when it stays within them."""
    if cfg.model_hf is None or position_limit(cfg) is not None:
        return None  # a learned limit is refused by check_generate_length
    from partitioning.config.hf import config_json

    path = config_json(cfg.model_hf)
    limit = json.loads(path.read_text()).get("max_position_embeddings")
    total = prompt_tokens + max_tokens
    if not isinstance(limit, int) or total <= limit:
        return None
    fix = (
        f"lower --max-tokens to at most {limit - prompt_tokens}"
        if prompt_tokens < limit
        else f"shorten {prompt_flag} to fewer than {limit} tokens"
    )
    return (
        f"--max-tokens {max_tokens} + {prompt_tokens} tokens of {prompt_flag}: sequence length {total} is past the "
        f"model's {limit} positions (max_position_embeddings in {path}): its rotary positions were never trained "
        f"that far and the text may degrade; {fix}"
    )


__all__ = ["position_limit", "check_positions", "check_generate_length", "past_trained_positions", "HF_KEYS"]
