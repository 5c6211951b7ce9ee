"""Trainable subsets: which params train (regexes over their paths), and the params tree split by it.

``trainable`` is a list of regexes searched (``re.search``) in the ``/``-joined
parameter paths that ``plan`` prints (``blocks/attn/q``, ``embedding``); a
param trains when any of them matches, the others are *frozen*. The train
step differentiates only the trainable part and the optimizer sees only it,
so a frozen param has no gradient and no optimizer state at all (not zeros).
With LoRA adapters in the model and no ``trainable`` given, only the adapters
train (:data:`LORA_TRAINABLE`).

The split works on nested mappings (what Flax Linen params and NNX pure
dicts are): the trainable part keeps only the keys that lead to trainable
params, so optimizer-state paths stay those of the params they belong to.

Example::

    >>> from partitioning.finetune.trainable import merge_trees, split_tree
    >>> params = {"attn": {"q": 1, "q_lora_a": 2}, "norm": {"scale": 3}}
    >>> keep = pt.finetune.trainable_paths(["lora"], ["attn/q", "attn/q_lora_a", "norm/scale"])
    >>> train, frozen = split_tree(params, keep.__contains__)
    >>> train, frozen
    ({'attn': {'q_lora_a': 2}}, {'attn': {'q': 1}, 'norm': {'scale': 3}})
    >>> merge_trees(train, frozen) == params
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from partitioning.boxes import is_box
from partitioning.errors import ConfigError
from partitioning.finetune.lora import ADAPTER_PATTERN
from partitioning.finetune.quantize import SCALE_SUFFIX
from partitioning.layout import path_str

# What trains by default when the model carries LoRA adapters (`<name>_lora_a`, `<name>_lora_b`).
LORA_TRAINABLE = (ADAPTER_PATTERN,)


def param_paths(params: Any) -> list[str]:
    """The ``/``-joined path of every param leaf (boxed or not), as ``plan`` prints them without ``params/``."""
    return [path_str(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_box)[0]]


def _compile(patterns: Sequence[str]) -> list[re.Pattern[str]]:
    out = []
    for i, p in enumerate(patterns):
        if not isinstance(p, str):
            raise ConfigError(f"trainable: expected a regex string, got {p!r}", arg=f"trainable/{i}")
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ConfigError(f"trainable: {p!r} is not a valid regex: {e}", arg=f"trainable/{i}") from None
    return out


def trainable_paths(patterns: Sequence[str] | str, paths: Iterable[str]) -> frozenset[str]:
    """The ``paths`` that any of ``patterns`` matches (``re.search``).

    A pattern that matches no path is a :class:`ConfigError` (``arg``
    ``trainable/<i>``) naming the pattern and a few paths there are.

    Example::

        >>> sorted(pt.finetune.trainable_paths(["wo"], ["blocks/mlp/wi_0", "blocks/mlp/wo", "embedding"]))
        ['blocks/mlp/wo']
        >>> pt.finetune.trainable_paths(["lora"], ["blocks/mlp/wi_0", "embedding"])
        Traceback (most recent call last):
        ...
        partitioning.errors.ConfigError: trainable: 'lora' matches no parameter (2 params: blocks/mlp/wi_0, embedding)
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    paths = list(paths)
    compiled = _compile(patterns)
    if not compiled:
        raise ConfigError("trainable: an empty list trains nothing; leave it out to train every parameter")
    keep: set[str] = set()
    for i, rx in enumerate(compiled):
        hits = {p for p in paths if rx.search(p)}
        if not hits:
            shown = ", ".join(paths[:6]) + (", ..." if len(paths) > 6 else "")
            raise ConfigError(
                f"trainable: {rx.pattern!r} matches no parameter ({len(paths)} params: {shown})", arg=f"trainable/{i}"
            )
        keep |= hits
    return frozenset(keep)


def _leaf_paths(node: Any, prefix: str) -> list[str]:
    out = []
    for kp, _ in jax.tree_util.tree_flatten_with_path(node, is_leaf=is_box)[0]:
        sub = path_str(kp)
        out.append(f"{prefix}/{sub}" if prefix and sub else prefix or sub)
    return out


def split_tree(tree: Any, keep: Callable[[str], bool], prefix: str = "") -> tuple[Any, Any]:
    """``(kept, rest)``: ``tree``'s nested mappings split by ``keep(path)`` of each leaf; empty branches dropped.

    A leaf is anything that is not a mapping (an array, a box, a ShapeDtypeStruct). A
    non-mapping container (a list or tuple of arrays) goes whole to one side; one whose
    leaves are split by ``keep`` is a :class:`ConfigError`.
    """
    if not isinstance(tree, Mapping):
        flags = {keep(p) for p in _leaf_paths(tree, prefix)}
        if len(flags) > 1:
            raise ConfigError(
                f"trainable: {prefix or 'the params'} is a {type(tree).__name__}, not a mapping: "
                "train all of its leaves or none"
            )
        return (tree, None) if flags == {True} else (None, tree)
    kept, rest = {}, {}
    for k, v in tree.items():
        a, b = split_tree(v, keep, f"{prefix}/{k}" if prefix else str(k))
        if a is not None and not (isinstance(a, Mapping) and not a and v):
            kept[k] = a
        if b is not None and not (isinstance(b, Mapping) and not b and v):
            rest[k] = b
    return kept, rest


def merge_trees(a: Any, b: Any) -> Any:
    """The union of two trees :func:`split_tree` made (mappings merged key by key)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = dict(b)
        for k, v in a.items():
            out[k] = merge_trees(v, b.get(k))
        return out
    raise ValueError("merge_trees: the two trees overlap on a leaf")


class Subset:
    """The trainable part of a params tree: ``split`` / ``merge`` by a set of frozen paths (empty: all train)."""

    def __init__(self, frozen: Iterable[str] = ()):
        self.frozen = frozenset(frozen)

    @property
    def all(self) -> bool:
        return not self.frozen

    def trains(self, path: str) -> bool:
        return path not in self.frozen

    def split(self, params: Any) -> tuple[Any, Any]:
        """``(trainable, frozen)``; ``(params, None)`` when everything trains."""
        if self.all:
            return params, None
        return split_tree(params, self.trains)

    def merge(self, trainable: Any, frozen: Any) -> Any:
        return trainable if frozen is None else merge_trees(trainable, frozen)

    def trainable(self, params: Any) -> Any:
        return self.split(params)[0]


def subset_of(params: Any, trainable: Sequence[str] | str | None, *, has_lora: bool | None = None) -> Subset:
    """The :class:`Subset` ``trainable`` selects among ``params`` (abstract, boxed or not).

    ``None`` trains everything, or only the LoRA adapters when the params have
    some (``has_lora``: decided from the paths when None).
    """
    paths = param_paths(params)
    if trainable is None:
        lora = any(re.search(LORA_TRAINABLE[0], p) for p in paths) if has_lora is None else has_lora
        if not lora:
            return Subset()
        trainable = LORA_TRAINABLE
    keep = trainable_paths(trainable, paths)
    quantized = {q for p in paths if p.endswith(SCALE_SUFFIX) for q in (p, p[: -len(SCALE_SUFFIX)])}
    if keep & quantized:
        p = sorted(keep & quantized)[0]
        raise ConfigError(
            f"trainable: {p} is part of the quantized base (model.lora.base_dtype), which cannot train; "
            "match the adapters only (the default with model.lora: _lora_[ab]$)",
            arg="trainable",
        )
    return Subset(p for p in paths if p not in keep)


__all__ = ["LORA_TRAINABLE", "param_paths", "trainable_paths", "split_tree", "merge_trees", "Subset", "subset_of"]
