"""Data: where tokens come from, in which order, and how they become a step's sharded batch.

Text or token files, a checkpoint's tokenizer, chat and prompt / completion
rows rendered with the checkpoint's own template, packing, a seeded resumable
order per process, and the batch placed on the mesh as the rules lay it out.

Modules:

- :mod:`~partitioning.data.sources` — where tokens come from: text files (bytes), ``.npy`` / ``.bin`` token arrays.
- :mod:`~partitioning.data.tokenize` — text -> tokens with a ``tokenizer.json``: BOS / EOS per document, cached.
- :mod:`~partitioning.data.order` — the grain ``MapDataset`` s: seeded example order, each process's rows.
- :mod:`~partitioning.data.batch` — a step's batch: names, shardings, micro-batches, host -> devices, RNG keys.
- :mod:`~partitioning.data.corpus` — corpora and resumable, per-process global batches (the public API).
- :mod:`~partitioning.data.chat` — a checkpoint's Jinja chat template, rendered as ``transformers`` renders it.
- :mod:`~partitioning.data.jsonl` — JSON Lines as JSON defines them: lines end at ``\\n`` only, read as a stream.
- :mod:`~partitioning.data.instruct` — chat / prompt_completion JSONL files -> cached examples and their corpus.
- :mod:`~partitioning.data.rows` — one row -> its tokens and loss mask, in groups the tokenizer runs at once.
- :mod:`~partitioning.data.masks` — the loss mask of a chat: exactly which characters are the assistant's.
- :mod:`~partitioning.data.examples` — tokenized examples held flat, and their cache (written once, memory-mapped).
- :mod:`~partitioning.data.truncation` — what ``seq_len`` leaves of each example, and what the loss then counts.
- :mod:`~partitioning.data.progress` — how tokenizing says where it is, from its first second.
- :mod:`~partitioning.data.packing` — instruction rows: several examples per row with segment ids and positions.
- :mod:`~partitioning.data.prompts` — ``generate``'s prompt files and stop tokens (``generation_config.json``).

Imports: the core modules only.

Example::

    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16)
    >>> batch = next(iter(batches))
    >>> batch["inputs"].shape, batch["targets"].shape
    ((8, 16), (8, 16))
"""

from partitioning.data.batch import place
from partitioning.data.chat import ChatTemplate
from partitioning.data.corpus import ArrayDataset, Corpus, TokenBatches, load_corpus
from partitioning.data.instruct import load_instructions
from partitioning.data.tokenize import TextTokenizer, load_tokenizer

__all__ = [
    "Corpus",
    "TokenBatches",
    "ArrayDataset",
    "load_corpus",
    "load_tokenizer",
    "TextTokenizer",
    "ChatTemplate",
    "load_instructions",
    "place",
]
