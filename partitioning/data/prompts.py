"""What ``generate`` reads besides the weights: a file of prompts, and the tokens that end a reply.

A prompts file is read by what it holds, whatever its name: JSON Lines when its first non-blank line is a
JSON object (one object a line: ``{"prompt": TEXT}`` or ``{"messages": [{"role": ..., "content": ...},
...]}``), a JSON array of such objects, else text with one prompt a line (blank lines skipped). Lines end
at ``\n`` only (:mod:`partitioning.data.jsonl`), so a prompt may hold U+2028 and its kin. The stop tokens
are the tokenizer's EOS and every ``eos_token_id`` of the checkpoint's ``generation_config.json`` (chat
models list their end-of-turn token there, e.g. Llama 3's ``<|eot_id|>``).

Example::

    >>> import tempfile, pathlib
    >>> from partitioning.data.prompts import read_prompts, stop_ids
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = f.write_text('{"prompt": "def f("}\\n{"messages": [{"role": "user", "content": "hi"}]}\\n')
    >>> read_prompts(f)
    ['def f(', [{'role': 'user', 'content': 'hi'}]]
    >>> stop_ids("tests/fixtures/hf/llama", pt.data.load_tokenizer("tests/fixtures/hf/llama"))
    [2]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from partitioning.errors import DataError

GENERATION_CONFIG = "generation_config.json"


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    ok = isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value)
    if not ok:
        raise DataError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    return list(value)


def _prompt(row: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        return row["prompt"]
    if isinstance(row, dict) and "messages" in row:
        return _messages(row["messages"], where)
    raise DataError(f"{where}: expected an object with `prompt` (text) or `messages` (a chat)")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def read_prompts(path: str | os.PathLike) -> list[str | list[dict[str, Any]]]:
    """The prompts of ``path``: strings, or chat messages (lists of dicts) from JSON ``messages`` rows."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the prompts ({e.__class__.__name__}: {e})") from None
    rows = [(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    whole = _json(text) if text.lstrip().startswith("[") else None
    prompts: list[str | list[dict[str, Any]]]
    if isinstance(whole, list) and whole and all(isinstance(r, dict) for r in whole):
        prompts = [_prompt(r, f"{path}: row {i}") for i, r in enumerate(whole)]
    elif rows and rows[0][1].lstrip().startswith("{") and isinstance(_json(rows[0][1]), dict):
        prompts = []
        for n, line in rows:
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataError(f"{path}:{n}: not JSON ({' '.join(str(e).split())})") from None
            prompts.append(_prompt(row, f"{path}:{n}"))
    else:
        prompts = [line for _, line in rows]
    if not prompts:
        raise DataError(f"{path}: no prompts (one a line; JSONL rows with `prompt` or `messages`)")
    return prompts


def stop_ids(folder: str | os.PathLike | None, tokenizer: Any) -> list[int]:
    """The tokenizer's stop token and the ``eos_token_id`` (one or a list) of ``folder``'s generation_config.json."""
    ids = [tokenizer.stop_id] if tokenizer is not None and tokenizer.stop_id is not None else []
    path = Path(folder) / GENERATION_CONFIG if folder is not None else None
    if path is not None and path.is_file():
        try:
            eos = json.loads(path.read_text()).get("eos_token_id")
        except (ValueError, AttributeError):
            raise DataError(f"{path}: not a JSON object") from None
        extra = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if not all(isinstance(i, int) for i in extra):
            raise DataError(f"{path}: eos_token_id must be an id or a list of ids, got {eos!r}")
        ids += [i for i in extra if i not in ids]
    return ids


__all__ = ["read_prompts", "stop_ids", "GENERATION_CONFIG"]
