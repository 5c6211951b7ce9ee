"""``checkpoint.dir`` holds checkpoints only: a folder with other files in it (the user's own) is refused
before anything is written, since a run would save steps among them and prune by name there.

A checkpoints folder holds step folders (``200/``, ``400.orbax-checkpoint-tmp-…``, ``7.superseded-…``,
``7.damaged-…``), ``_pruned/`` and ``frozen/``; hidden files are ignored. When ``checkpoint.dir`` is the run
dir itself, what a run writes there is expected too.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.config.ckptdir import foreign_entries
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "200").mkdir(); (d / "_pruned").mkdir(); (d / "6.damaged-20261127-180000").mkdir()
    >>> foreign_entries(d)
    []
    >>> _ = (d / "thesis.tex").write_text("my own file")
    >>> foreign_entries(d)
    ['thesis.tex']
"""

from __future__ import annotations

from pathlib import Path

from partitioning.checkpoint.disk import PRUNED, TMP_SUFFIX
from partitioning.checkpoint.frozen import FROZEN_DIR
from partitioning.config.rundir import PREVIOUS, RUN_GLOBS, RUN_OUTPUTS

SUPERSEDED = ".superseded-"
DAMAGED = ".damaged-"  # CheckpointManager._move_damaged


def _is_step(name: str) -> bool:
    """A step folder, or one a run set aside: ``7``, ``7<tmp suffix>…``, ``7.superseded-…``, ``7.damaged-…``."""
    head, dot, _ = name.partition(".")
    return head.isdigit() and (not dot or name.startswith((head + TMP_SUFFIX, head + SUPERSEDED, head + DAMAGED)))


def foreign_entries(directory: Path, run_dir: Path | None = None) -> list[str]:
    """The names in ``directory`` that a checkpoints folder does not hold (empty: none, or no such folder)."""
    if not directory.is_dir():
        return []
    own = {PRUNED, FROZEN_DIR}
    is_run_dir = run_dir is not None and directory.absolute() == run_dir.absolute()
    if is_run_dir:
        own |= {*RUN_OUTPUTS, PREVIOUS, "checkpoints"}
    out = []
    for p in sorted(directory.iterdir()):
        name = p.name
        if name.startswith(".") or name in own or (_is_step(name) and p.is_dir()):
            continue
        if is_run_dir and any(p.match(g) for g in RUN_GLOBS):
            continue
        out.append(name)
    return out


__all__ = ["foreign_entries"]
