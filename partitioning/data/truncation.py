"""What ``seq_len`` leaves of each instruction example, and what the loss then counts: before the first step.

An example of ``n`` tokens trains on ``n - 1`` targets; one longer than ``seq_len + 1`` tokens is cut to
that length (``data.truncation``):

- ``right`` (the default): its end goes, as TRL's ``keep_start``: a long prompt can leave no answer;
- ``left``: its start goes (TRL's ``keep_end``): the answer at the end stays;
- ``drop``: it is left out.

:func:`loss_tokens` counts, from the examples' loss masks and offsets alone (no token is read twice, and
the cached examples serve any ``seq_len``), the answer tokens each example has and keeps. A run whose
loss would count no token is refused before its first step (``check`` says so too), and one whose
truncation removes more than ``data.max_truncated_answers`` of the answer tokens is warned about, with the
numbers: ``61 of 64 examples lost their whole answer at seq_len 64 (longest prompt 190 tokens)``.

Example::

    >>> from partitioning.data.examples import Examples
    >>> from partitioning.data.truncation import loss_tokens
    >>> mask = np.array([0, 0, 0, 0, 1, 1,   0, 1, 1], np.uint8)      # two examples: 6 and 3 tokens
    >>> ex = Examples(np.arange(9), mask, np.array([0, 6, 9]), "demo")
    >>> r = loss_tokens(ex, 3)                                      # keeps the first 4 tokens of each
    >>> r.answers, r.kept, r.lost_whole, r.longest_prompt
    (4, 2, 1, 4)
    >>> r.describe(3)
    '1 of 2 examples lost their whole answer at seq_len 3 (longest prompt 4 tokens); 50.0% of the answer tokens are cut'
    >>> loss_tokens(ex, 3, "left").kept                             # keeps the last 4: every answer token
    4
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

MODES = ("right", "left", "drop")
BLOCK = 1 << 22  # tokens summed at once (bounds the memory a huge file's count takes)


@dataclasses.dataclass(frozen=True)
class LossTokens:
    """Answer tokens (targets the loss counts) of a split before and after truncation at one ``seq_len``."""

    examples: int
    answers: int  # answer tokens among every example's targets, uncut
    kept: int  # those the truncated examples keep
    cut: int  # examples longer than seq_len + 1 tokens
    lost_whole: int  # examples with answer tokens that keep none
    dropped: int  # examples left out (truncation: drop)
    longest_prompt: int  # tokens before the first answer token, longest among the examples that lost it all
    shortest: int = 0  # tokens of the shortest example with an answer (0: none has one)

    @property
    def share_cut(self) -> float:
        """The share of the answer tokens truncation removes."""
        return 1.0 - self.kept / self.answers if self.answers else 0.0

    def describe(self, seq_len: int) -> str:
        """``61 of 64 examples lost their whole answer at seq_len 64 (longest prompt 190 tokens); ...``."""
        if self.lost_whole:
            out = (
                f"{self.lost_whole:,} of {self.examples:,} examples lost their whole answer at seq_len {seq_len} "
                f"(longest prompt {self.longest_prompt:,} tokens)"
            )
        elif self.dropped:
            out = f"{self.dropped:,} of {self.examples:,} examples are longer than seq_len {seq_len} + 1 and left out"
        else:
            out = f"{self.cut:,} of {self.examples:,} examples are cut at seq_len {seq_len}"
        return out + f"; {self.share_cut:.1%} of the answer tokens are cut"


def _sums(cum_of: Any, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    return cum_of(stops) - cum_of(starts)


def _blocks(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Runs of examples ``[i, j)`` of about BLOCK tokens (one example per run at least)."""
    out, i, n = [], 0, len(offsets) - 1
    while i < n:
        j = int(np.searchsorted(offsets, offsets[i] + BLOCK, side="right")) - 1
        j = min(max(j, i + 1), n)
        out.append((i, j))
        i = j
    return out


def loss_tokens(examples: Any, seq_len: int, mode: str = "right") -> LossTokens:
    """The :class:`LossTokens` of ``examples`` (an :class:`~partitioning.data.examples.Examples`) cut at
    ``seq_len`` the ``mode`` way (``right``, ``left`` or ``drop``)."""
    if mode not in MODES:
        raise ValueError(f"truncation must be one of {', '.join(MODES)}, got {mode!r}")
    offsets = np.asarray(examples.offsets, np.int64)
    t = int(seq_len)
    answers = kept = cut = lost = dropped = longest = 0
    shortest = None
    for i, j in _blocks(offsets):
        lo, hi = offsets[i:j], offsets[i + 1 : j + 1]
        base = int(lo[0]) if len(lo) else 0
        mask = np.asarray(examples.mask[base : int(hi[-1])], np.int64)
        cum = np.concatenate([[0], np.cumsum(mask)])

        def at(x: np.ndarray, cum: np.ndarray = cum, base: int = base) -> np.ndarray:
            return cum[x - base]

        first = np.minimum(lo + 1, hi)  # targets are tokens[1:]: the first token is never one
        total = _sums(at, first, hi)
        long = hi - lo > t + 1
        if mode == "right":
            keep = _sums(at, first, np.minimum(hi, lo + t + 1))
        elif mode == "left":
            keep = _sums(at, np.maximum(first, hi - t), hi)
        else:
            keep = np.where(long, 0, total)
            dropped += int(long.sum())
        answers += int(total.sum())
        if (total > 0).any():
            low = int((hi - lo)[total > 0].min())
            shortest = low if shortest is None else min(shortest, low)
        kept += int(keep.sum())
        cut += int(long.sum())
        gone = (total > 0) & (keep == 0) & long & (mode != "drop")
        lost += int(gone.sum())
        if gone.any():
            # the prompt of an example: its tokens before its first answer token
            for a, b in zip(lo[gone], hi[gone], strict=True):
                head = np.flatnonzero(mask[a - base + 1 : b - base])
                longest = max(longest, int(head[0]) + 1 if len(head) else int(b - a))
    return LossTokens(len(offsets) - 1, answers, kept, cut, lost, dropped, longest, shortest or 0)


__all__ = ["LossTokens", "loss_tokens", "MODES"]
