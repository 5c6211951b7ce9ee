"""Option checks the reference models run on construction, so a bad value is one line at its config key.

Each check raises a :class:`~partitioning.ConfigError` whose ``arg`` is the
option, which the config build step turns into ``file:line: model.option: ...``
instead of a ``ZeroDivisionError`` or a broadcasting error deep in the model.

Example::

    >>> from partitioning.models import GPT
    >>> GPT(heads=0)
    Traceback (most recent call last):
    ...
    partitioning.errors.ConfigError: heads must be a positive integer, got 0
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp

from partitioning.errors import ConfigError, did_you_mean


def positive(module: Any, *names: str) -> None:
    """Each named option, if set, is an integer >= 1."""
    for name in names:
        v = getattr(module, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{name} must be a positive integer, got {v!r}", arg=name)


def choice(module: Any, name: str, choices: Iterable[str]) -> None:
    """The option is one of ``choices``."""
    choices = list(choices)
    v = getattr(module, name)
    if v not in choices:
        raise ConfigError(
            f"{name} must be one of {', '.join(choices)}, got {v!r}{did_you_mean(str(v), choices)}", arg=name
        )


FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def float_dtype(module: Any, *names: str) -> None:
    """Each named option names a floating-point dtype."""
    for name in names:
        v = getattr(module, name)
        try:
            ok = jnp.issubdtype(jnp.dtype(v), jnp.floating)
        except TypeError:
            ok = False
        if not ok:
            raise ConfigError(
                f"{name} must be a floating-point dtype ({', '.join(FLOAT_DTYPES)}), got {v!r}"
                f"{did_you_mean(str(v), FLOAT_DTYPES)}",
                arg=name,
            )


def divides(module: Any, small: str, big: str, small_value: int | None = None) -> None:
    """``big`` is a multiple of ``small``."""
    s = getattr(module, small) if small_value is None else small_value
    b = getattr(module, big)
    if s and b % s:
        raise ConfigError(f"{big} ({b}) must be a multiple of {small} ({s})", arg=small)


__all__ = ["positive", "choice", "float_dtype", "divides", "FLOAT_DTYPES"]
