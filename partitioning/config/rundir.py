"""The run's folders: a run dir that starts over keeps the old run whole, and ``checkpoint.dir`` holds
checkpoints only.

``partitioning train`` writes ``config.yaml``, ``metrics.jsonl``, ``loss.png``,
``tensorboard/``, ``checkpoints/`` (and ``wandb_run_id``, ``wandb/``,
``batches.*.jsonl``) into ``run_dir``. A run that starts from step 0 where a
previous run left these (``--no-resume``, or a run that stopped before its
first checkpoint) would overwrite the history and mix two runs in one
TensorBoard folder; instead they move, together, into
``RUN_DIR/previous/<time>/``. Nothing is deleted, and only the files a run
writes move (anything else in the folder stays where it is).

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.config.rundir import move_previous_run
    >>> run_dir = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run_dir / "config.yaml").write_text("rules: fsdp")
    >>> _ = (run_dir / "metrics.jsonl").write_text('{"step": 10, "loss": 2.5}')
    >>> (run_dir / "checkpoints" / "10").mkdir(parents=True)
    >>> _ = (run_dir / "notes.txt").write_text("not a run's output: it stays")
    >>> aside = move_previous_run(run_dir, run_dir / "checkpoints", log=print)
    run_dir: starting over: moved the previous run (config.yaml, metrics.jsonl, checkpoints) to /.../previous/...
    >>> sorted(p.name for p in aside.iterdir()), sorted(p.name for p in run_dir.iterdir())
    (['checkpoints', 'config.yaml', 'metrics.jsonl'], ['notes.txt', 'previous'])
    >>> move_previous_run(run_dir, run_dir / "checkpoints") is None     # nothing left to move
    True

``checkpoint.dir`` holds checkpoints only: a folder with other files in it (the user's own) is refused before
anything is written, since a run would save steps among them and prune by name there.

A checkpoints folder holds step folders (``200/``, ``400.orbax-checkpoint-tmp-…``, ``7.superseded-…``,
``7.damaged-…``), ``_pruned/`` and ``frozen/``; hidden files are ignored. When ``checkpoint.dir`` is the run
dir itself, what a run writes there is expected too.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.config.rundir import foreign_entries
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "200").mkdir(); (d / "_pruned").mkdir(); (d / "6.damaged-20261127-180000").mkdir()
    >>> foreign_entries(d)
    []
    >>> _ = (d / "thesis.tex").write_text("my own file")
    >>> foreign_entries(d)
    ['thesis.tex']
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax

from partitioning.checkpoint.disk import PRUNED, TMP_SUFFIX
from partitioning.checkpoint.frozen import FROZEN_DIR
from partitioning.errors import ConfigError

PREVIOUS = "previous"
# What a run writes into its run dir (checkpoints/ only when checkpoint.dir is the default).
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "loss.png", "tensorboard", "wandb_run_id", "wandb")
RUN_GLOBS = ("batches.*.jsonl",)


def previous_outputs(run_dir: Path, checkpoint_dir: Path) -> list[Path]:
    """The outputs of an earlier run in ``run_dir`` (its checkpoints too when they live in it)."""
    if not run_dir.is_dir():
        return []
    found = [run_dir / n for n in RUN_OUTPUTS if (run_dir / n).exists()]
    found += sorted(p for g in RUN_GLOBS for p in run_dir.glob(g))
    ckpt = checkpoint_dir.absolute()
    if ckpt.parent == run_dir.absolute() and ckpt.is_dir() and any(ckpt.iterdir()):
        found.append(run_dir / ckpt.name)
    return found


def move_previous_run(run_dir: Path, checkpoint_dir: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """Moves an earlier run's outputs into ``RUN_DIR/previous/<time>/`` (None: there were none).

    Only process 0 moves; every process returns the same folder.
    """
    found = previous_outputs(run_dir, checkpoint_dir)
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir / PREVIOUS / stamp
    n = 1
    while aside.exists():  # two starts within a second
        n += 1
        aside = run_dir / PREVIOUS / f"{stamp}-{n}"
    if jax.process_index() == 0:
        aside.mkdir(parents=True)
        for p in found:
            p.rename(aside / p.name)
    if log is not None:
        log(f"run_dir: starting over: moved the previous run ({', '.join(p.name for p in found)}) to {aside}")
    return aside


def write_file(path: Path, text: str) -> None:
    """Writes a run's file whole or not at all (a temporary file renamed over it); a full disk or a file-size
    limit is one ConfigError naming the file, and the old file (if any) stays as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        what = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}.get(
            e.errno or 0, e.strerror or str(e)
        )
        if e.errno == errno.EFBIG:
            what = "file too large (this process's file-size limit, ulimit -f)"
        raise ConfigError(f"{path}: cannot write it: {what}") from None


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


__all__ = ["write_file", "move_previous_run", "previous_outputs", "PREVIOUS", "RUN_OUTPUTS", "foreign_entries"]
