"""Output folders and PNG files a user names, checked before anything is written: one message per mistake,
shared by the CLI and the Python API (``ckpt export-hf OUT_DIR``, ``save_hf``, ``save_peft``, checkpoint directories,
a run's ``run_dir``), so both say the same thing and a refused call leaves nothing on disk.

Example::

    >>> import os, tempfile
    >>> from partitioning.outdir import check_out_dir
    >>> notes = os.path.join(tempfile.mkdtemp(), "notes.txt"); _ = open(notes, "w").write("x")
    >>> check_out_dir(os.path.join(notes, "adapter"), "out_dir")
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: .../notes.txt/adapter: cannot make this folder: .../notes.txt is a file
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from partitioning.errors import CheckpointError, ConfigError


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The existing file at ``path`` or above it that keeps ``path`` from being a folder (None: nothing does).

    Walks the path as given (``a/b/c``: ``a/b/c``, ``a/b``, ``a``), so the answer is named as the user named it.
    """
    p = Path(path)
    while True:
        if p.exists():
            return None if p.is_dir() else p
        if p.is_symlink():  # a dangling link cannot be made a folder either
            return p
        if p.parent == p or str(p.parent) in ("", "."):
            return None
        p = p.parent


def check_out_dir(
    out: str | os.PathLike,
    what: str,
    *,
    force: str | None = None,
    replaceable: Callable[[Path], bool] | None = None,
    kind: str = "",
) -> None:
    """``out`` can be written as a new folder: it is not a file, not under one, and is empty or absent.

    ``force`` names the switch that allows replacing a non-empty folder (``--force``); ``replaceable`` says a
    non-empty folder holds what this call replaces (an earlier save), ``kind`` (``a PEFT adapter``).
    """
    out = Path(out)
    blocker = file_in_the_way(out)
    if blocker == out:
        allowed = f"new, empty, or replaced with {force}" if force else f"new, empty{kind and ', or holding ' + kind}"
        raise CheckpointError(f"{out}: is a file; {what} must be a folder ({allowed})", arg=what)
    if blocker is not None:
        raise CheckpointError(f"{out}: cannot make this folder: {blocker} is a file", arg=what)
    if out.is_dir() and any(out.iterdir()) and not (replaceable is not None and replaceable(out)):
        instead = (
            f" or pass {force} to replace it" if force else f", an empty one or one holding {kind}" if kind else ""
        )
        raise CheckpointError(f"{out}: exists and is not empty; choose a new folder{instead}", arg=what)


@contextlib.contextmanager
def folders_undone_on_failure(folder: str | os.PathLike, enabled: bool = True) -> Iterator[None]:
    """On an exception inside the block, removes the folders up to ``folder`` that did not exist before it
    and are empty again (innermost first): a failed write leaves no empty folder tree of its own making."""
    p = Path(folder)
    made = [f for f in (p, *p.parents) if not f.exists()] if enabled else []
    try:
        yield
    except BaseException:
        for f in made:
            if f.is_dir() and not any(f.iterdir()):
                f.rmdir()
        raise


def save_figure(fig: Any, path: str | Path) -> Path:
    """Writes a matplotlib Figure as PNG, creating the folder; a path that is a folder, under a file or not
    ``*.png`` is refused before anything is written.

    Example::

        >>> import pathlib, tempfile
        >>> from matplotlib.figure import Figure
        >>> from partitioning.outdir import save_figure
        >>> fig = Figure()
        >>> _ = fig.subplots().plot([1, 2, 3])
        >>> save_figure(fig, pathlib.Path(tempfile.mkdtemp()) / "new" / "plan.png").exists()   # folder created
        True
    """
    path = Path(path)
    if path.is_dir() or path.suffix.lower() != ".png":
        raise ConfigError(f"{path}: {'a folder' if path.is_dir() else 'not a .png'}; name a .png file", arg="png")
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise ConfigError(f"{path}: cannot write the PNG: {blocker} is a file, not a folder", arg="png")
    try:
        with folders_undone_on_failure(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the PNG: {e.strerror or e}", arg="png") from None
    return path


__all__ = ["check_out_dir", "file_in_the_way", "folders_undone_on_failure", "save_figure"]
