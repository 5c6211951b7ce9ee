"""LoRA options and their targets: which weights get adapters, checked against the weights a model has.

``LoRA(rank, alpha, targets, dropout, rslora, dtype)`` is what ``model.lora:``
says (YAML) and what the reference models take as their ``lora`` field
(:mod:`partitioning.models.lora`, the activation path) or
:class:`~partitioning.finetune.lora_model.LoRAModel` wraps any other model with
(the weight path). ``targets`` are regexes searched (``re.search``) in the
``/``-joined parameter path ``plan`` prints, of the base weight
(``blocks/attn/q``, ``block_0/mlp/wi_0``, ``unembed``); a target that matches
no weight is an error naming the weights it could have matched.

Adapter parameters sit beside the weight they adapt: ``<name>_lora_a`` and
``<name>_lora_b``; their rank axis has the logical name ``lora`` (every preset
has the rule ``[lora, null]``). With ``model.lora`` set and no
``train.trainable``, only the adapters train: :data:`ADAPTER_PATTERN`.

Example::

    >>> lora = pt.finetune.LoRA(rank=8, targets=["attn/(q|v)$"])
    >>> lora.alpha, lora.scale, lora.matches("blocks/attn/q"), lora.matches("blocks/attn/o")
    (8.0, 1.0, True, False)
    >>> pt.finetune.LoRA.parse({"rank": 16, "alpha": 32, "targets": ["q"], "rslora": True}).scale   # 32 / sqrt(16)
    8.0
    >>> pt.finetune.LoRA.parse({"rank": 0, "targets": ["q"]})
    Traceback (most recent call last):
    partitioning.errors.ConfigError: lora.rank must be an integer >= 1, got 0
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from partitioning.errors import ConfigError, did_you_mean
from partitioning.finetune.quantize import BASE_DTYPES

# The logical name of the rank axis of every adapter.
RANK_AXIS = "lora"
# Suffixes of the two adapter parameters beside a weight.
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"
# The parameter paths that are adapters (what trains by default when a model has LoRA).
ADAPTER_PATTERN = r"_lora_[ab]$"
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class LoRA:
    """LoRA adapters: ``y = x W + scale * (dropout(x) A) B`` on each weight a target matches.

    ``scale = alpha / rank`` (``alpha / sqrt(rank)`` with ``rslora``), as PEFT.
    ``alpha`` defaults to ``rank`` (scale 1). ``dropout`` applies to the
    adapter's input in training only. ``dtype``: the adapters' parameter dtype
    (float32 by default, even over a bfloat16 base). ``base_dtype``: ``int8`` or
    ``nf4`` stores the frozen base's projection kernels quantized in blocks of
    ``base_block`` values (QLoRA, :mod:`partitioning.finetune.quantize`); unset,
    the base keeps the model's param dtype. Frozen and hashable, so it
    can be a Flax module field. Bad values raise a ConfigError naming the key.

    Example::

        >>> pt.finetune.LoRA(rank=4, alpha=8, targets=("mlp/wo",))
        LoRA(rank=4, alpha=8.0, targets=('mlp/wo',), dropout=0.0, rslora=False, dtype='float32', base_dtype=None, \
base_block=64)
    """

    rank: int
    alpha: float | None = None
    targets: tuple[str, ...] = ()
    dropout: float = 0.0
    rslora: bool = False
    dtype: str = "float32"
    base_dtype: str | None = None
    base_block: int = 64

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"lora.rank must be an integer >= 1, got {self.rank!r}", arg="lora.rank")
        alpha = float(self.rank) if self.alpha is None else self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ConfigError(f"lora.alpha must be a number > 0, got {self.alpha!r}", arg="lora.alpha")
        object.__setattr__(self, "alpha", float(alpha))
        targets = (self.targets,) if isinstance(self.targets, str) else self.targets
        if not isinstance(targets, Sequence) or not targets or not all(isinstance(t, str) for t in targets):
            raise ConfigError(
                f"lora.targets must be a non-empty list of regexes over parameter paths (e.g. ['attn/(q|v)$']), "
                f"got {self.targets!r}",
                arg="lora.targets",
            )
        for t in targets:
            try:
                re.compile(t)
            except re.error as e:
                raise ConfigError(f"lora.targets: {t!r} is not a valid regex: {e}", arg="lora.targets") from None
        object.__setattr__(self, "targets", tuple(targets))
        d = self.dropout
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d < 1:
            raise ConfigError(f"lora.dropout must be a number in [0, 1), got {d!r}", arg="lora.dropout")
        object.__setattr__(self, "dropout", float(d))
        if not isinstance(self.rslora, bool):
            raise ConfigError(f"lora.rslora must be true or false, got {self.rslora!r}", arg="lora.rslora")
        dtype = self.dtype if isinstance(self.dtype, str) else getattr(self.dtype, "__name__", str(self.dtype))
        try:
            name = jnp.dtype(dtype).name
        except TypeError:
            name = str(dtype)
        if name not in DTYPES:
            raise ConfigError(
                f"lora.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}{did_you_mean(str(dtype), DTYPES)}",
                arg="lora.dtype",
            )
        object.__setattr__(self, "dtype", name)
        if self.base_dtype is not None and self.base_dtype not in BASE_DTYPES:
            raise ConfigError(
                f"lora.base_dtype must be one of {', '.join(BASE_DTYPES)} (or unset: the model's param dtype), "
                f"got {self.base_dtype!r}{did_you_mean(str(self.base_dtype), BASE_DTYPES)}",
                arg="lora.base_dtype",
            )
        b = self.base_block
        if isinstance(b, bool) or not isinstance(b, int) or b < 2 or b % 2:
            raise ConfigError(f"lora.base_block must be an even integer >= 2, got {b!r}", arg="lora.base_block")

    @classmethod
    def parse(cls, value: Any) -> LoRA | None:
        """``None`` / a mapping of options / a ``LoRA`` -> ``LoRA | None``; a ConfigError naming the key.

        Example::

            >>> pt.finetune.LoRA.parse({"rank": 8, "targets": ["q"], "drop": 0.1})
            Traceback (most recent call last):
            partitioning.errors.ConfigError: unknown lora option 'drop' (options: rank, alpha, targets, \
dropout, rslora, dtype, base_dtype, base_block); did you mean 'dropout'?
        """
        if value is None or isinstance(value, LoRA):
            return value
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"lora must be a mapping of {', '.join(names)} (e.g. {{rank: 8, targets: ['attn/(q|v)$']}}), "
                f"got {type(value).__name__} {value!r}",
                arg="lora",
            )
        for k in value:
            if k not in names:
                raise ConfigError(
                    f"unknown lora option {k!r} (options: {', '.join(names)}){did_you_mean(str(k), names)}",
                    arg=f"lora.{k}",
                )
        if "rank" not in value:
            raise ConfigError("lora needs a rank (e.g. {rank: 8, targets: ['attn/(q|v)$']})", arg="lora")
        if "targets" not in value:
            raise ConfigError(
                "lora needs targets: regexes over the parameter paths plan prints (e.g. ['attn/(q|v)$'])", arg="lora"
            )
        targets = value["targets"]
        opts = {**value, "targets": tuple(targets) if isinstance(targets, list | tuple) else targets}
        return cls(**opts)

    @property
    def scale(self) -> float:
        """``alpha / rank``, or ``alpha / sqrt(rank)`` with ``rslora``."""
        assert self.alpha is not None  # set in __post_init__
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)

    def matches(self, path: str) -> bool:
        """Whether a base weight's ``/``-joined path is adapted (some target is found in it)."""
        return any(re.search(t, path) for t in self.targets)

    def for_training(self, train: bool) -> LoRA:
        """These options for a forward pass: no dropout outside training."""
        return self if train or not self.dropout else dataclasses.replace(self, dropout=0.0)


def adapter_names(path: str) -> tuple[str, str]:
    """The paths of the two adapters of the weight at ``path``: ``(path_lora_a, path_lora_b)``."""
    return path + A_SUFFIX, path + B_SUFFIX


def is_adapter(path: str) -> bool:
    """Whether a ``/``-joined parameter path is a LoRA adapter.

    Example::

        >>> from partitioning.finetune.lora import is_adapter
        >>> is_adapter("blocks/attn/q_lora_a"), is_adapter("blocks/attn/q")
        (True, False)
    """
    return re.search(ADAPTER_PATTERN, path) is not None


def check_targets(lora: LoRA, candidates: Sequence[str], what: str = "weight") -> None:
    """Raises a ConfigError (``arg="lora.targets"``) for a target that matches none of ``candidates``.

    ``candidates``: the paths of the weights LoRA can adapt; the message shows a
    few of them and the nearest to the target.

    Example::

        >>> from partitioning.finetune.lora import check_targets
        >>> check_targets(pt.finetune.LoRA(rank=4, targets=["attn/qq"]), ["blocks/attn/q", "blocks/attn/k"])
        Traceback (most recent call last):
        partitioning.errors.ConfigError: lora.targets: 'attn/qq' matches no weight LoRA can adapt; \
did you mean 'blocks/attn/q'? (the 2 it can: blocks/attn/q, blocks/attn/k)
    """
    for t in lora.targets:
        if any(re.search(t, c) for c in candidates):
            continue
        if not candidates:
            raise ConfigError(f"lora.targets: {t!r} matches nothing: this model has no {what} LoRA can adapt")
        close = difflib.get_close_matches(t, list(candidates), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        shown = ", ".join(candidates[:8]) + (", ..." if len(candidates) > 8 else "")
        raise ConfigError(
            f"lora.targets: {t!r} matches no {what} LoRA can adapt{hint} (the {len(candidates)} it can: {shown})",
            arg="lora.targets",
        )


# -- the weights a model offers, recorded while its init is traced ---------------------------------

_local = threading.local()


@contextlib.contextmanager
def recording_sites() -> Iterator[dict[str, bool]]:
    """Collects ``{path: adapted}`` of every weight LoRA could adapt, as the models' layers report them."""
    stack = _local.__dict__.setdefault("stack", [])
    seen: dict[str, bool] = {}
    stack.append(seen)
    try:
        yield seen
    finally:
        stack.pop()


def record_site(path: str, adapted: bool) -> None:
    """Called by a layer for each weight LoRA could adapt while its init is traced (no-op outside recording)."""
    stack = getattr(_local, "stack", None)
    if stack:
        stack[-1][path] = stack[-1].get(path, False) or adapted


__all__ = [
    "LoRA",
    "ADAPTER_PATTERN",
    "RANK_AXIS",
    "A_SUFFIX",
    "B_SUFFIX",
    "DTYPES",
    "adapter_names",
    "is_adapter",
    "check_targets",
    "recording_sites",
    "record_site",
]
