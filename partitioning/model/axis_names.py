"""Models written for ``pmap`` under GSPMD: their collective axis names (``'batch'``) bound as size-1 axes.

Example::

    >>> from partitioning.model.axis_names import bind_named_axes
    >>> names = []
    >>> jax.jit(lambda x: bind_named_axes(lambda: jax.lax.pmean(x, "batch"), names))(jnp.ones(3)), names
    (Array([1., 1., 1.], dtype=float32), ['batch'])
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

_UNBOUND = re.compile(r"unbound axis name: ([^\s.]+)")


def bind_named_axes(fn: Callable[[], Any], names: list[str]) -> Any:
    """Runs ``fn()`` with pmap-era collective axis names bound (size 1), learning missing ones.

    Models written for ``pmap`` reduce over a named axis (``BatchNorm(axis_name='batch')``,
    ``lax.pmean(x, 'batch')``). Under GSPMD a reduction over the batch dimension
    already spans the global batch, so binding the name to a size-1 ``vmap``
    axis computes the same statistics. ``names`` grows with every unbound name
    a trace reports, so later traces bind them at once.
    """

    def run(bound: list[str]) -> Any:
        g = fn
        for name in bound:
            g = functools.partial(_size_one_axis, g, name)
        return g()

    for _ in range(8):
        try:
            return run(list(names))
        except NameError as e:
            m = _UNBOUND.search(str(e))
            if m is None or m.group(1) in names:
                raise
            names.append(m.group(1))
    return run(list(names))


def _size_one_axis(fn: Callable[[], Any], name: str) -> Any:
    out = jax.vmap(lambda _: fn(), axis_name=name)(jnp.zeros((1,)))
    return jax.tree.map(lambda x: x[0], out)


__all__ = ["bind_named_axes"]
