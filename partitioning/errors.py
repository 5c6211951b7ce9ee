"""The PartitioningError hierarchy.

User mistakes (bad config, bad rule, indivisible shape, a checkpoint that does
not fit) raise a subclass of :class:`PartitioningError` whose message a person
can act on. The CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class PartitioningError(Exception):
    """Base class of every user-facing error of the toolkit.

    ``arg`` optionally names the function argument that was wrong (e.g.
    ``"batch_size"``), so a caller that got it from a config key can point at
    that key's file and line without parsing the message.
    """

    def __init__(self, *args: object, arg: str | None = None):
        super().__init__(*args)
        self.arg = arg


class RuleError(PartitioningError, ValueError):
    """A rule table is malformed or does not fit the mesh or the model."""


class MeshError(PartitioningError, ValueError):
    """A mesh shape does not fit the devices, or names an axis twice."""


class ShardingError(PartitioningError, ValueError):
    """A parameter cannot be laid out as the rules ask (e.g. indivisible)."""


class ConfigError(PartitioningError, ValueError):
    """A config file is malformed; the message names file, line and key."""


class ModelError(PartitioningError):
    """The model's own code failed while it was traced (init or forward pass): one line saying where and why.

    The original exception is its ``__cause__``.
    """


class CheckpointError(PartitioningError):
    """A checkpoint is missing, damaged, or does not fit the model."""


class DataError(PartitioningError, ValueError):
    """The training data cannot be read or is too small for the batch."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Returns "; did you mean 'x'?" for the closest choice, or ''."""
    choices = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called from the toolkit, point at the user's line: the
    first frame outside this package and jax, flax and optax (a warning raised deep in a rule walk or a jit
    trace would otherwise name a library line the user cannot act on).

    Example::

        >>> from partitioning.errors import user_stacklevel
        >>> user_stacklevel() >= 2
        True
    """
    import os
    import sys

    roots = [os.path.dirname(os.path.abspath(__file__)) + os.sep]
    for name in ("jax", "jaxlib", "flax", "optax"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            roots.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    internal = ("contextlib.py", "functools.py")
    frame: Any = sys._getframe(1)  # the frame about to warn is level 1
    level = 1
    while frame is not None:
        f = os.path.abspath(frame.f_code.co_filename)
        if not (f.startswith(tuple(roots)) or f.endswith(internal)):
            break
        frame, level = frame.f_back, level + 1
    return max(2, level)
