"""Instruction data: JSONL chat conversations or prompt / completion pairs -> tokens and a loss mask.

Two row formats (one JSON object per line; blank lines are skipped):

- ``chat``: ``{"messages": [{"role": "system" | "user" | "assistant" | ..., "content": str}, ...]}``,
  rendered with the checkpoint's own chat template
  (:class:`~partitioning.data.chat.ChatTemplate`) and tokenized as ``apply_chat_template(tokenize=True)``
  does (the rendered text, no special tokens added: the template writes them);
- ``prompt_completion``: ``{"prompt": str, "completion": str}``: the prompt's tokens (with the tokenizer's
  BOS), then the completion's, then EOS. Prompt and completion are tokenized apart, so their boundary is
  a token boundary.

The loss mask marks the tokens the model learns to write: the completion and its EOS, or the assistant's
text (:mod:`partitioning.data.masks` says exactly which characters: a template's ``{% generation %}`` blocks,
else each assistant turn after its header up to its end-of-turn token). A message the template does not
render at all is refused (ShareGPT's ``human`` / ``gpt`` roles under Qwen's template, say).

Files are read as a stream (:mod:`partitioning.data.jsonl`) and tokenized in groups of rows (the tokenizer
runs a group in parallel); with a ``cache_dir`` the examples are written there as they come
(:mod:`partitioning.data.examples`) and memory-mapped by the next run, so memory holds a group of rows, not
the file. Progress shows once tokenizing takes more than a second (:mod:`partitioning.data.progress`).

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

from partitioning.data.corpus import Corpus
from partitioning.data.examples import Examples, ExampleWriter, MemoryWriter, cache_key, read_examples
from partitioning.data.jsonl import iter_rows, jsonl_files, read_rows
from partitioning.data.progress import Progress
from partitioning.data.rows import chat_example, chat_group, completion_group, prompt_completion_example
from partitioning.errors import DataError

FORMATS = ("text", "chat", "prompt_completion")
GROUP_ROWS = 256  # rows rendered, then tokenized together (in parallel) and written
# ... and at most about this many bytes of them: a tokenizer's encodings take ~100 bytes a token (offsets, token
# strings), so a group's memory is bounded by its text, not by the file.
GROUP_BYTES = 256 << 10


def _source(files: Sequence[Path]) -> str:
    return str(files[0]) if len(files) == 1 else f"{len(files)} files under {files[0].parent}"


def _cache_parts(fmt: str, tok: Any, template: Any, train_on_prompt: bool) -> list[Any]:
    """What decides the examples besides the files' bytes (the cache key; see partitioning.data.examples)."""
    chat = None if template is None or fmt != "chat" else [template.template, sorted(template.special_tokens.items())]
    return [fmt, bool(train_on_prompt), tok.digest, chat]


def load_examples(
    files: Sequence[Path],
    fmt: str,
    tok: Any,
    template: Any = None,
    *,
    train_on_prompt: bool = False,
    arg: str = "path",
    cache_dir: str | Path | None = None,
    progress: bool | str = False,
) -> Examples:
    """Every row of ``files`` (JSONL) tokenized, with its loss mask; see the module docstring.

    ``cache_dir``: read the examples from there, or write them there (None: in memory, nothing written).
    ``progress``: as :class:`~partitioning.data.progress.Progress` takes it (False: quiet).
    """
    if fmt not in ("chat", "prompt_completion"):
        raise DataError(f"format must be chat or prompt_completion here, got {fmt!r}", arg="format")
    files = [Path(f) for f in files]
    source = _source(files)
    total = sum(f.stat().st_size for f in files if f.is_file())
    bar = Progress(total, f"{source} ({total / 1e6:,.1f} MB)", progress)
    folder = None
    if cache_dir is not None:
        key = cache_key(files, _cache_parts(fmt, tok, template, train_on_prompt), arg)
        folder = Path(cache_dir).expanduser() / f"examples-{key}"
        found = read_examples(folder, source)
        if found is not None:
            bar.close()
            return found
    writer: Any = ExampleWriter(folder, tok.dtype) if folder is not None else MemoryWriter(tok.dtype)
    skipped = 0
    group: list[tuple[str, dict[str, Any]]] = []
    read = [0]  # bytes of the rows in the group

    def on_bytes(n: int) -> None:
        read[0] += n
        bar.update(n)

    def flush() -> int:
        if fmt == "chat":
            return chat_group(group, tok, template, train_on_prompt, arg, writer)
        completion_group(group, tok, train_on_prompt, arg, writer)
        return 0

    try:
        for where, row in iter_rows(files, arg, on_bytes=on_bytes):
            group.append((where, row))
            if len(group) >= GROUP_ROWS or read[0] >= GROUP_BYTES:
                skipped += flush()
                bar.update(0, rows=len(group))
                group, read[0] = [], 0
        skipped += flush()
        examples = writer.finish(source, skipped)
    except BaseException:
        writer.abort()
        bar.close()
        raise
    cached = f", cached as {folder}" if folder is not None else ""
    bar.close(f"data: {len(examples):,} examples, {len(examples.tokens):,} tokens in {bar.seconds:.1f} s{cached}")
    return examples


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
    truncation: str = "right"

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
            truncation=self.truncation,
        )

    def loss_tokens(self, split: str, seq_len: int, truncation: str | None = None) -> Any:
        """The answer tokens of ``split`` before and after truncation at ``seq_len``, this corpus's way or
        ``truncation``'s (:func:`~partitioning.data.truncation.loss_tokens`)."""
        from partitioning.data.truncation import loss_tokens

        return loss_tokens(self.tokens(split), seq_len, truncation or self.truncation)

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
    truncation: str = "right",
    cache_dir: str | None = None,
    progress: bool | str = False,
) -> InstructionCorpus:
    """Instruction data from JSONL: ``fmt`` is ``chat`` or ``prompt_completion``; see the module docstring.

    ``tokenizer`` is a tokenizer.json (or its folder); a chat template comes from ``chat_template`` or that
    folder. Without ``eval_path`` the last ``eval_fraction`` of the rows (at least one) are eval. The examples
    are tokenized once and cached in ``cache_dir`` (default :func:`~partitioning.data.tokenize.default_cache_dir`,
    :mod:`partitioning.data.examples`); every process of a run reads the same cache. ``truncation``
    (``right``, ``left`` or ``drop``) says what happens to an example longer than a row
    (:mod:`partitioning.data.truncation`). ``progress`` as :class:`~partitioning.data.progress.Progress`.

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
        >>> data.loss_tokens("train", 32).kept        # the answers' tokens and their </s>: what the loss counts
        18
    """
    from partitioning.data.tokenize import default_cache_dir

    cache = str(Path(cache_dir).expanduser().absolute() if cache_dir is not None else default_cache_dir())
    return _load_instructions(
        path,
        fmt,
        tokenizer,
        chat_template,
        eval_path,
        eval_fraction,
        train_on_prompt,
        packing,
        truncation,
        cache,
        progress,
        _stamp(path, eval_path),
    )


def _stamp(*paths: str | None) -> tuple:
    """What names the files behind ``paths`` (absolute path, size, time): the in-process cache's key, so the same
    relative path in another folder (or a file rewritten) is read again."""
    out = []
    for p in paths:
        if p is None:
            continue
        root = Path(p).expanduser()
        files = sorted(root.rglob("*.jsonl")) if root.is_dir() else [root]
        for f in files:
            st = f.stat() if f.exists() else None
            out.append((str(f.absolute()), st.st_size if st else -1, st.st_mtime_ns if st else -1))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _load_instructions(
    path: str,
    fmt: str,
    tokenizer: str,
    chat_template: str | None,
    eval_path: str | None,
    eval_fraction: float,
    train_on_prompt: bool,
    packing: bool,
    truncation: str,
    cache_dir: str,
    progress: bool | str,
    stamp: tuple,
) -> InstructionCorpus:
    from partitioning.data.tokenize import load_tokenizer
    from partitioning.data.truncation import MODES

    if not 0 < eval_fraction < 1:
        raise DataError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}", arg="eval_fraction")
    if truncation not in MODES:
        raise DataError(f"truncation must be one of {', '.join(MODES)}, got {truncation!r}", arg="truncation")
    tok = load_tokenizer(tokenizer)
    template = template_for(Path(tok.path).parent, chat_template) if fmt == "chat" else None
    import jax

    # Every process tokenizes (the cache is shared, written whole by whichever finishes first); one says so.
    progress = progress if jax.process_index() == 0 else False
    kw: dict[str, Any] = {"train_on_prompt": train_on_prompt, "cache_dir": Path(cache_dir), "progress": progress}
    files = jsonl_files(path, "path")
    train = load_examples(files, fmt, tok, template, arg="path", **kw)
    if eval_path is not None:
        efiles = jsonl_files(eval_path, "eval_path")
        ev = load_examples(efiles, fmt, tok, template, arg="eval_path", **kw)
        eval_source: str | None = str(Path(eval_path).expanduser())
    else:
        n = len(train)
        if n < 2:
            raise DataError(
                f"{path}: {n} row, too few to split into train and eval; add rows or set eval_path", arg="path"
            )
        train, ev = train.split_at(n - max(1, int(n * eval_fraction)))
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
        truncation=truncation,
    )


load_instructions.cache_clear = _load_instructions.cache_clear  # type: ignore[attr-defined]


__all__ = [
    "FORMATS",
    "Examples",
    "jsonl_files",
    "read_rows",
    "chat_example",
    "prompt_completion_example",
    "load_examples",
    "template_for",
    "InstructionCorpus",
    "load_instructions",
]
