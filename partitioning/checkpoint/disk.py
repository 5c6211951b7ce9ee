"""Checkpoints on disk: layout, discovery, metadata, and damage diagnosis.

A toolkit checkpoint is a plain orbax ``CheckpointManager`` step directory::

    RUN_DIR/checkpoints/            (checkpoint.dir)
      200/                          one step, written atomically by orbax
        state/                      the train state pytree (orbax StandardSave / OCDBT)
        meta/metadata               JSON: step, rules, mesh, config, versions, per-array layout
        _CHECKPOINT_METADATA        orbax's own step metadata
      400.orbax-checkpoint-tmp-…    a save in progress (or killed): never read

Everything here only *reads*: it finds a checkpoint from a run dir, a
checkpoints dir, a step dir or a bare orbax pytree directory (what
``ocp.StandardCheckpointer().save(path, tree)`` writes), lists steps and reads
the metadata; failures go through :mod:`partitioning.checkpoint.diagnose`.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
    >>> from partitioning.checkpoint.disk import read_metadata, resolve_checkpoint
    >>> ref = resolve_checkpoint(run)        # a run dir: its latest complete step
    >>> ref.step, read_metadata(ref)["rules"][0]
    (10, ['batch', ['data', 'fsdp']])
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.path import step as step_lib

from partitioning.checkpoint.advice import STEP_FLAG, damaged_error, good_steps_before, step_flag
from partitioning.checkpoint.base import base_damage
from partitioning.checkpoint.diagnose import diagnose, verify
from partitioning.errors import CheckpointError
from partitioning.fmt import fmt_mesh, fmt_spec
from partitioning.layout import path_str

STATE_ITEM = "state"  # the item holding the train state (or params) pytree
META_ITEM = "meta"  # the JSON item holding the toolkit's metadata
DEFAULT_ITEM = "default"  # what a plain orbax CheckpointManager names a single unnamed item
META_FILE = "metadata"  # orbax JsonSave's file name inside the item directory
FORMAT = "partitioning.checkpoint/1"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
# Pruned steps are first renamed (atomically) into this folder, then deleted: a step is either
# whole where `ls` looks, or gone from there.
PRUNED = "_pruned"


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint on disk: ``path`` (what the user names), ``item`` (the pytree dir)."""

    path: Path
    item: Path
    step: int | None

    @property
    def meta_file(self) -> Path:
        return self.path / META_ITEM / META_FILE

    def __str__(self) -> str:
        return str(self.path)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A step directory under a checkpoints dir, finished or not."""

    step: int
    path: Path
    complete: bool
    nbytes: int
    mtime: float
    damage: str | None = None  # finalized by orbax but with a part missing: never restored, never "complete"

    @property
    def finalized(self) -> bool:
        """Orbax finished this save (complete, or damaged since)."""
        return self.complete or self.damage is not None


def _is_pytree_dir(p: Path) -> bool:
    return (p / "_METADATA").is_file() or (p / "manifest.ocdbt").is_file() or any(p.glob("ocdbt.process_*"))


def _step_of(name: str) -> int | None:
    head = name.split(TMP_SUFFIX, 1)[0]
    return int(head) if head.isdigit() else None


def dir_bytes(p: Path) -> int:
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):  # removed under us (a save finishing or old step deleted)
                total += os.path.getsize(os.path.join(root, f))
    return total


def checkpoints_dir(path: str | os.PathLike) -> Path:
    """``RUN_DIR/checkpoints`` when ``path`` is a run dir holding one, else ``path``."""
    p = Path(path)
    sub = p / "checkpoints"
    if sub.is_dir() and not any(_step_of(c.name) is not None for c in p.iterdir() if c.is_dir()):
        return sub
    return p


def _finalized(step_dir: Path) -> bool:
    try:
        return bool(step_lib.is_checkpoint_finalized(step_dir))
    except Exception:  # an unreadable directory is not a finished save
        return False


def is_complete(step_dir: Path) -> bool:
    """A step orbax finalized with all its parts there (:func:`step_damage`): a partly deleted step is not."""
    return _finalized(step_dir) and step_damage(step_dir) is None


CHECKSUM_GLOB = "checksums.*.json"


def step_damage(step_dir: Path, base: bool = True) -> str | None:
    """What is missing from a finalized toolkit step (None: all its parts are there), read from names only.

    A toolkit step has ``state/_METADATA``, ``meta/metadata`` and one ``meta/checksums.<process>.json`` per
    saving process: a step is complete only with its checksums written, so missing integrity data is damage.
    A plain orbax step (no ``meta`` item) needs only its pytree's ``_METADATA``. With ``base``, the frozen
    params a step refers to must be there and be the ones it was saved with (:mod:`partitioning.checkpoint.base`).
    """
    state, meta = step_dir / STATE_ITEM, step_dir / META_ITEM
    if not meta.is_dir():  # plain orbax: one pytree item, or the pytree itself
        for item in (state, step_dir / DEFAULT_ITEM):
            if item.is_dir():
                return None if (item / "_METADATA").is_file() else f"missing file {item / '_METADATA'}"
        return None if (step_dir / "_METADATA").is_file() else f"missing directory {state}"
    if not state.is_dir():
        return f"missing directory {state}"
    if not (state / "_METADATA").is_file():
        return f"missing file {state / '_METADATA'}"
    if any(state.glob("ocdbt.process_*")) and not (state / "manifest.ocdbt").is_file():
        return f"missing file {state / 'manifest.ocdbt'}"  # the OCDBT root: without it no array can be found
    if not (meta / META_FILE).is_file():
        return f"missing file {meta / META_FILE}"
    try:
        recorded = json.loads((meta / META_FILE).read_text())
        processes = int(recorded.get("process_count", 1))
    except (ValueError, OSError, AttributeError, TypeError):
        return f"damaged file {meta / META_FILE} (not valid JSON; truncated?)"
    for i in range(max(processes, 1)):
        f = meta / CHECKSUM_GLOB.replace("*", str(i))
        if not f.is_file():
            return f"missing file {f} (the step's checksums)"
    return base_damage(step_dir, recorded, lambda d: step_damage(d, base=False)) if base else None


def list_steps(path: str | os.PathLike, base: bool = True) -> list[StepInfo]:
    """Every step directory, finished or in progress, sorted by step (then finished last). ``base``: a step
    whose frozen params are missing or foreign is damaged (:func:`step_damage`)."""
    d = checkpoints_dir(path)
    if not d.is_dir():
        raise CheckpointError(f"{d}: {'a file, not a' if d.is_file() else 'no such'} checkpoint directory")
    out = []
    for c in d.iterdir():
        step = _step_of(c.name)
        if step is None or not c.is_dir():
            continue
        damage = None
        finalized = TMP_SUFFIX not in c.name and _finalized(c)
        if finalized:
            damage = step_damage(c, base)
        try:
            mtime = c.stat().st_mtime
        except OSError:
            continue
        if damage is not None and not c.exists():
            continue  # removed while it was read (pruned): not damage
        out.append(StepInfo(step, c, finalized and damage is None, dir_bytes(c), mtime, damage))
    return sorted(out, key=lambda s: (s.step, s.complete))


def resolve_checkpoint(path: str | os.PathLike, step: int | None = None, *, base: bool = True) -> CheckpointRef:
    """Finds the checkpoint ``path`` names: a step dir, a pytree dir, or the latest (or ``step``) of a run.

    ``base=False``: a step whose frozen params are missing or foreign still resolves (its own arrays are whole)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint (expected a run dir, a checkpoints dir or a step dir)")
    if TMP_SUFFIX in p.name:
        raise CheckpointError(f"{p}: this save never finished (orbax temporary directory); use a complete step")
    for item in (STATE_ITEM, DEFAULT_ITEM):
        if (p / item).is_dir():
            return CheckpointRef(p, p / item, _step_of(p.name))
    if _is_pytree_dir(p):
        parent = p.parent
        if p.name in (STATE_ITEM, DEFAULT_ITEM) and _step_of(parent.name) is not None:
            return CheckpointRef(parent, p, _step_of(parent.name))
        return CheckpointRef(p, p, _step_of(p.name))
    if (p / "_CHECKPOINT_METADATA").exists() or (p / META_ITEM).is_dir():
        raise CheckpointError(f"{p}: damaged checkpoint: missing directory {p / STATE_ITEM}")
    steps = list_steps(p, base)
    finalized = [s for s in steps if s.finalized]
    done = [s for s in steps if s.complete]
    if not finalized:
        pending = ", ".join(s.path.name for s in steps) or "none"
        raise CheckpointError(f"{checkpoints_dir(p)}: no complete checkpoint (unfinished saves: {pending})")
    # The latest finished save, never silently an earlier one: a damaged latest step is refused.
    for s in finalized[::-1] if step is None else [s for s in finalized if s.step == step]:
        if s.damage is not None:
            raise damaged_error(s, steps)
        return resolve_checkpoint(s.path)
    raise CheckpointError(
        f"{checkpoints_dir(p)}: no complete checkpoint for step {step} (steps: {', '.join(str(s.step) for s in done)})"
    )


def read_metadata(ref: CheckpointRef) -> dict[str, Any]:
    """The toolkit's JSON metadata, or ``{}`` for a checkpoint written by plain orbax."""
    f = ref.meta_file
    if not f.exists():
        if ref.path != ref.item and (ref.path / META_ITEM).is_dir():
            raise CheckpointError(f"checkpoint {ref}: missing file {f}")
        return {}
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint {ref}: damaged file {f} (not valid JSON; truncated?)") from None


# -- the saved tree ----------------------------------------------------------------


def saved_tree(ref: CheckpointRef) -> Any:
    """The saved pytree as orbax metadata leaves (shape, dtype, sharding), without reading data."""
    meta_file = ref.item / "_METADATA"
    if not meta_file.exists():
        raise CheckpointError(f"checkpoint {ref}: missing file {meta_file}")
    try:
        # orbax reports an unreadable _METADATA as "no metadata": check it ourselves.
        json.loads(meta_file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint {ref}: damaged file {meta_file} (not valid JSON; truncated?)") from None
    try:
        # orbax finds no metadata under a relative path: hand it the absolute one (messages keep the user's).
        md = ocp.PyTreeCheckpointer().metadata(ref.item.resolve())
    except Exception as e:  # orbax internals: never leak them for bad input
        raise diagnose(ref, e) from None
    tree = getattr(md, "item_metadata", md)
    tree = getattr(tree, "tree", tree)
    if tree is None:
        found = verify(ref)
        raise CheckpointError(f"checkpoint {ref}: {found[0] if found else f'cannot read {meta_file}'}")
    return tree


def is_saved_leaf(x: Any) -> bool:
    """True for an orbax metadata leaf (it has a shape and a dtype)."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def flat_saved(tree: Any) -> dict[str, Any]:
    """``{path: metadata leaf}`` in saving order."""
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_saved_leaf)[0]
    return {path_str(kp): leaf for kp, leaf in leaves}


def sharding_str(md: Any) -> str:
    """A short description of a saved leaf's sharding: ``P('fsdp', None) on {fsdp: 8}``."""
    s = getattr(md, "sharding", None)
    if s is None:
        return "-"
    spec = getattr(s, "partition_spec", None)
    if spec is not None:
        names = getattr(s, "axis_names", None) or []
        shape = getattr(s, "shape", None)
        sizes = zip(names, np.asarray(shape).tolist(), strict=True) if shape is not None else []
        return (
            f"{fmt_spec(tuple(None if a is None else a if isinstance(a, str) else tuple(a) for a in spec))} "
            f"on {fmt_mesh(list(sizes))}"
        )
    device = getattr(s, "device_str", None)
    return f"single device {device}" if device else type(s).__name__


def saved_mesh_str(saved: dict[str, Any]) -> str:
    """The mesh a plain orbax checkpoint was saved from, read off its first NamedSharding."""
    for md in saved.values():
        text = sharding_str(md)
        if " on {" in text:
            return text.split(" on ", 1)[1]
    return "(unknown)"


def set_aside_after(directory: Path, step: int) -> list[str]:
    """Moves every step directory after ``step`` aside (``N.superseded-TIME``, process 0); what moved, said."""
    moved = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for s in list_steps(directory) if directory.is_dir() else []:
        if s.step > step and TMP_SUFFIX not in s.path.name:
            aside = directory / f"{s.step}.superseded-{stamp}"
            if jax.process_index() == 0:
                s.path.rename(aside)
            moved.append(f"step {s.step} to {aside}")
    return moved


def drop_tmp_dirs(directory: Path) -> None:
    """Removes every unfinished save's temporary directory (process 0; only when no save is in flight)."""
    if jax.process_index() == 0 and directory.is_dir():
        for c in directory.iterdir():
            if TMP_SUFFIX in c.name and c.is_dir():
                shutil.rmtree(c, ignore_errors=True)


def drop_pruned(directory: Path, final: bool = False) -> None:
    """Deletes the steps orbax pruned (renamed into PRUNED); each entry, so a rename in flight is safe.
    ``final``: nothing is in flight (the manager is closed), so the empty folder goes too."""
    pruned = directory / PRUNED
    if jax.process_index() == 0 and pruned.is_dir():
        for c in list(pruned.iterdir()):
            shutil.rmtree(c, ignore_errors=True)
        if final:
            with contextlib.suppress(OSError):
                pruned.rmdir()


__all__ = [
    "set_aside_after",
    "drop_tmp_dirs",
    "drop_pruned",
    "CheckpointRef",
    "StepInfo",
    "STATE_ITEM",
    "META_ITEM",
    "META_FILE",
    "FORMAT",
    "TMP_SUFFIX",
    "PRUNED",
    "is_complete",
    "step_damage",
    "damaged_error",
    "good_steps_before",
    "step_flag",
    "STEP_FLAG",
    "checkpoints_dir",
    "list_steps",
    "resolve_checkpoint",
    "read_metadata",
    "saved_tree",
    "flat_saved",
    "sharding_str",
    "saved_mesh_str",
    "dir_bytes",
    "is_saved_leaf",
]
