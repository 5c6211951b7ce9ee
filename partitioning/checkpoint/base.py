"""A step knows its base: the frozen params it refers to, by path and by the digest of their checksums.

A run that trains a subset of its params writes the frozen ones once (``frozen/<step>``,
:mod:`partitioning.checkpoint.frozen`) and every step refers to them. A path alone is not enough: a
``frozen/2`` copied in from another run would be read as this run's, one run's embeddings under another
run's adapters. So a step records, beside the path, the digest of the frozen checkpoint's checksum files
(the crc32c of every slice, :mod:`partitioning.checkpoint.checksum`, written as they were saved): cheap to
compute (a few small JSON files, hashed as bytes, never an array read), and different for any other weights.

:func:`base_damage` is what every reader asks before it trusts a step (``ckpt ls`` and ``inspect``,
``train`` resuming, ``restore_checkpoint``, ``generate``, ``export-hf --merge``): a missing base, a damaged
one or a foreign one makes the step DAMAGED, said in one line. A step saved before digests were recorded
is checked for its base's presence only.

Example::

    >>> import json, pathlib, tempfile
    >>> from partitioning.checkpoint.base import base_damage, base_digest
    >>> run = pathlib.Path(tempfile.mkdtemp()) / "checkpoints"
    >>> meta = run / "frozen" / "2" / "meta"
    >>> meta.mkdir(parents=True)
    >>> _ = (meta / "checksums.0.json").write_text('{"algorithm": "crc32c", "arrays": {"params/w": []}}')
    >>> step = {"frozen": {"dir": "frozen", "step": 2, "paths": ["w"], "digest": base_digest(meta.parent)}}
    >>> base_damage(run / "4", step) is None
    True
    >>> _ = (meta / "checksums.0.json").write_text('{"algorithm": "crc32c", "arrays": {"params/w": [1]}}')
    >>> base_damage(run / "4", step)      # another run's frozen/2 copied in
    'its frozen params .../checkpoints/frozen/2 are not the ones it was saved with (the digest of their checksums \
is ..., the step recorded ...: copied from another run?)'
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

FROZEN_KEY = "frozen"  # in a step's metadata: {"dir", "step", "paths", "digest"}
CHECKSUMS = "checksums.*.json"
BASE_DAMAGE = "its frozen params "  # how every base problem's line begins (the advice for it differs)


@functools.lru_cache(maxsize=64)
def _digest(files: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, _, _ in files:
        h.update(Path(name).name.encode() + b"\0")
        h.update(Path(name).read_bytes())
    return h.hexdigest()


def base_digest(frozen_step: Path) -> str | None:
    """The sha256 of a (frozen) checkpoint's checksum files, in order (None: it has none)."""
    files = sorted((frozen_step / "meta").glob(CHECKSUMS))
    if not files:
        return None
    try:  # keyed by name, size and time: a file rewritten in place is read again
        return _digest(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    except OSError:
        return None


def frozen_step_dir(step_dir: Path, split: Mapping[str, Any]) -> Path:
    """The frozen checkpoint a step refers to, under its checkpoints dir."""
    return Path(step_dir).parent / str(split["dir"]) / str(int(split["step"]))


def base_damage(
    step_dir: Path, meta: Mapping[str, Any], damage_of: Callable[[Path], str | None] | None = None
) -> str | None:
    """What is wrong with the frozen params a step refers to (None: nothing, or it refers to none).

    ``meta`` is the step's metadata; ``damage_of`` says what is missing from a checkpoint's own parts
    (:func:`~partitioning.checkpoint.disk.step_damage`).
    """
    split = meta.get(FROZEN_KEY)
    if not isinstance(split, Mapping):
        return None
    path = frozen_step_dir(step_dir, split)
    if not path.is_dir():
        return f"{BASE_DAMAGE}{path} are missing (written once per run, every step refers to them)"
    own = damage_of(path) if damage_of is not None else None
    if own is not None:
        return f"{BASE_DAMAGE}{path} are damaged: {own}"
    want = split.get("digest")
    got = base_digest(path) if want is not None else None
    if want is not None and got != want:
        return (
            f"{BASE_DAMAGE}{path} are not the ones it was saved with (the digest of their checksums is "
            f"{(got or 'none')[:12]}, the step recorded {str(want)[:12]}: copied from another run?)"
        )
    return None


__all__ = ["BASE_DAMAGE", "FROZEN_KEY", "base_digest", "base_damage", "frozen_step_dir"]
