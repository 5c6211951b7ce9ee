"""Files that are not run configs: a JSON or YAML mapping none of whose keys is a run config's section
(a model's ``config.json``, a ``tokenizer.json``, ...) is refused in one line saying what it looks like,
instead of one "unknown key" line per key.

Example::

    >>> from partitioning.config.foreign import not_a_run_config
    >>> not_a_run_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "ckpt/config.json")
    'ckpt/config.json: not a run config: it looks like a Hugging Face model config; expected a YAML mapping \
with sections model, mesh, rules; to train that checkpoint, a run config names its folder: model: {hf: ckpt}'
    >>> not_a_run_config({"model": {"name": "gpt"}, "mesh": {}}, "run.yaml") is None   # a run config, maybe wrong
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from partitioning.config.schema import REQUIRED, TOP_KEYS
from partitioning.errors import did_you_mean

MODEL_KEYS = ("name", "_target_", "hf")

# (keys any of which marks the kind, what it is): the files that sit beside a checkpoint or a tokenizer.
KINDS = (
    (("added_tokens", "pre_tokenizer", "normalizer", "post_processor"), "a tokenizer file (tokenizer.json)"),
    (("tokenizer_class", "chat_template", "model_max_length"), "a tokenizer config (tokenizer_config.json)"),
    (("weight_map",), "a safetensors index (model.safetensors.index.json)"),
    (("peft_type", "target_modules"), "a PEFT adapter config (adapter_config.json)"),
    (("architectures", "model_type"), "a Hugging Face model config"),
)


def _is_section(key: Any, value: Any) -> bool:
    # tokenizer.json has a 'model' key too: a run config's model names one (name, _target_ or hf)
    return key in TOP_KEYS and (key != "model" or (isinstance(value, Mapping) and any(k in value for k in MODEL_KEYS)))


def not_a_run_config(data: Mapping[Any, Any], shown: str) -> str | None:
    """One line when ``data`` (a file's top-level mapping) is some other kind of file, else None."""
    if not data or any(_is_section(k, v) for k, v in data.items()):
        return None
    kind = next((what for keys, what in KINDS if any(k in data for k in keys)), None)
    if kind is None and any(did_you_mean(str(k), TOP_KEYS) for k in data):
        return None  # misspelled sections: each is reported with its nearest name
    hint = ""
    if kind == "a Hugging Face model config":
        folder = os.path.dirname(shown) or "."
        hint = f"; to train that checkpoint, a run config names its folder: model: {{hf: {folder}}}"
    found = (
        f"it looks like {kind}" if kind else f"none of its keys ({', '.join(map(str, list(data)[:3]))}) is a section"
    )
    return f"{shown}: not a run config: {found}; expected a YAML mapping with sections {', '.join(REQUIRED)}{hint}"


__all__ = ["not_a_run_config"]
