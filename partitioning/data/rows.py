"""One chat or prompt / completion row -> its tokens and loss mask; rows go in groups the tokenizer runs at once.

- ``chat``: the messages rendered with the chat template (:class:`~partitioning.data.chat.ChatTemplate`),
  every message checked to appear in the rendering (:func:`~partitioning.data.masks.check_rendered`), the
  rendering tokenized as ``apply_chat_template(tokenize=True)`` does (no special tokens added: the template
  writes them) and the assistant's tokens masked in (:mod:`partitioning.data.masks`);
- ``prompt_completion``: the prompt's tokens (with the tokenizer's BOS), then the completion's and EOS; prompt
  and completion are tokenized apart, so their boundary is a token boundary; the mask is the completion's.

A group's texts are tokenized with one ``encode_batch`` call (in parallel) and each example handed to a writer
(:mod:`partitioning.data.examples`). Every problem of a row is a :class:`~partitioning.errors.DataError`
naming ``file:line``.

Example::

    >>> from partitioning.data.rows import prompt_completion_example
    >>> tok = pt.data.load_tokenizer("tests/fixtures/hf/llama")
    >>> tokens, mask = prompt_completion_example({"prompt": "2+2=", "completion": " 4"}, "demo:1", tok)
    >>> tok.decode(tokens[mask == 1])           # the completion and its EOS (not shown: a special token)
    ' 4'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from partitioning.data.examples import MemoryWriter
from partitioning.data.masks import assistant_spans, check_rendered, token_mask
from partitioning.errors import DataError


def _messages(row: dict[str, Any], where: str, arg: str) -> list[dict[str, Any]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "no messages key" if "messages" not in row else f"messages is {type(messages).__name__}"
        if isinstance(messages, list):
            got = "messages is empty"
        raise DataError(
            f'{where}: a chat row needs "messages": a non-empty list of {{"role", "content"}} ({got})', arg=arg
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            what = (
                type(m).__name__
                if not isinstance(m, dict)
                else "no role"
                if not isinstance(m.get("role"), str)
                else "no string content"
            )
            raise DataError(f'{where}: message {i} needs a string "role" and "content" ({what})', arg=arg)
    return messages


def _text(row: dict[str, Any], key: str, where: str, arg: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        got = f"no {key} key" if key not in row else f"{key} is {type(value).__name__}"
        raise DataError(f'{where}: a prompt_completion row needs string "prompt" and "completion" ({got})', arg=arg)
    return value


def _encode(tok: Any, texts: list[str]) -> list[Any]:
    """``tokenizers.Encoding`` s of ``texts`` (no special tokens added: a template writes its own), in parallel."""
    return list(tok.tokenizer.encode_batch(texts, add_special_tokens=False)) if texts else []


def chat_group(
    group: list[tuple[str, dict[str, Any]]], tok: Any, template: Any, train_on_prompt: bool, arg: str, writer: Any
) -> int:
    """Renders and tokenizes a group of chat rows into ``writer``; returns the assistant turns skipped."""
    rendered = []
    for where, row in group:
        messages = _messages(row, where, arg)
        full = template.render(messages, where=where)
        check_rendered(messages, full, where, template.source, arg)
        rendered.append((messages, full))
    skipped = 0
    for (messages, full), enc in zip(rendered, _encode(tok, [full for _, full in rendered]), strict=True):
        ids = np.asarray(enc.ids, np.int64)
        if train_on_prompt:
            writer.add(ids, np.ones(len(ids), np.uint8))
            continue
        spans, s = assistant_spans(template, messages, full)
        skipped += s
        writer.add(ids, token_mask(enc, spans))
    return skipped


def completion_group(
    group: list[tuple[str, dict[str, Any]]], tok: Any, train_on_prompt: bool, arg: str, writer: Any
) -> None:
    """BOS + prompt, completion + EOS (the mask's part) of each prompt / completion row, into ``writer``."""
    pairs = [(_text(row, "prompt", where, arg), _text(row, "completion", where, arg)) for where, row in group]
    heads = _encode(tok, [p for p, _ in pairs])
    tails = _encode(tok, [c for _, c in pairs])
    bos = [tok.bos_id] if tok.bos_id is not None else []
    stop = [tok.stop_id] if tok.stop_id is not None else []
    for head, tail in zip(heads, tails, strict=True):
        a, b = bos + list(head.ids), list(tail.ids) + stop
        mask = np.concatenate([np.full(len(a), int(train_on_prompt), np.uint8), np.ones(len(b), np.uint8)])
        writer.add(np.asarray(a + b, np.int64), mask)


def chat_example(
    row: dict[str, Any], where: str, tok: Any, template: Any, train_on_prompt: bool = False, arg: str = "path"
) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens, mask, assistant turns skipped) of one chat row."""
    writer = MemoryWriter(np.int32)
    skipped = chat_group([(where, row)], tok, template, train_on_prompt, arg, writer)
    tokens, mask = writer.finish(where, skipped).example(0)
    return tokens, mask, skipped


def prompt_completion_example(
    row: dict[str, Any], where: str, tok: Any, train_on_prompt: bool = False, arg: str = "path"
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, mask) of one prompt / completion row: BOS + prompt, completion + EOS (the mask's part)."""
    writer = MemoryWriter(np.int32)
    completion_group([(where, row)], tok, train_on_prompt, arg, writer)
    return writer.finish(where, 0).example(0)


__all__ = ["chat_example", "prompt_completion_example", "chat_group", "completion_group"]
