"""How the toolkit writes values for people: bytes, specs, shapes, meshes, rules.

One copy of each, so a table, a warning and an error print the same thing the
same way.

Example::

    >>> from jax.sharding import PartitionSpec as P
    >>> from partitioning.fmt import fmt_bytes, fmt_mesh, fmt_spec
    >>> fmt_bytes(3 * 2**30), fmt_spec(P("fsdp", None)), fmt_mesh({"data": 2, "fsdp": 4})
    ('3.00 GiB', "P('fsdp', None)", '{data: 2, fsdp: 4}')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: float) -> str:
    """``1.50 GiB`` style, binary units, two decimals (whole bytes below 1 KiB)."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)B?\s*$", re.IGNORECASE)


def parse_bytes(value: Any) -> int:
    """Sizes as people write them, ``80GiB``, ``80 GB``, ``512MiB`` or a number of bytes -> bytes (``GiB``
    binary, ``GB`` decimal): the inverse of :func:`fmt_bytes`."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 80GiB")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"expected a size such as 80GiB or 16GB, got {value!r}")
    number, unit, binary = m.groups()
    power = "KMGTP".find(unit.upper()) + 1 if unit else 0
    return int(float(number) * ((1024 if binary else 1000) ** power))


def fmt_spec(spec: Any) -> str:
    """``P('fsdp', None)``: a PartitionSpec as JAX prints it (``-`` for none)."""
    if spec is None:
        return "-"
    if not isinstance(spec, PartitionSpec):
        spec = PartitionSpec(*spec)
    return str(spec)


def fmt_shape(shape: Sequence[int]) -> str:
    """``(80, 8192)`` and ``(64,)``: a shape as Python writes a tuple."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def fmt_mesh(sizes: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> str:
    """``{data: 2, fsdp: 4}``: mesh axes and sizes in order."""
    items = sizes.items() if isinstance(sizes, Mapping) else sizes
    return "{" + ", ".join(f"{n}: {s}" for n, s in items) + "}"


def fmt_axes(axes: Any) -> str:
    """A rule's mesh axes: ``fsdp``, ``data/fsdp`` or ``null``."""
    if axes is None:
        return "null"
    if isinstance(axes, str):
        return axes
    return "/".join(axes)


def fmt_rule(rule: Sequence[Any]) -> str:
    """``[embed, fsdp]``, ``[batch, [data, fsdp]]``, ``[lora, null]``: one rule as a rule table's YAML writes it.

    Example::

        >>> from partitioning.fmt import fmt_rule
        >>> fmt_rule(("batch", ("data", "fsdp"))), fmt_rule(["lora", None])
        ('[batch, [data, fsdp]]', '[lora, null]')
    """
    name, axes = rule[0], rule[1]
    if axes is None or isinstance(axes, str):
        return f"[{name}, {'null' if axes is None else axes}]"
    if isinstance(axes, (list, tuple)):
        return f"[{name}, [{', '.join(axes)}]]"
    return f"[{name}, unconstrained]"  # PartitionSpec.UNCONSTRAINED (set from Python only)


def fmt_rules(rules: Iterable[Sequence[Any]] | None) -> str:
    """``[batch, [data, fsdp]], [embed, fsdp]``: a rule table on one line, in the notation of :func:`fmt_rule`."""
    rules = list(rules or [])
    return ", ".join(map(fmt_rule, rules)) if rules else "(none)"


__all__ = ["parse_bytes", "fmt_bytes", "fmt_spec", "fmt_shape", "fmt_mesh", "fmt_axes", "fmt_rule", "fmt_rules"]
