"""A Hugging Face checkpoint checked from its headers, before any weight is read.

:func:`check_config_keys`: the ``config.json`` keys that shape the model have the right types (a
``"vocab_size": "320"`` is refused, never read as 320 or ignored), and a key close to one of them that
the file lacks is a typo (``num_key_valu_heads``: did you mean ``num_key_value_heads``?), not a key to
skip silently (the model would get the default and fail later on a tensor's shape).

:func:`check_hf_files`: everything :func:`~partitioning.hf.load_hf` checks before it reads the weights --
each safetensors header (a truncated file, a damaged header), every tensor there with the shape
``config.json`` implies, none extra -- so ``partitioning check`` refuses exactly what ``train`` would,
without reading a byte of the weights.

Example::

    >>> from partitioning.hf.check import check_config_keys
    >>> check_config_keys("config.json", {"num_key_valu_heads": 2, "hidden_size": 32})
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: config.json: unknown key 'num_key_valu_heads' (did you mean \
'num_key_value_heads'?)
    >>> check_config_keys("config.json", {"vocab_size": "320"})
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: config.json: vocab_size must be an integer, got '320' (a string)
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from partitioning.errors import CheckpointError

INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "max_window_layers",
    "sliding_window",
    "n_embd",
    "n_head",
    "n_inner",
    "n_layer",
    "n_positions",
)
FLOATS = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta", "partial_rotary_factor", "query_pre_attn_scalar")
BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window", "scale_attn_weights")
# The keys the supported families read to shape a model (partitioning.models.hf.families).
MODEL_KEYS = (*INTS, *FLOATS, *BOOLS, "architectures", "hidden_act", "hidden_activation", "rope_parameters")


def _type_name(v: Any) -> str:
    return {str: "a string", bool: "a boolean", float: "a number", list: "a list", dict: "a mapping"}.get(
        type(v), type(v).__name__
    )


def check_config_keys(where: str | os.PathLike, cfg: dict[str, Any]) -> None:
    """Raises one CheckpointError (at ``where``, the config.json) for a model key's wrong type or a typo'd key."""
    for key in INTS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise CheckpointError(f"{where}: {key} must be an integer, got {v!r} ({_type_name(v)})")
    for key in FLOATS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise CheckpointError(f"{where}: {key} must be a number, got {v!r} ({_type_name(v)})")
    for key in BOOLS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, bool):
            raise CheckpointError(f"{where}: {key} must be true or false, got {v!r} ({_type_name(v)})")
    missing = [k for k in MODEL_KEYS if k not in cfg]
    for key in cfg:
        if key in MODEL_KEYS:
            continue
        close = difflib.get_close_matches(key, missing, n=1, cutoff=0.9)
        if close:
            raise CheckpointError(f"{where}: unknown key {key!r} (did you mean {close[0]!r}?)")


def check_hf_path(path: str | os.PathLike) -> None:
    """A file other than ``config.json`` where a checkpoint folder belongs: one line saying to pass the folder."""
    p = Path(path)
    if p.is_file() and p.name != "config.json":
        raise CheckpointError(
            f"{p}: a file, not a Hugging Face checkpoint: pass its folder ({p.parent}, with config.json and "
            f"*.safetensors) or its config.json"
        )


def arch_hint(cfg: dict[str, Any], supported: Any) -> str:
    """`` (did you mean 'LlamaForCausalLM'?)`` for an architecture a case or a letter away from a supported one."""
    archs = cfg.get("architectures") or []
    if not archs or not isinstance(archs[0], str):
        return ""
    by_lower = {a.lower(): a for a in supported}
    close = difflib.get_close_matches(archs[0].lower(), list(by_lower), n=1, cutoff=0.85)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


__all__ = ["check_config_keys", "check_hf_path", "arch_hint", "MODEL_KEYS"]
