"""Training data: corpora of tokens (text bytes or pre-tokenized arrays) and resumable global batches.

With no path, the corpus is the running interpreter's own standard library
(its ``.py`` files, minus tests and site-packages): real text, no download.
A path is a text file or folder (bytes, vocabulary 256) or pre-tokenized
``.npy`` / ``.bin`` arrays, memory-mapped (see :mod:`partitioning.data.sources`).

Batches come from a grain ``MapDataset`` (:mod:`partitioning.data.order`):
the batch for step ``k`` is a pure function of ``(seed, k)``, so a run
resumed at step ``k`` — on another mesh or another number of processes —
sees exactly the data the uninterrupted run would have. Each process reads
only the rows its devices hold and the global array is assembled with
:func:`jax.make_array_from_process_local_data`, so the same code runs on one
host or many.

Example::

    >>> corpus = pt.data.load_corpus()                   # stdlib bytes; or pt.data.load_corpus("tokens/train.npy")
    >>> sharding = jax.NamedSharding(pt.make_mesh({"data": -1}), jax.P("data"))
    >>> batches = corpus.batches("train", 32, 128, sharding, seed=0)
    >>> batch = batches.batch_at(0)                 # the batch of step 0, on any mesh, any time
    >>> batch["inputs"].shape, batch["targets"].dtype
    ((32, 128), dtype('int32'))
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from partitioning.data.batch import local_block
from partitioning.data.sources import BYTE_VOCAB, TokenStream, read_splits, stdlib_files
from partitioning.data.tokenize import load_tokenizer
from partitioning.errors import DataError

VOCAB_SIZE = BYTE_VOCAB


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Train and eval token sequences and where they came from.

    ``train`` / ``eval`` are ``uint8`` arrays for text and
    :class:`~partitioning.data.sources.TokenStream` s (memory-mapped files)
    for pre-tokenized data. ``vocab`` is 256 for text, None for token arrays
    (their largest token is checked against the model by the config build).

    Example::

        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> for i in range(4):
        ...     _ = (folder / f"part{i}.txt").write_text("all work and no play " * 500)
        >>> corpus = pt.data.load_corpus(str(folder))
        >>> corpus.kind, corpus.vocab, len(corpus.train_files), len(corpus.eval_files)
        ('text', 256, 3, 1)
        >>> corpus.batches("train", 8, 64, seed=0).batch_at(0)["inputs"].shape   # numpy without a sharding
        (8, 64)
    """

    train: Any
    eval: Any
    source: str
    train_files: tuple[str, ...] = ()
    eval_files: tuple[str, ...] = ()
    kind: str = "text"
    vocab: int | None = BYTE_VOCAB
    eval_source: str | None = None  # where eval came from, when not split off ``source``
    tokenizer: Any = None  # the TextTokenizer text was tokenized with (None: bytes)

    def tokens(self, split: str) -> Any:
        if split not in ("train", "eval"):
            raise DataError(f"split must be 'train' or 'eval', got {split!r}")
        return self.train if split == "train" else self.eval

    def batches(
        self, split: str, batch_size: int, seq_len: int, sharding: Any = None, *, seed: int = 0
    ) -> TokenBatches:
        """Resumable batches of ``split``; see :class:`TokenBatches`."""
        where = self.eval_source if split == "eval" and self.eval_source else self.source
        return TokenBatches(
            self.tokens(split), batch_size, seq_len, sharding, seed=seed, name=f"{where} ({split})", split=split
        )

    def describe(self) -> str:
        unit = "bytes" if self.kind == "text" and self.tokenizer is None else "tokens"
        out = f"{self.source}: {len(self.train):,} train / {len(self.eval):,} eval {unit}"
        return out + (f" (tokenizer {self.tokenizer.path})" if self.tokenizer is not None else "")


@functools.lru_cache(maxsize=4)
def load_corpus(
    path: str | None = None,
    *,
    source: str | None = None,
    dtype: str | None = None,
    eval_path: str | None = None,
    eval_fraction: float = 0.05,
    tokenizer: str | None = None,
    cache_dir: str | None = None,
) -> Corpus:
    """The embedded stdlib corpus (``path=None``), text, or pre-tokenized ``.npy`` / ``.bin`` arrays.

    With ``tokenizer`` (a ``tokenizer.json`` or a folder holding one) text is
    tokenized, each file one document with BOS / EOS as the tokenizer's config
    says, and cached in ``cache_dir`` (see :mod:`partitioning.data.tokenize`).

    ``source`` is ``"text"`` or ``"tokens"`` (default: ``tokens`` for
    ``.npy`` / ``.bin`` files or folders of them); ``dtype`` is required for
    ``.bin`` files. Several files are split by file (a hash of their relative
    path picks ``ceil(n * eval_fraction)`` for eval); a single file by
    position (its last ``eval_fraction``); ``eval_path`` names the eval data
    instead.

    Example::

        >>> import pathlib, tempfile
        >>> c = pt.data.load_corpus()
        >>> len(c.train) > 1_000_000, len(c.eval) > 10_000
        (True, True)
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (np.arange(10_000) % 50_000).astype(np.uint16).tofile(d / "train.bin")
        >>> (np.arange(1_000) % 50_000).astype(np.uint16).tofile(d / "val.bin")
        >>> pt.data.load_corpus(str(d / "train.bin"), dtype="uint16", eval_path=str(d / "val.bin")).kind
        'tokens'
    """
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    train, ev, info = read_splits(
        path,
        source=source,
        dtype=dtype,
        eval_path=eval_path,
        eval_fraction=eval_fraction,
        tokenizer=tok,
        cache_dir=cache_dir,
    )
    return Corpus(
        train,
        ev,
        info["source"],
        info["train_files"],
        info["eval_files"],
        info["kind"],
        info["vocab"],
        info["eval_source"] if info["eval_source"] != info["source"] else None,
        tok if info["kind"] == "text" else None,
    )


class TokenBatches:
    """Next-token batches where the batch for step ``k`` is a pure function of ``(seed, k)``.

    The token sequence is cut into ``n = (len - 1) // seq_len`` windows of
    ``seq_len + 1`` tokens (inputs and targets shifted by one). Global example
    ``g = k * batch_size + row`` is window ``perm_e[g % n]`` of epoch
    ``e = g // n``, with ``perm_e`` grain's index shuffle seeded by
    ``(seed, e)``. With a ``sharding`` the result is a global ``jax.Array``
    assembled from the rows this process holds (and reads); without one,
    numpy arrays. :attr:`dataset` is the grain ``MapDataset`` of this
    process's blocks.

    Example::

        >>> tokens = np.arange(100_000) % 256
        >>> sharding = jax.NamedSharding(pt.make_mesh({"data": -1}), jax.P("data"))
        >>> b = pt.data.TokenBatches(tokens, 8, 64, sharding, seed=1)
        >>> b.batch_at(7)["inputs"].shape
        (8, 64)
        >>> bool((b.batch_at(7)["inputs"] == b.batch_at(7)["inputs"]).all())   # a pure function of (seed, step)
        True
    """

    def __init__(
        self,
        tokens: Any,
        batch_size: int,
        seq_len: int,
        sharding: Any = None,
        *,
        seed: int = 0,
        name: str = "data",
        split: str = "train",
    ):
        if batch_size < 1 or seq_len < 1:
            raise DataError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
        self.tokens = tokens if isinstance(tokens, TokenStream) else np.asarray(tokens)
        self.batch_size, self.seq_len, self.sharding, self.seed = batch_size, seq_len, sharding, seed
        self.split = split
        self.n_windows = max(0, (len(self.tokens) - 1) // seq_len)
        if self.n_windows < batch_size:
            windows = f"{self.n_windows} window{'s' * (self.n_windows != 1)}"
            raise DataError(
                f"{name}: {len(self.tokens):,} tokens make only {windows} of "
                f"{seq_len + 1} tokens, fewer than the batch size {batch_size}; use more data or "
                f"smaller train.batch_size / train.seq_len"
            )
        shape = (batch_size, seq_len)
        block = local_block(sharding, shape) if sharding is not None else (slice(0, batch_size), slice(0, seq_len))
        self._rows, self._cols = block[0], block[1]
        from partitioning.data.order import token_batches  # grain loads on first use (~0.5 s at startup)

        self.dataset = token_batches(
            self.tokens,
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            split=split,
            rows=self._rows,
            cols=self._cols,
        )

    def windows_at(self, step: int) -> np.ndarray:
        """Window indices of the global batch of ``step`` (all rows): the same shuffle, over indices."""
        from partitioning.data.order import ProcessRows, example_order

        return ProcessRows(
            example_order(self.n_windows, self.seed, self.split), self.batch_size, slice(0, self.batch_size)
        )[step]

    def host_batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This process's block of the batch of ``step`` as numpy ``int32`` arrays."""
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        return self.dataset[int(step)]

    def batch_at(self, step: int) -> dict[str, Any]:
        """The global batch of ``step``: ``{"inputs", "targets"}``, int32 ``(batch, seq_len)``."""
        local = self.host_batch_at(step)
        if self.sharding is None:
            return local
        shape = (self.batch_size, self.seq_len)
        return {k: jax.make_array_from_process_local_data(self.sharding, v, shape) for k, v in local.items()}

    def __iter__(self):
        step = 0
        while True:
            yield self.batch_at(step)
            step += 1


class ArrayDataset:
    """A dataset of examples held as arrays with a leading example dimension (images, labels, ...).

    The last ``eval_fraction`` of the examples (after a seeded shuffle by
    ``split_seed``) is the eval split. A data source a config names with
    ``data: {_target_: ...}`` returns one of these (or anything with
    ``example(batch_size)`` and ``batches(split, batch_size, shardings, seed=)``).

    Example::

        >>> import optax
        >>> images = np.random.default_rng(0).normal(size=(640, 8, 8, 1)).astype(np.float32)
        >>> labels = np.arange(640) % 10
        >>> data = pt.data.ArrayDataset({"inputs": images, "targets": labels}, eval_fraction=0.1)
        >>> model = pt.as_model(nn.Sequential([lambda x: x.reshape(x.shape[0], -1), nn.Dense(10)]))
        >>> trainer = pt.Trainer(model, optax.sgd(0.1), pt.make_mesh({"data": -1}), "dp",
        ...                      batch=data.example(64), task="classification")
        >>> batches = data.batches("train", 64, trainer.batch_shardings, seed=0)
        >>> batches.batch_at(0)["inputs"].shape
        (64, 8, 8, 1)
    """

    def __init__(
        self, arrays: dict[str, Any], *, eval_fraction: float = 0.1, split_seed: int = 0, source: str = "arrays"
    ):
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        sizes = {len(v) for v in arrays.values()}
        if len(sizes) != 1 or not sizes or 0 in sizes:
            raise DataError(
                f"{source}: the arrays need one shared, non-zero leading (example) dimension, got "
                f"{ {k: v.shape for k, v in arrays.items()} }"
            )
        if not 0 < eval_fraction < 1:
            raise DataError(
                f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}", arg="eval_fraction"
            )
        n = sizes.pop()
        order = np.random.default_rng(split_seed).permutation(n)
        cut = n - max(1, int(n * eval_fraction))
        self.splits = {"train": order[:cut], "eval": order[cut:]}
        self.arrays, self.source = arrays, source

    def example(self, batch_size: int) -> dict[str, Any]:
        """One batch's shapes and dtypes (``ShapeDtypeStruct`` s)."""
        return {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype) for k, v in self.arrays.items()}

    def __len__(self) -> int:
        return len(self.splits["train"])

    def batches(self, split: str, batch_size: int, shardings: Any = None, *, seed: int = 0) -> ArrayBatches:
        """Resumable batches of ``split``: the batch of step ``k`` is a pure function of ``(seed, k)``."""
        if split not in self.splits:
            raise DataError(f"split must be 'train' or 'eval', got {split!r}")
        return ArrayBatches(
            self.arrays,
            self.splits[split],
            batch_size,
            shardings,
            seed=seed,
            name=f"{self.source} ({split})",
            split=split,
        )


class ArrayBatches:
    """Batches of examples ``indices`` of ``arrays``; epoch ``e`` visits them in an order seeded by ``(seed, e)``.

    Each process reads only the rows its devices hold (:attr:`dataset`, a grain ``MapDataset``).
    """

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        indices: np.ndarray,
        batch_size: int,
        shardings: Any,
        *,
        seed: int,
        name: str,
        split: str = "train",
    ):
        if len(indices) < batch_size:
            raise DataError(
                f"{name}: {len(indices)} examples, fewer than the batch size {batch_size}; use more "
                f"data or a smaller train.batch_size"
            )
        self.arrays, self.indices, self.batch_size = arrays, indices, batch_size
        self.shardings, self.seed = shardings, seed
        from partitioning.data.order import array_batches, process_rows  # grain loads on first use

        self.shapes = {k: (batch_size, *v.shape[1:]) for k, v in arrays.items()}
        if shardings is None:
            self.rows = slice(0, batch_size)
        else:
            self.rows = process_rows(shardings, jax.tree.leaves(self.shapes, is_leaf=lambda x: isinstance(x, tuple)))
        self.dataset = array_batches(arrays, indices, batch_size=batch_size, seed=seed, split=split, rows=self.rows)

    def host_batch_at(self, step: int) -> dict[str, np.ndarray]:
        """Rows :attr:`rows` of the batch of ``step`` as numpy arrays (all rows without shardings)."""
        return self.dataset[int(step)]

    def batch_at(self, step: int) -> dict[str, Any]:
        """The global batch of ``step``, placed on the devices (each process reads only its rows)."""
        host = self.host_batch_at(step)
        if self.shardings is None:
            return host

        def one(x, sharding, shape):
            block = local_block(sharding, shape)
            rows = slice(block[0].start - self.rows.start, block[0].stop - self.rows.start)
            return jax.make_array_from_process_local_data(sharding, x[(rows, *block[1:])], shape)

        return jax.tree.map(one, host, self.shardings, self.shapes, is_leaf=lambda x: isinstance(x, tuple))


__all__ = ["Corpus", "TokenBatches", "ArrayDataset", "ArrayBatches", "load_corpus", "stdlib_files", "VOCAB_SIZE"]
