"""Instruction data: JSONL chat conversations or prompt / completion pairs -> tokens and a loss mask.

Two row formats (one JSON object per line; blank lines are skipped):

- ``chat``: ``{"messages": [{"role": "system" | "user" | "assistant" | ..., "content": str}, ...]}``,
  rendered with the checkpoint's own chat template
  (:class:`~partitioning.data.chat.ChatTemplate`) and tokenized as ``apply_chat_template(tokenize=True)``
  does (the rendered text, no special tokens added: the template writes them);
- ``prompt_completion``: ``{"prompt": str, "completion": str}``: the prompt's tokens (with the tokenizer's
  BOS), then the completion's, then EOS. Prompt and completion are tokenized apart, so their boundary is
  a token boundary.

The loss mask marks the tokens the model learns to write: the completion and its EOS, or each assistant
turn. An assistant turn's characters are found by rendering prefixes of the conversation: turn ``i``
spans from the end of ``render(messages[:i], add_generation_prompt=True)`` (the assistant header) to the
end of ``render(messages[:i+1])`` (its content and end-of-turn marker), both prefixes of the whole
rendering; a token is masked in when its character offsets (the tokenizer's) overlap such a span, as
transformers' ``return_assistant_tokens_mask`` does. Limits: a template that renders earlier turns
differently once later turns follow (Qwen3 drops the reasoning of earlier turns) fails the prefix test for
those turns; they are not trained on, and are counted in :attr:`Examples.skipped_turns`.

Every problem of a row is a :class:`~partitioning.errors.DataError` naming ``file:line``.

Example::

    >>> import json, pathlib, tempfile
    >>> from partitioning.data.instruct import load_examples
    >>> from partitioning.data.chat import ChatTemplate
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "chat.jsonl"
    >>> _ = f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
    ...                                           {"role": "assistant", "content": "yo"}]}) + "\\n")
    >>> tok = pt.data.load_tokenizer("tests/fixtures/hf/llama")
    >>> template = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
    ...                         "{% if add_generation_prompt %}assistant: {% endif %}", eos_token="</s>")
    >>> ex = load_examples([f], "chat", tok, template)
    >>> tokens, mask = ex.example(0)
    >>> tok.decode(tokens[mask == 1]), len(ex)          # the assistant's words and its end-of-turn token
    ('yo', 1)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioning.data.corpus import Corpus
from partitioning.data.jsonl import jsonl_files, read_rows
from partitioning.errors import DataError

FORMATS = ("text", "chat", "prompt_completion")


@dataclasses.dataclass(frozen=True)
class Examples:
    """Tokenized examples held flat: example ``i`` is ``tokens[offsets[i]:offsets[i+1]]`` and its ``mask``."""

    tokens: np.ndarray  # int32
    mask: np.ndarray  # uint8: 1 where the token is one the model learns to write
    offsets: np.ndarray  # int64, (n + 1,)
    source: str
    skipped_turns: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi], self.mask[lo:hi]

    def subset(self, indices: Sequence[int], source: str | None = None) -> Examples:
        """The examples ``indices`` (in that order) as a new :class:`Examples`."""
        parts = [self.example(int(i)) for i in indices]
        offsets = np.cumsum([0] + [len(t) for t, _ in parts], dtype=np.int64)
        tokens = np.concatenate([t for t, _ in parts]) if parts else np.zeros(0, np.int32)
        mask = np.concatenate([m for _, m in parts]) if parts else np.zeros(0, np.uint8)
        return Examples(tokens, mask, offsets, source or self.source, self.skipped_turns)


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


def _encode(tok: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tok.tokenizer.encode(text, add_special_tokens=False)
    return list(enc.ids), list(enc.offsets)


def assistant_spans(template: Any, messages: list[dict[str, Any]], full: str) -> tuple[list[tuple[int, int]], int]:
    """Character spans of the assistant turns in ``full`` (the rendering of ``messages``), and turns skipped."""
    spans, skipped = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            head = template.render(messages[:i], add_generation_prompt=True) if i else ""
            turn = template.render(messages[: i + 1])
        except DataError:  # the template refuses a prefix (e.g. one that must end with a user turn)
            skipped += 1
            continue
        if full.startswith(head) and full.startswith(turn) and len(turn) > len(head):
            spans.append((len(head), len(turn)))
        else:
            skipped += 1
    return spans, skipped


def _span_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    if not offsets:
        return np.zeros(0, np.uint8)
    where = np.asarray(offsets, np.int64)
    mask = np.zeros(len(where), bool)
    for s, e in spans:  # a token counts when its characters overlap a span
        mask |= (where[:, 1] > s) & (where[:, 0] < e)
    return mask.astype(np.uint8)


def chat_example(
    row: dict[str, Any], where: str, tok: Any, template: Any, train_on_prompt: bool = False, arg: str = "path"
) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens, mask, assistant turns skipped) of one chat row."""
    messages = _messages(row, where, arg)
    full = template.render(messages, where=where)
    ids, offsets = _encode(tok, full)
    if train_on_prompt:
        return np.asarray(ids, np.int32), np.ones(len(ids), np.uint8), 0
    spans, skipped = assistant_spans(template, messages, full)
    return np.asarray(ids, np.int32), _span_mask(offsets, spans), skipped


def prompt_completion_example(
    row: dict[str, Any], where: str, tok: Any, train_on_prompt: bool = False, arg: str = "path"
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, mask) of one prompt / completion row: BOS + prompt, completion + EOS (the mask's part)."""
    prompt, completion = _text(row, "prompt", where, arg), _text(row, "completion", where, arg)
    head = tok.encode(prompt, document=False)
    tail = _encode(tok, completion)[0] + ([tok.stop_id] if tok.stop_id is not None else [])
    mask = np.concatenate([np.full(len(head), int(train_on_prompt), np.uint8), np.ones(len(tail), np.uint8)])
    return np.asarray(head + tail, np.int32), mask


def load_examples(
    files: Sequence[Path], fmt: str, tok: Any, template: Any = None, *, train_on_prompt: bool = False, arg: str = "path"
) -> Examples:
    """Every row of ``files`` (JSONL) tokenized, with its loss mask; see the module docstring."""
    if fmt not in ("chat", "prompt_completion"):
        raise DataError(f"format must be chat or prompt_completion here, got {fmt!r}", arg="format")
    tokens, masks, skipped = [], [], 0
    for where, row in read_rows(files, arg):
        if fmt == "chat":
            ids, mask, s = chat_example(row, where, tok, template, train_on_prompt, arg)
            skipped += s
        else:
            ids, mask = prompt_completion_example(row, where, tok, train_on_prompt, arg)
        tokens.append(ids)
        masks.append(mask)
    offsets = np.cumsum([0] + [len(t) for t in tokens], dtype=np.int64)
    source = str(files[0]) if len(files) == 1 else f"{len(files)} files under {files[0].parent}"
    return Examples(np.concatenate(tokens), np.concatenate(masks), offsets, source, skipped)


def template_for(tokenizer_dir: Path, chat_template: str | None = None) -> Any:
    """The chat template to render with: ``chat_template`` (a folder, its tokenizer_config.json, or a .jinja
    file whose special tokens come from ``tokenizer_dir``), else the tokenizer's own folder's."""
    from partitioning.data.chat import ChatTemplate, special_tokens

    if chat_template is None:
        return ChatTemplate.from_dir(tokenizer_dir)
    p = Path(chat_template).expanduser()
    if p.is_dir():
        return ChatTemplate.from_dir(p)
    if p.name == "tokenizer_config.json" and p.is_file():
        return ChatTemplate.from_dir(p.parent)
    if p.is_file():
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{p}: cannot read the chat template ({e})", arg="chat_template") from None
        return ChatTemplate(text, source=str(p), **special_tokens(tokenizer_dir))
    raise DataError(f"{chat_template!r}: no such chat template (a folder or a .jinja file)", arg="chat_template")


@dataclasses.dataclass(frozen=True)
class InstructionCorpus(Corpus):
    """Chat or prompt / completion examples (:class:`Examples` per split), batched as packed rows.

    ``batches(split, batch_size, seq_len, sharding, seed=)`` returns
    :class:`~partitioning.data.packing.PackedBatches`.
    """

    fmt: str = "chat"
    packing: bool = True
    template: Any = None

    def batches(self, split: str, batch_size: int, seq_len: int, sharding: Any = None, *, seed: int = 0) -> Any:
        from partitioning.data.packing import PackedBatches

        where = self.eval_source if split == "eval" and self.eval_source else self.source
        return PackedBatches(
            self.tokens(split),
            batch_size,
            seq_len,
            sharding,
            seed=seed,
            name=f"{where} ({split})",
            split=split,
            packing=self.packing,
        )

    def describe(self) -> str:
        tokens = len(self.train.tokens) + len(self.eval.tokens)
        out = f"{self.source}: {len(self.train):,} train / {len(self.eval):,} eval {self.fmt} examples"
        out += f" ({tokens:,} tokens, tokenizer {self.tokenizer.path}"
        if self.template is not None:
            out += f", chat template {self.template.source}"
        skipped = self.train.skipped_turns + self.eval.skipped_turns
        if skipped:
            out += f"; {skipped:,} assistant turns the template renders differently once later turns follow "
            out += "are not trained on"
        return out + ")"


@functools.lru_cache(maxsize=4)
def load_instructions(
    path: str,
    fmt: str,
    tokenizer: str,
    *,
    chat_template: str | None = None,
    eval_path: str | None = None,
    eval_fraction: float = 0.05,
    train_on_prompt: bool = False,
    packing: bool = True,
) -> InstructionCorpus:
    """Instruction data from JSONL: ``fmt`` is ``chat`` or ``prompt_completion``; see the module docstring.

    ``tokenizer`` is a tokenizer.json (or its folder); a chat template comes from ``chat_template`` or that
    folder. Without ``eval_path`` the last ``eval_fraction`` of the rows (at least one) are eval. Everything is
    tokenized in memory when loaded (nothing is written), on every process.

    Example::

        >>> import json, pathlib, tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "chat.jsonl"
        >>> rows = [{"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": str(i)}]}
        ...         for i in range(10)]
        >>> _ = f.write_text("".join(json.dumps(r) + "\\n" for r in rows))
        >>> data = pt.data.load_instructions(str(f), "chat", "tests/fixtures/hf/llama",
        ...                             chat_template="tests/fixtures/chat/mistral")   # Mistral-Instruct's template
        >>> len(data.train), len(data.eval)
        (9, 1)
        >>> batch = data.batches("train", 2, 32, seed=0).batch_at(0)
        >>> sorted(batch), batch["segment_ids"].shape
        (['inputs', 'loss_mask', 'positions', 'segment_ids', 'targets'], (2, 32))
    """
    from partitioning.data.tokenize import load_tokenizer

    if not 0 < eval_fraction < 1:
        raise DataError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}", arg="eval_fraction")
    tok = load_tokenizer(tokenizer)
    template = template_for(Path(tok.path).parent, chat_template) if fmt == "chat" else None
    files = jsonl_files(path, "path")
    train = load_examples(files, fmt, tok, template, train_on_prompt=train_on_prompt, arg="path")
    if eval_path is not None:
        efiles = jsonl_files(eval_path, "eval_path")
        ev = load_examples(efiles, fmt, tok, template, train_on_prompt=train_on_prompt, arg="eval_path")
        eval_source: str | None = str(Path(eval_path).expanduser())
    else:
        n = len(train)
        if n < 2:
            raise DataError(
                f"{path}: {n} row, too few to split into train and eval; add rows or set eval_path", arg="path"
            )
        cut = n - max(1, int(n * eval_fraction))
        train, ev = train.subset(range(cut)), train.subset(range(cut, n))
        eval_source = None
    names = tuple(str(f) for f in files)
    return InstructionCorpus(
        train,
        ev,
        str(Path(path).expanduser()),
        names,
        names if eval_path is None else tuple(str(f) for f in jsonl_files(eval_path, "eval_path")),
        fmt,
        tok.vocab_size,
        eval_source,
        tok,
        fmt=fmt,
        packing=packing,
        template=template,
    )


__all__ = [
    "FORMATS",
    "Examples",
    "jsonl_files",
    "read_rows",
    "assistant_spans",
    "chat_example",
    "prompt_completion_example",
    "load_examples",
    "template_for",
    "InstructionCorpus",
    "load_instructions",
]
