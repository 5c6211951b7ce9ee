"""A family's name map applied to one model: which file tensors make which parameter, and checks.

:func:`expand` turns table rows (:mod:`partitioning.models.hf.tables`) into
one :class:`ParamMap` per parameter: per-layer rows become either one stacked
parameter (``scan_layers``: ``blocks/...`` with a leading ``layers`` axis,
layer ``i`` from file tensor ``...{i}...``) or one parameter per
``block_{i}``; a row with ``{e}`` (one file tensor per expert) stacks its
tensors on the parameter's ``expert`` axis too. :func:`match` pairs them with the tensors found on disk and
turns a missing, extra or wrongly shaped tensor into one
:class:`~partitioning.CheckpointError` naming it and what ``config.json``
implies.

Example::

    >>> from flax import traverse_util
    >>> from partitioning.hf.files import discover
    >>> from partitioning.hf.name_map import expand, match
    >>> from partitioning.models.hf.families import FAMILIES
    >>> model = pt.hf.hf_model("tests/fixtures/hf/llama")      # 2 layers, scan_layers
    >>> abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    >>> names = traverse_util.flatten_dict(pt.logical_names(abstract))
    >>> maps, order = expand(FAMILIES["llama"].tensors, lambda opt: getattr(model, opt), 2, True, names)
    >>> maps[2].path, maps[2].hf
    (('blocks', 'attn', 'q'), ('model.layers.0.self_attn.q_proj.weight', 'model.layers.1.self_attn.q_proj.weight'))
    >>> order[:3]
    ['model.embed_tokens.weight', 'model.layers.0.input_layernorm.weight', 'model.layers.0.self_attn.q_proj.weight']
    >>> shapes = {k: v.shape for k, v in traverse_util.flatten_dict(pt.unbox(abstract)).items()}
    >>> stored = discover("tests/fixtures/hf/llama")
    >>> len(match(maps, shapes, stored))
    21
    >>> del stored["model.layers.1.mlp.up_proj.weight"]
    >>> match(maps, shapes, stored, where="tests/fixtures/hf/llama")
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: tests/fixtures/hf/llama: tensor 'model.layers.1.mlp.up_proj.weight' is \
missing (expected shape [64, 32] from config.json)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from partitioning.errors import CheckpointError
from partitioning.hf.files import Stored
from partitioning.hf.pattern import Pattern

STACK, BLOCK = "blocks", "block_{i}"


@dataclass(frozen=True)
class ParamMap:
    """One parameter: its path, the pattern from its file tensor(s), and their names (one per layer if stacked)."""

    path: tuple[str, ...]
    pattern: Pattern
    part: int | None
    hf: tuple[str, ...]
    stacked: bool
    expert_axis: int | None = None  # the parameter's `expert` axis when each expert is its own file tensor ({e})
    experts: int = 0
    # A fused tensor whose parts differ in size (Phi-3's qkv_proj with fewer kv heads than heads): each part's
    # extent along the file's first dimension, in units of that dimension's first atom; ``part`` picks one.
    split: tuple[int, ...] = ()

    def file_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The whole file tensor's shape for one of its parameters of ``shape`` (all parts of a fused one)."""
        want = self.pattern.file_shape(shape)
        if not self.split:
            return want
        unit = want[0] // self.split[self.part or 0]
        return (unit * sum(self.split),) + want[1:]

    def view(self, s: Stored) -> Stored:
        """This parameter's rows of a fused file tensor ``s`` as a tensor of their own (``s`` itself if unfused)."""
        if not self.split:
            return s
        p = self.part or 0
        unit = s.shape[0] // sum(self.split)
        row = int(np.prod(s.shape[1:], dtype=np.int64)) * s.dtype.itemsize
        start = s.start + sum(self.split[:p]) * unit * row
        return dataclasses.replace(s, start=start, shape=(self.split[p] * unit,) + s.shape[1:])

    @property
    def counts(self) -> tuple[int, ...]:
        """The sizes of :attr:`index_axes`: ``hf`` is their row-major product."""
        if self.expert_axis is None:
            return (len(self.hf),) if self.stacked else ()
        return (len(self.hf) // self.experts, self.experts) if self.stacked else (self.experts,)

    @property
    def index_axes(self) -> tuple[int, ...]:
        """The parameter axes indexed by file tensor: ``layers`` (stacked), ``expert`` (per-expert tensors).

        ``hf`` lists the file tensors over these axes in row-major order (layer by layer, then expert).
        """
        return ((0,) if self.stacked else ()) + (() if self.expert_axis is None else (self.expert_axis,))


def expand(
    rows: Sequence[Any],
    option: Callable[[str], Any],
    layers: int,
    scan_layers: bool,
    names: Mapping[tuple[str, ...], tuple[str, ...]],
    experts: int = 0,
) -> tuple[list[ParamMap], list[str]]:
    """``(one ParamMap per parameter, every file tensor name in file order)`` for a model with these options.

    ``names`` are each parameter's logical axis names (its layout): a row's file axes are matched
    to them, so the pattern is a reshape when the orders agree and a transpose when they do not.
    A row whose name holds ``{e}`` is one file tensor per expert (``experts`` of them), stacked on
    the parameter's ``expert`` axis. File order is transformers': the rows before the first
    per-layer row, layer 0's rows (per-expert rows expert by expert), layer 1's, ..., the rest.
    """
    rows = [r for r in rows if "{i}" in r.hf or r.wanted(option)]
    maps: list[ParamMap] = []

    def each(r: Any, i: int | None = None) -> tuple[str, ...]:
        name = r.hf if i is None else r.hf.replace("{i}", str(i))
        return tuple(name.replace("{e}", str(e)) for e in range(experts)) if "{e}" in name else (name,)

    def add(r: Any, param: str, hf: tuple[str, ...], stacked: bool) -> None:
        path = tuple(param.split("/"))
        if path not in names:
            raise CheckpointError(f"the name map names {param}, which the model does not have")
        if "{e}" in r.hf and "expert" not in names[path]:
            raise CheckpointError(f"the name map has one tensor per expert for {param}, which has no expert axis")
        axis = names[path].index("expert") if "{e}" in r.hf else None
        dst = tuple(n for j, n in enumerate(names[path]) if j != axis and not (stacked and j == 0))
        split = tuple(int(option(n)) for n in r.split) if getattr(r, "split", None) else ()
        pattern = Pattern.parse(f"{r.axes} -> {' '.join(dst)}")
        maps.append(ParamMap(path, pattern, r.part, hf, stacked, axis, experts, split))

    def kept(r: Any, i: int) -> bool:
        return r.wanted(option, i)

    for r in rows:
        if "{layer}" not in r.param:
            add(r, r.param, each(r), False)
        elif scan_layers:
            if all(kept(r, i) for i in range(layers)):  # a scanned stack's layers are all alike
                add(r, r.param.format(layer=STACK), sum((each(r, i) for i in range(layers)), ()), True)
        else:
            for i in range(layers):
                if kept(r, i):
                    add(r, r.param.format(layer=BLOCK.format(i=i)), each(r, i), False)
    per_layer = [i for i, r in enumerate(rows) if "{i}" in r.hf]
    first, last = (per_layer[0], per_layer[-1]) if per_layer else (len(rows), len(rows) - 1)
    order = [n for r in rows[:first] for n in each(r)]
    for i in range(layers):
        here = [r for r in rows[first : last + 1] if kept(r, i)]
        fixed = [r for r in here if "{e}" not in r.hf]
        split = next((j for j, r in enumerate(here) if "{e}" in r.hf), len(here))
        per_expert = [
            r.hf.replace("{i}", str(i)).replace("{e}", str(e)) for e in range(experts) for r in here if "{e}" in r.hf
        ]
        order += (
            [n for r in fixed[:split] for n in each(r, i)] + per_expert + [n for r in fixed[split:] for n in each(r, i)]
        )
    order += [n for r in rows[last + 1 :] for n in each(r)]
    return maps, list(dict.fromkeys(order))


def lookup(name: str, stored: Mapping[str, Stored], aliases: Sequence[tuple[str, str]]) -> Stored | None:
    """The stored tensor for a canonical name, also under the family's alias prefixes."""
    if name in stored:
        return stored[name]
    for canon, alias in aliases:
        if name.startswith(canon) and alias + name[len(canon) :] in stored:
            return stored[alias + name[len(canon) :]]
    return None


def check_params(maps: Sequence[ParamMap], shapes: Mapping[tuple[str, ...], tuple[int, ...]], family: str) -> None:
    """The map names exactly the model's parameters (else the map and the model disagree: a bug, said plainly)."""
    mapped = {m.path for m in maps}
    for path in shapes:
        if path not in mapped:
            raise CheckpointError(f"parameter {'/'.join(path)} has no tensor in the {family} name map")
    for m in maps:
        if m.path not in shapes:
            raise CheckpointError(f"the {family} name map names {'/'.join(m.path)}, which the model does not have")


def layer_shape(m: ParamMap, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one file tensor of ``m``: the parameter's less its indexed axes (layers, expert)."""
    return tuple(n for j, n in enumerate(shape) if j not in m.index_axes)


def match(
    maps: Sequence[ParamMap],
    shapes: Mapping[tuple[str, ...], tuple[int, ...]],
    stored: Mapping[str, Stored],
    *,
    aliases: Sequence[tuple[str, str]] = (),
    extra: Sequence[str] = (),
    where: str = "",
) -> dict[str, Stored]:
    """Canonical file tensor name -> its stored tensor; CheckpointError for a missing, extra or misshaped one."""
    found: dict[str, Stored] = {}
    for m in maps:
        want = m.file_shape(layer_shape(m, shapes[m.path]))
        for name in m.hf:
            s = lookup(name, stored, aliases)
            if s is None:
                raise CheckpointError(
                    f"{where}: tensor {name!r} is missing (expected shape {list(want)} from config.json)"
                )
            if s.shape != want:
                raise CheckpointError(
                    f"{s.file}: tensor {s.name!r} has shape {list(s.shape)}; config.json implies {list(want)}"
                )
            found[name] = s
    used = {s.name for s in found.values()}
    for name in sorted(stored):
        if name in used or any(re.search(p, name) for p in extra):
            continue
        raise CheckpointError(
            f"{stored[name].file}: unexpected tensor {name!r}: not part of the model config.json describes"
        )
    return found


def expert_count(model: Any) -> int:
    """Experts per MoE layer (a name map's ``{e}``); 0 for a dense model."""
    return int(getattr(model, "experts", 0))


__all__ = ["expert_count", "ParamMap", "expand", "lookup", "match", "check_params", "layer_shape", "STACK", "BLOCK"]
