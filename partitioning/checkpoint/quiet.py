"""Stray noise after a failed checkpoint read: filtered, so the failure stays one line.

When orbax gives up on a damaged file it closes its event loop while other
tensorstore reads are still in flight; each one that finishes later reports
``RuntimeError: Event loop is closed`` (a traceback apiece) through
:data:`sys.unraisablehook`, after the toolkit has already raised the one
:class:`~partitioning.errors.CheckpointError` that says what is wrong. The CLI
installs the filter at start; a Python restore installs it when it fails.

Example::

    >>> import sys
    >>> from partitioning.checkpoint.quiet import ignore_stray_reads
    >>> ignore_stray_reads(); hook = sys.unraisablehook
    >>> ignore_stray_reads(); sys.unraisablehook is hook   # installed once
    True
"""

from __future__ import annotations

import sys
from typing import Any

_installed: list[Any] = []


def _stray(u: Any) -> bool:
    if isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value):
        return True
    return "coroutine" in repr(u.object) and "orbax" in repr(getattr(u.object, "cr_code", ""))


def ignore_stray_reads() -> None:
    """Drops the unraisable reports of reads that finish on orbax's closed loop; passes every other one on."""
    if _installed and sys.unraisablehook is _installed[0]:
        return
    previous = sys.unraisablehook

    def hook(u: Any) -> None:
        if not _stray(u):
            previous(u)

    _installed[:] = [hook]
    sys.unraisablehook = hook


__all__ = ["ignore_stray_reads"]
