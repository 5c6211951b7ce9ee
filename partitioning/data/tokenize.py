"""Text -> tokens with a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library), cached on disk.

A :class:`TextTokenizer` is a ``tokenizer.json`` plus the special-token rules
of the ``tokenizer_config.json`` beside it, applied per document (a file):

- ``add_bos_token`` / ``add_eos_token`` say whether ``bos_token`` starts and
  ``eos_token`` ends each document (Llama, Gemma, Mistral: BOS);
- without them, whatever the tokenizer's own post-processor adds (Llama 3's
  template adds ``<|begin_of_text|>``);
- a tokenizer that adds neither but has an ``eos_token`` (GPT-2, Qwen2) ends
  each document with it: EOS between documents.

:func:`tokenize_files` tokenizes a list of files once and keeps the tokens as
a ``.npy`` file named by a digest of the tokenizer and the files' contents, so
restarts (and every process of a multi-host run) memory-map the cached array
instead of tokenizing again. Files over 1 MiB are cut at line ends into
pieces tokenized in parallel.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.data.tokenize import tokenize_files
    >>> tok = pt.data.load_tokenizer("tests/fixtures/hf/llama/tokenizer.json")   # or the checkpoint folder
    >>> tok.encode("def f(x):")         # [bos, ...] as the tokenizer config says
    [1, 279, 72, 287, 10, 90, 11, 28]
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> files = [folder / "a.py", folder / "b.py"]
    >>> _ = files[0].write_text("def f(x):")
    >>> _ = files[1].write_text("x = 1")
    >>> tokens = tokenize_files(files, tok, folder / "cache")             # memory-mapped uint16 / uint32
    >>> tokens.dtype, tokens.tolist()    # one BOS per document
    (dtype('uint16'), [1, 279, 72, 287, 10, 90, 11, 28, 1, 90, 286, 223, 19])
    >>> tokens.tolist() == tok.encode("def f(x):") + tok.encode("x = 1")
    True
    >>> [f.suffix for f in (folder / "cache").iterdir()]     # the next run reads it back
    ['.npy']
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from partitioning.data.progress import Progress
from partitioning.errors import DataError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CACHE_FORMAT = "partitioning-tokens-1"  # bump when the layout of cached token arrays changes
PIECE_BYTES = 1 << 20  # files larger than this are tokenized in pieces (cut at line ends)
GROUP_BYTES = 8 << 20  # text handed to the tokenizer at once (bounds its memory, paces the progress)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}`` (AddedToken)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True)
class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with the per-document BOS / EOS of its ``tokenizer_config.json``.

    ``bos_id`` starts every document (and prompt) when not None; ``eos_id``
    ends every document when not None; ``stop_id`` is the end-of-sequence
    token generation stops at.

    Example::

        >>> tok = pt.data.load_tokenizer("tests/fixtures/hf/llama")
        >>> tok.bos_id, tok.eos_id, tok.stop_id, tok.vocab_size, tok.dtype
        (1, None, 2, 320, dtype('uint16'))
        >>> tok.decode(tok.encode("def f(x):", document=False))
        'def f(x):'
        >>> pt.data.load_tokenizer("tests/fixtures/hf/gpt2").describe()     # GPT-2: EOS between documents
        'tests/fixtures/hf/gpt2/tokenizer.json (320 tokens; per document: eos 0)'
    """

    path: Path
    tokenizer: Any
    bos_id: int | None
    eos_id: int | None
    stop_id: int | None
    digest: str

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer can produce (added tokens included): the model needs at least this many."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def encode(self, text: str, *, document: bool = True) -> list[int]:
        """``text``'s tokens with BOS (and, for a whole ``document``, EOS) as the config says."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return self._wrap(ids, document)

    def _wrap(self, ids: list[int], document: bool) -> list[int]:
        head = [self.bos_id] if self.bos_id is not None else []
        tail = [self.eos_id] if document and self.eos_id is not None else []
        return head + ids + tail

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens left out."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def describe(self) -> str:
        parts = [f"{name} {i}" for name, i in (("bos", self.bos_id), ("eos", self.eos_id)) if i is not None]
        specials = ", ".join(parts) or "no special tokens"
        return f"{self.path} ({self.vocab_size:,} tokens; per document: {specials})"


def _special(tok: Any, config: dict[str, Any], name: str, where: Path) -> int | None:
    text = _token_text(config.get(f"{name}_token"))
    if text is None:
        return None
    token = tok.token_to_id(text)
    if token is None and config.get(f"add_{name}_token"):
        raise DataError(f"{where}: {name}_token {text!r} is not in the tokenizer's vocabulary", arg="tokenizer")
    return token


def _template(tok: Any) -> tuple[list[int], list[int]]:
    """The tokens the tokenizer's post-processor puts before and after a text (its own BOS / EOS)."""
    bare = tok.encode("x", add_special_tokens=False).ids
    full = tok.encode("x", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return [], []


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> TextTokenizer:
    try:
        import tokenizers
    except ImportError:  # a dependency: only a broken install gets here
        raise DataError("tokenizing text needs the tokenizers package: pip install tokenizers") from None
    raw = _read_bytes(path)
    try:
        tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the Rust parser's message, on one line
        first = " ".join(str(e).split())[:160]
        raise DataError(f"{path}: not a tokenizer.json the tokenizers library can read ({first})") from None
    config_path = path.parent / TOKENIZER_CONFIG
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(_read_bytes(config_path))
        except ValueError as e:
            raise DataError(f"{config_path}: not valid JSON ({e})") from None
        if not isinstance(config, dict):
            raise DataError(f"{config_path}: expected a JSON object")
    bos, eos = _special(tok, config, "bos", config_path), _special(tok, config, "eos", config_path)
    head, tail = _template(tok)
    add_bos = config["add_bos_token"] if "add_bos_token" in config else bool(head)
    add_eos = config["add_eos_token"] if "add_eos_token" in config else bool(tail)
    bos_id = (bos if bos is not None else head[0] if head else None) if add_bos else None
    eos_id = (eos if eos is not None else tail[-1] if tail else None) if add_eos else None
    if bos_id is None and eos_id is None and eos is not None:
        eos_id = eos  # GPT-2 style: documents separated by the end-of-text token
    digest = hashlib.sha256(raw + json.dumps([bos_id, eos_id]).encode()).hexdigest()
    return TextTokenizer(path, tok, bos_id, eos_id, eos, digest)


def _read_bytes(path: Path, arg: str = "tokenizer") -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}", arg=arg) from None


def load_tokenizer(path: str | os.PathLike) -> TextTokenizer:
    """A :class:`TextTokenizer` from a ``tokenizer.json`` or a folder holding one (and its config).

    Example::

        >>> tok = pt.data.load_tokenizer("tests/fixtures/hf/llama")      # tokenizer.json + tokenizer_config.json
        >>> tok.encode("def f():")[:1], tok.bos_id                  # a BOS first, as the config says
        ([1], 1)
        >>> tok.decode(tok.encode("def f():"))
        'def f():'
    """
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / TOKENIZER_JSON
    if not p.is_file():
        raise DataError(f"{path}: no such tokenizer (a tokenizer.json, or a folder holding one)", arg="tokenizer")
    return _load(p, p.stat().st_mtime)


# -- the token cache ------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/partitioning/tokens`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "partitioning" / "tokens"


def _pieces(text: str) -> list[str]:
    """A document cut at line ends into pieces of about PIECE_BYTES (the tokenizer runs them in parallel)."""
    if len(text) <= PIECE_BYTES:
        return [text]
    out, start = [], 0
    while start < len(text):
        cut = text.find("\n", start + PIECE_BYTES)
        stop = len(text) if cut < 0 else cut + 1
        out.append(text[start:stop])
        start = stop
    return out


def _corpus_digest(files: Sequence[Path], tok: TextTokenizer) -> str:
    h = hashlib.sha256(f"{CACHE_FORMAT}\0{tok.digest}\0".encode())
    for f in files:
        data = _read_bytes(f, "path")
        h.update(len(data).to_bytes(8, "little"))
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def tokenize_files(
    files: Sequence[str | os.PathLike],
    tok: TextTokenizer,
    cache_dir: str | os.PathLike | None = None,
    progress: bool | str = True,
) -> np.ndarray:
    """The tokens of ``files`` (one document each, in order) as a read-only memory-mapped array.

    Tokenized once: the array is cached in ``cache_dir`` (default
    :func:`default_cache_dir`) under a digest of the tokenizer, its BOS / EOS
    rules and the files' contents, and written atomically (a temporary file,
    then a rename), so concurrent processes never read half a file. ``progress``:
    as :class:`~partitioning.data.progress.Progress` (nothing is said of work done within a second).
    """
    paths = [Path(f) for f in files]
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = folder / f"{_corpus_digest(paths, tok)}.npy"
    if target.is_file():
        try:
            return np.load(target, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            pass  # damaged: tokenize again
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot make the token cache {folder}: {e.strerror}", arg="cache_dir") from None
    total = sum(f.stat().st_size for f in paths)
    bar = Progress(total, f"{len(paths):,} file(s), {total / 1e6:.1f} MB, with {tok.path}", progress)
    chunks: list[np.ndarray] = []
    group: list[tuple[tuple[int, int], str]] = []  # ((document, piece), text)
    firsts: set[tuple[int, int]] = set()  # the pieces that begin a document, and those that end one
    lasts: set[tuple[int, int]] = set()
    encode = getattr(tok.tokenizer, "encode_batch_fast", tok.tokenizer.encode_batch)

    def flush() -> None:
        for (key, _), enc in zip(group, encode([text for _, text in group], add_special_tokens=False), strict=True):
            head = [tok.bos_id] if key in firsts and tok.bos_id is not None else []
            tail = [tok.eos_id] if key in lasts and tok.eos_id is not None else []
            chunks.append(np.asarray(head + list(enc.ids) + tail, dtype=tok.dtype))
        group.clear()

    size = 0
    for i, f in enumerate(paths):
        text = _read_bytes(f, "path").decode("utf-8", errors="replace")
        pieces = _pieces(text)
        firsts.add((i, 0))
        lasts.add((i, len(pieces) - 1))
        for j, piece in enumerate(pieces):
            group.append(((i, j), piece))
            size += len(piece)
            if size >= GROUP_BYTES:
                flush()
                size = 0
        bar.update(len(text))
    flush()
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, tok.dtype)
    # A unique temporary name: the processes of a multi-host run may share this folder.
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, tokens, allow_pickle=False)
        os.replace(name, target)
    except OSError as e:
        Path(name).unlink(missing_ok=True)
        raise DataError(f"cannot write the token cache {target}: {e.strerror}", arg="cache_dir") from None
    bar.close(f"data: {len(tokens):,} tokens in {bar.seconds:.1f} s, cached as {target}")
    return np.load(target, mmap_mode="r", allow_pickle=False)


__all__ = ["TextTokenizer", "load_tokenizer", "tokenize_files", "default_cache_dir"]
