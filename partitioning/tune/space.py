"""The search space: every layout the tuner prices for a device count.

A :class:`Candidate` is a mesh (a factorization of the devices over the axes
its rule table uses), a rule table (the presets and the config's own), ZeRO-1
(the optimizer state also split over ``data`` when ``data`` only splits the
batch), a remat policy (when the model has a ``remat`` option) and a number of
micro-batches (gradient accumulation). Candidates whose batch cannot be split
as asked are rejected here, with the reason; the rest are priced by
:mod:`partitioning.tune.search`.

Example::

    >>> cands = candidates(8, {"fsdp": Rules.preset("fsdp")}, batch_size=32, remats=("none", "full"))
    >>> len(cands), cands[0].label
    (..., 'fsdp {data: 1, fsdp: 8} remat none')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from partitioning.fmt import fmt_mesh
from partitioning.resolve import axes_tuple
from partitioning.rules import Rules

AXES = ("data", "fsdp", "tensor")
# Large dimensions only: a ZeRO-1 split that does not divide would make the train step refuse the layout.
ZERO1_RULES = [["embed", "data"], ["mlp", "data"], ["vocab", "data"]]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout: mesh, rule table, ZeRO-1, remat, micro-batches."""

    mesh: tuple[tuple[str, int], ...]
    rules_name: str
    remat: str | None = None         # None: the model has no remat option
    grad_accum: int = 1
    zero1: bool = False

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def devices(self) -> int:
        return math.prod(s for _, s in self.mesh)

    @property
    def label(self) -> str:
        parts = [self.rules_name + (" +zero1" if self.zero1 else ""), fmt_mesh(self.mesh)]
        if self.remat is not None:
            parts.append(f"remat {self.remat}")
        if self.grad_accum > 1:
            parts.append(f"x{self.grad_accum} micro-batches")
        return " ".join(parts)

    def overrides(self, rules: Rules, optimizer_rules: Rules | None) -> list[str]:
        """``--set`` overrides that turn a run config into this layout."""
        sets = ["mesh.shape={" + ", ".join(f"{a}: {s}" for a, s in self.mesh) + "}",
                f"mesh.devices={self.devices}", f"rules={_flow(rules.to_list())}",
                f"optimizer_rules={_flow(optimizer_rules.to_list()) if optimizer_rules is not None else 'null'}",
                f"train.grad_accum={self.grad_accum}"]
        if self.remat is not None:
            sets.append(f"model.remat={self.remat}")
        return sets

    def to_json(self) -> dict[str, Any]:
        return {"mesh": self.sizes, "rules": self.rules_name, "zero1": self.zero1, "remat": self.remat,
                "grad_accum": self.grad_accum, "label": self.label}


def _flow(pairs: list) -> str:
    def one(x):
        return "null" if x is None else "[" + ", ".join(one(y) for y in x) + "]" if isinstance(x, list) else str(x)
    return one(pairs)


def table_axes(rules: Rules) -> list[str]:
    """The mesh axes a rule table names, in the canonical order (data, fsdp, tensor, then others)."""
    named = {a for _, axes in rules for a in axes_tuple(axes)} | set(rules.declared_batch_axes or ())
    return [a for a in AXES if a in named] + sorted(named - set(AXES))


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every ``k``-tuple of positive integers whose product is ``n``."""
    if k == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, k - 1)]


def zero1_rules(rules: Rules) -> Rules:
    """The optimizer-state table of ZeRO-1: the params' table, with what is left split over ``data``."""
    return rules + Rules(ZERO1_RULES)


def batch_shards(rules: Rules, sizes: Mapping[str, int]) -> int:
    return math.prod(sizes.get(a, 1) for a in rules.batch_axes)


def candidates(devices: int, tables: Mapping[str, Rules], *, batch_size: int,
               remats: Sequence[str | None] = (None,), max_grad_accum: int = 16,
               rejected: list[tuple[Candidate, str]] | None = None) -> list[Candidate]:
    """Every layout of ``devices`` over the rule ``tables`` (see the module docstring).

    Layouts whose batch does not split (``batch_size / grad_accum`` not a
    multiple of the batch shards) go to ``rejected`` with the reason.
    """
    out = []
    for name, rules in tables.items():
        axes = table_axes(rules)
        if "data" not in axes:
            axes = ["data", *axes]
        for sizes_t in factorizations(devices, len(axes)):
            sizes = dict(zip(axes, sizes_t))
            mesh = tuple(sizes.items())
            shards = batch_shards(rules, sizes)
            # A table that splits nothing over `data` keeps it for the batch only: ZeRO-1 is an option.
            param_axes = {a for n, ax in rules if n != "batch" for a in axes_tuple(ax)}
            zero1s = (False, True) if sizes["data"] > 1 and "data" not in param_axes else (False,)
            g = 1
            while g <= max_grad_accum and batch_size % g == 0:
                for zero1 in zero1s:
                    for remat in remats:
                        c = Candidate(mesh, name, remat, g, zero1)
                        if (batch_size // g) % shards:
                            if rejected is not None and g == 1:
                                rejected.append((c, f"batch: {batch_size} sequences do not split over "
                                                    f"the {shards} batch shards"))
                            continue
                        out.append(c)
                g *= 2
    return out


__all__ = ["Candidate", "candidates", "factorizations", "table_axes", "zero1_rules", "batch_shards", "AXES"]
