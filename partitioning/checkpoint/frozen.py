"""Frozen params on disk: written once per run, referenced by every step, merged back on restore.

A run that trains a subset of its params (``train.trainable``, LoRA) does not
write the frozen ones again at every checkpoint step: they never change. The
first save writes them once, as a checkpoint of their own under the
checkpoints dir, and each step's metadata names it::

    RUN_DIR/checkpoints/
      frozen/200/             the frozen params ({"params": ...}), written at step 200, checksums and all
      200/ 400/ 600/          each step: the step counter, the trainable params, their optimizer state
                              meta/metadata: "frozen": {"dir": "frozen", "step": 200, "paths": [...],
                                                        "digest": the sha256 of frozen/200's checksums}

Restoring a step (``--resume``, ``ckpt`` commands, :func:`~partitioning.restore_checkpoint`,
``export-hf``, ``generate``) reads both and yields the FULL params tree, laid out on
the target's mesh like any checkpoint; a step whose frozen params are missing, damaged or
another run's (their checksums' digest differs from the one it recorded) is refused as damaged
(:mod:`partitioning.checkpoint.base`). A frozen checkpoint no step refers to any
more (after ``keep:`` rotation, or a run whose trainable subset changed) is deleted.

Example::

    >>> import optax, pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> from partitioning.checkpoint.frozen import frozen_ref
    >>> from partitioning.checkpoint.disk import resolve_checkpoint
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), mesh, "fsdp", batch_size=8, seq_len=16, trainable=["wo"])
    >>> state = trainer.init(jax.random.key(0))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> with pt.CheckpointManager(run / "checkpoints", rules="fsdp", frozen=trainer.frozen) as mngr:
    ...     _ = mngr.save(1, state)
    ...     _ = mngr.save(2, state)
    >>> sorted(p.name for p in (run / "checkpoints").iterdir()), frozen_ref(resolve_checkpoint(run))["step"]
    (['1', '2', 'frozen'], 1)
    >>> restored = pt.restore_checkpoint(run, pt.abstract_target(trainer.abstract_state,
    ...                                                          shardings=trainer.state_shardings))
    >>> bool((restored.params["embedding"] == state.params["embedding"]).all())    # frozen: from frozen/1
    True
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import jax

from partitioning.checkpoint.base import base_digest
from partitioning.checkpoint.disk import (
    CheckpointRef,
    flat_saved,
    list_steps,
    read_metadata,
    resolve_checkpoint,
    saved_tree,
)
from partitioning.errors import CheckpointError
from partitioning.finetune.trainable import merge_trees, split_tree

FROZEN_DIR = "frozen"  # under the checkpoints dir: a checkpoints dir of its own, one step per frozen set
META_KEY = "frozen"  # in a step's metadata: {"dir", "step", "paths", "digest"} (partitioning.checkpoint.base)


def frozen_ref(ref: CheckpointRef) -> dict[str, Any] | None:
    """The frozen params a step refers to (``{"dir", "step", "paths"}``), or None for a whole step."""
    if ref.path == ref.item:  # a bare orbax pytree: no metadata of ours
        return None
    try:
        found = read_metadata(ref).get(META_KEY)
    except (CheckpointError, OSError, ValueError):
        return None  # unreadable metadata: the restore's integrity check names the damage

    return dict(found) if isinstance(found, Mapping) else None


def frozen_path(ref: CheckpointRef, split: Mapping[str, Any]) -> Path:
    return ref.path.parent / str(split["dir"]) / str(int(split["step"]))


# -- the state, split -----------------------------------------------------------------


def _params_of(state: Any) -> Any:
    if isinstance(state, Mapping):
        return state.get("params")
    return getattr(state, "params", None)


def _with_params(state: Any, params: Any) -> Any:
    if isinstance(state, Mapping):
        return {**state, "params": params}
    return state.replace(params=params)


def split_state(state: Any, frozen: Collection[str]) -> tuple[Any, Any]:
    """(the state with only the trainable params, the frozen params); (state, None) when it has no params."""
    params = _params_of(state)
    if params is None or not frozen:
        return state, None
    own, fixed = split_tree(params, lambda p: p not in frozen)
    return _with_params(state, own), fixed


def without_frozen(target: Any, split: Mapping[str, Any]) -> Any:
    """A restore target (a state, ``{"params": ...}``, or a params tree; or None) without the frozen params."""
    if target is None:
        return None
    paths = frozenset(split["paths"])
    params = _params_of(target)
    if params is None:  # the params tree itself (params_only)
        return split_tree(target, lambda p: p not in paths)[0]
    return _with_params(target, split_tree(params, lambda p: p not in paths)[0])


# -- saving ---------------------------------------------------------------------------


def split_for_save(
    directory: Path,
    step: int,
    state: Any,
    frozen: Collection[str] | None,
    current: dict[str, Any] | None,
    save: Callable[..., Any],
    manager_kwargs: Mapping[str, Any],
) -> tuple[Any, dict[str, Any] | None]:
    """(the state to write at ``step``, the frozen params it refers to: ``current``, or written now).

    The frozen params are written once per run, synchronously, with ``save``
    (``save_checkpoint``) as ``directory/frozen/<step>``: they never change, so every
    later step refers to that copy.
    """
    own, fixed = split_state(state, frozen or ())
    if fixed is None or not frozen:
        return state, current
    if current is None or current["paths"] != sorted(frozen):
        written = save(directory / FROZEN_DIR, step, {"params": fixed}, **manager_kwargs)
        # The base's identity: the digest of its checksums (each step records it; readers compare).
        current = {"dir": FROZEN_DIR, "step": int(step), "paths": sorted(frozen), "digest": base_digest(written)}
    return own, current


def reused(directory: Path, step: int | None, frozen: Collection[str] | None) -> dict[str, Any] | None:
    """The frozen params a restored step refers to, when they are this run's ``frozen`` set (written no more)."""
    split = frozen_ref(resolve_checkpoint(directory, step)) if frozen else None
    return dict(split) if split is not None and split.get("paths") == sorted(frozen or ()) else None


def referenced(directory: Path) -> set[int]:
    """The frozen steps some step dir under ``directory`` (finished or being written) refers to."""
    out: set[int] = set()
    for s in list_steps(directory):
        ref = CheckpointRef(s.path, s.path / "state", s.step)
        with contextlib.suppress(Exception):  # a save in progress may have no metadata yet
            split = frozen_ref(ref)
            if split is not None:
                out.add(int(split["step"]))
    return out


def drop_unreferenced(directory: Path, keep: int | None) -> None:
    """Deletes the frozen checkpoints no step refers to (``keep``: the one this run writes against)."""
    base = directory / FROZEN_DIR
    if jax.process_index() != 0 or not base.is_dir():
        return
    used = referenced(directory) | ({keep} if keep is not None else set())
    for c in base.iterdir():
        if c.is_dir() and c.name.isdigit() and int(c.name) not in used:
            shutil.rmtree(c, ignore_errors=True)


# -- restoring -------------------------------------------------------------------------


def saved_arrays(ref: CheckpointRef) -> dict[str, Any]:
    """``{path: saved leaf}`` of a step with the frozen params it refers to (``params/...``)."""
    saved = flat_saved(saved_tree(ref))
    split = frozen_ref(ref)
    if split is None:
        return saved
    fixed = resolve_checkpoint(_frozen_dir(ref, split), int(split["step"]))
    return {**saved, **flat_saved(saved_tree(fixed))}


def _frozen_dir(ref: CheckpointRef, split: Mapping[str, Any]) -> Path:
    path = frozen_path(ref, split)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {ref}: its frozen params are missing: {path} (written once per run, every step refers to it)"
        )
    return ref.path.parent / str(split["dir"])


def restore_split(
    ref: CheckpointRef,
    split: Mapping[str, Any],
    target: Any,
    restore: Callable[..., Any],
    layout: Callable[..., Any],
    **kw: Any,
) -> Any:
    """A step's own arrays and its frozen params, restored with ``restore`` (``restore_checkpoint``) and merged.

    Without a ``target``, ``layout`` (``layout_target``) lays the step out on ``kw["mesh"]``.

    ``kw`` are ``restore_checkpoint``'s arguments; ``target`` as there: a whole state (a TrainState
    or a mapping with ``params``), the params alone with ``params_only``, or None (mesh + rules).
    """
    directory, fstep = _frozen_dir(ref, split), int(split["step"])
    paths = frozenset(split["paths"])
    params_only = bool(kw.pop("params_only", False))
    kw.pop("step", None)

    def fixed(params_target: Any) -> Any:
        return restore(directory, params_target, step=fstep, params_only=True, frozen=False, **kw)

    if target is None:
        if kw.get("mesh") is None:
            raise TypeError("restore_checkpoint needs a target, or a mesh (and rules) to lay the checkpoint out on")
        target, _ = layout(
            ref,
            kw["mesh"],
            kw.get("rules"),
            optimizer_rules=kw.get("optimizer_rules"),
            on_indivisible=kw.get("on_indivisible", "error"),
            unnamed="saved",
        )
        if params_only:
            target = target["params"]
    if params_only:
        wrapped = isinstance(target, Mapping) and set(target) == {"params"}
        tree = target["params"] if wrapped else target
        own_t, rest_t = split_tree(tree, lambda p: p not in paths)
        own = restore(ref.path, {"params": own_t} if wrapped else own_t, params_only=True, frozen=False, **kw)
        merged = merge_trees(own["params"] if wrapped else own, fixed(rest_t) if rest_t else None)
        return {"params": merged} if wrapped else merged
    own_t, rest_t = split_tree(_params_of(target), lambda p: p not in paths)
    own = restore(ref.path, _with_params(target, own_t), frozen=False, **kw)
    return _with_params(own, merge_trees(_params_of(own), fixed(rest_t) if rest_t else None))


__all__ = [
    "FROZEN_DIR",
    "frozen_ref",
    "frozen_path",
    "split_state",
    "without_frozen",
    "split_for_save",
    "reused",
    "drop_unreferenced",
    "referenced",
    "saved_arrays",
    "restore_split",
]
