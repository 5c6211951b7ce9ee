"""Sharded checkpoints with orbax: save, resume, restore onto any mesh and rule table.

Saving goes through ``orbax.checkpoint.CheckpointManager`` (asynchronous by
default: the loop only waits for the device-to-host copy). Restoring builds the
target from the *current* mesh and rules -- ``jax.eval_shape`` of the init plus
:func:`tree_shardings` -- so orbax reads only each device's slices, whatever
layout wrote the checkpoint. The on-disk layout is plain orbax (see
:mod:`partitioning.checkpoint_meta`); nothing here is a private format.

Example::

    >>> mngr = CheckpointManager("runs/a/checkpoints", every=100, keep=3, rules=rules)
    >>> mngr.save(step, state)                     # async; returns once arrays are copied
    >>> mngr.wait()
    >>> target = abstract_target(abstract_state, new_mesh, new_rules)   # no allocation
    >>> state = restore_checkpoint("runs/a", target)   # latest complete step, resharded
    >>> params = restore_checkpoint("runs/a", abstract_target(abstract_params, mesh, rules,
    ...                             dtype=jnp.bfloat16), params_only=True)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from partitioning.boxes import is_box
from partitioning.checkpoint_meta import (
    FORMAT, META_ITEM, STATE_ITEM, TMP_SUFFIX, CheckpointRef, describe_shape, diagnose, flat_saved, mesh_json, now_iso,
    read_metadata, resolve_checkpoint, saved_tree, spec_json, versions,
)
from partitioning.errors import CheckpointError
from partitioning.rules import as_rules
from partitioning.shardings import path_str, tree_shardings


# -- restore targets ----------------------------------------------------------------

def abstract_target(
    abstract: Any,
    mesh: jax.sharding.Mesh | None = None,
    rules: Any = None,
    *,
    shardings: Any = None,
    dtype: Any = None,
    on_indivisible: str = "error",
) -> Any:
    """``jax.ShapeDtypeStruct`` leaves carrying the shardings the current mesh + rules give.

    ``abstract`` is ``jax.eval_shape`` of the init (boxed or not). Pass ``mesh``
    and ``rules``, or ``shardings`` you already have (e.g. ``trainer.state_shardings``).
    ``dtype`` casts every floating-point leaf on restore (e.g. ``jnp.bfloat16``).
    An indivisible dimension raises the same :class:`ShardingError` as at init.

    Example::

        >>> target = abstract_target(jax.eval_shape(model.init, key, x), mesh, "tp")
    """
    if shardings is None:
        if mesh is None:
            raise TypeError("abstract_target needs a mesh (and rules) or shardings")
        shardings = tree_shardings(abstract, mesh, rules, on_indivisible=on_indivisible)
    values = jax.tree.map(lambda x: x.value if is_box(x) else x, abstract, is_leaf=is_box)

    def one(a: Any, s: Any) -> jax.ShapeDtypeStruct:
        dt = jnp.dtype(a.dtype)
        if dtype is not None and jnp.issubdtype(dt, jnp.floating):
            dt = jnp.dtype(dtype)
        return jax.ShapeDtypeStruct(tuple(a.shape), dt, sharding=s)

    return jax.tree.map(one, values, shardings)


def target_like(tree: Any) -> Any:
    """A restore target with the shapes, dtypes and shardings of existing arrays."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


# -- restore --------------------------------------------------------------------------

def _check_fits(ref: CheckpointRef, saved: dict[str, Any], target: Any, partial: bool) -> None:
    """Raises a CheckpointError listing the first paths whose presence or shape differs."""
    want = {path_str(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(target)[0]}
    diffs = []
    for p, leaf in want.items():
        if p not in saved:
            diffs.append((p, f"{p}: not in the checkpoint (model {describe_shape(leaf.shape)})"))
        elif tuple(saved[p].shape) != tuple(leaf.shape):
            diffs.append((p, f"{p}: checkpoint {describe_shape(saved[p].shape)} vs model {describe_shape(leaf.shape)}"))
    if not partial:
        diffs += [(p, f"{p}: only in the checkpoint ({describe_shape(md.shape)})") for p, md in saved.items() if p not in want]
    # Parameters first: they name the model change; optimizer moments only repeat it.
    diffs = [d for _, d in sorted(diffs, key=lambda pd: not pd[0].startswith("params"))]
    if diffs:
        more = f"; … and {len(diffs) - 5} more" if len(diffs) > 5 else ""
        raise CheckpointError(
            f"checkpoint {ref} does not fit the model ({len(diffs)} of {len(want)} arrays differ): "
            + "; ".join(diffs[:5]) + more
        )


def restore_checkpoint(
    path: str | os.PathLike,
    target: Any,
    *,
    step: int | None = None,
    params_only: bool = False,
    max_inflight_bytes: int | None = None,
) -> Any:
    """Restores a checkpoint onto the shardings (and dtypes) of ``target``.

    ``path`` is a run dir or checkpoints dir (latest complete step, or ``step``),
    a step dir, or a directory written by plain ``ocp.StandardCheckpointer``.
    ``target`` comes from :func:`abstract_target`; orbax reads only the slices
    each device needs. With ``params_only``, ``target`` is the params tree (or
    ``{"params": ...}``) and only the checkpoint's ``params`` are read.
    ``max_inflight_bytes`` bounds the host buffers being read at once (default:
    256 MiB or the largest array), so peak memory stays near the state's size.

    Example::

        >>> state = restore_checkpoint("runs/a", abstract_target(trainer.abstract_state,
        ...                 shardings=trainer.state_shardings))
    """
    import orbax.checkpoint as ocp

    ref = resolve_checkpoint(path, step)
    saved = flat_saved(saved_tree(ref))
    tgt, unwrap, partial = target, False, False
    if params_only:
        partial = True
        has_params = any(p == "params" or p.startswith("params/") for p in saved)
        if isinstance(target, Mapping) and set(target) == {"params"}:
            pass
        elif has_params:
            tgt, unwrap = {"params": target}, True
        else:
            partial = False  # the checkpoint holds only params
    _check_fits(ref, saved, tgt, partial)
    restore_args = ocp.checkpoint_utils.construct_restore_args(tgt)
    if max_inflight_bytes is None:
        # orbax's default (96 GB) lets every read buffer live at once next to the
        # arrays being built: ~1.7x the state at peak. One array at a time is enough.
        largest = max((_nbytes(md) for md in saved.values()), default=0)
        max_inflight_bytes = max(256 * 2**20, largest + 2**20)
    handler = ocp.PyTreeCheckpointHandler(restore_concurrent_gb=max_inflight_bytes / 1e9)
    try:
        with ocp.Checkpointer(handler) as ckptr:
            out = ckptr.restore(ref.item, args=ocp.args.PyTreeRestore(
                item=tgt, restore_args=restore_args, partial_restore=partial))
    except Exception as e:  # orbax / tensorstore internals -> one actionable line
        raise diagnose(ref, e) from None
    return out["params"] if unwrap else out


def _nbytes(md: Any) -> int:
    n = 1
    for s in md.shape:
        n *= int(s)
    try:
        return n * jnp.dtype(md.dtype).itemsize
    except TypeError:
        return n * 8


# The short name inside this module (``from partitioning.checkpoint import restore``).
restore = restore_checkpoint


def checkpoint_metadata(path: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
    """The metadata saved with a checkpoint (``{}`` for plain orbax ones), plus ``path`` and ``step``.

    Example::

        >>> meta = checkpoint_metadata("runs/quickstart")
        >>> meta["step"], meta["mesh"]["shape"], meta["arrays"]["params/embedding"]["names"]
        (200, [1, 8, 1], ['vocab', 'embed'])
    """
    ref = resolve_checkpoint(path, step)
    meta = dict(read_metadata(ref))
    meta.setdefault("step", ref.step)
    meta["path"] = str(ref.path)
    return meta


# -- saving -------------------------------------------------------------------------------

def _names_by_path(abstract: Any) -> dict[str, list[Any]]:
    """Logical names of every boxed leaf of an abstract tree, by (unboxed) path."""
    leaves = jax.tree_util.tree_flatten_with_path(abstract, is_leaf=is_box)[0]
    out = {}
    for kp, leaf in leaves:
        names = getattr(leaf, "names", None) if is_box(leaf) else None
        if names is not None:
            out[path_str(kp)] = [n if n is None or isinstance(n, str) else list(n) for n in names]
    return out


def state_step(state: Any) -> int:
    """The (replicated) step of a train state, read from a local shard (multi-host safe)."""
    step = state["step"] if isinstance(state, Mapping) else state.step
    if isinstance(step, jax.Array):
        step = step.addressable_data(0)
    return int(step)


class CheckpointManager:
    """Saves every ``every`` steps, keeps the last ``keep`` (+ the best by eval loss), async by default.

    ``rules``, ``config`` (a mapping, e.g. ``cfg.raw``), ``model_name`` and
    ``abstract`` (the boxed ``eval_shape`` of the init, for logical names; or
    ``names``, a ``{path: names}`` mapping) are recorded in each checkpoint's
    metadata with the mesh, step and versions.
    ``keep <= 0`` keeps every checkpoint; ``every == 0`` saves only when asked
    with ``force=True``. With ``keep_best``, the checkpoint with the lowest
    ``best_metric`` (among those saved with that metric) is kept too.

    Example::

        >>> with CheckpointManager("ckpts", every=100, keep=2, rules=rules) as mngr:
        ...     for step in ...:
        ...         mngr.save(step, state, metrics={"eval_loss": 2.1})
        >>> state = mngr.restore(abstract_target(abstract, mesh, rules))
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every: int = 0,
        keep: int = 3,
        keep_best: bool = False,
        best_metric: str = "eval_loss",
        async_: bool = True,
        rules: Any = None,
        config: Mapping[str, Any] | None = None,
        model_name: str | None = None,
        abstract: Any = None,
        names: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ):
        import orbax.checkpoint as ocp
        from orbax.checkpoint import checkpoint_managers as pp

        self.directory = Path(directory).absolute()
        self.every, self.keep, self.keep_best, self.best_metric = int(every), int(keep), keep_best, best_metric
        self.async_ = async_
        self._base_meta: dict[str, Any] = {"format": FORMAT, "state_item": STATE_ITEM, "versions": versions()}
        if rules is not None:
            self._base_meta["rules"] = as_rules(rules).to_list()
        if config is not None:
            self._base_meta["config"] = dict(config)
        if model_name is not None:
            self._base_meta["model"] = model_name
        self._base_meta.update(extra or {})
        self._names = dict(names or {})
        if abstract is not None:
            self._names.update(_names_by_path(abstract))
        policies: list[Any] = [pp.LatestN(n=self.keep if self.keep > 0 else None)]
        best_fn = None
        if keep_best:
            best_fn = lambda m: float(m[best_metric])  # noqa: E731
            policies.append(pp.BestN(get_metric_fn=best_fn, reverse=True, n=1,
                                     keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies),
            best_fn=best_fn, best_mode="min",
            enable_async_checkpointing=async_,
        )
        # A save killed mid-write leaves a *.orbax-checkpoint-tmp-* directory: drop it
        # here, synchronously (orbax's own cleanup runs in a thread close() doesn't wait for).
        if jax.process_index() == 0 and self.directory.is_dir():
            for c in self.directory.iterdir():
                if TMP_SUFFIX in c.name and c.is_dir():
                    shutil.rmtree(c, ignore_errors=True)
        try:
            self._mngr = ocp.CheckpointManager(self.directory, options=options)
        except OSError as e:
            raise CheckpointError(f"{self.directory}: cannot create checkpoint directory: {e.strerror}") from None

    # -- what exists -----------------------------------------------------------
    def steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def best_step(self) -> int | None:
        return self._mngr.best_step() if self.keep_best else None

    def should_save(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    # -- save ---------------------------------------------------------------
    def _step_meta(self, step: int, state: Any, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
        meta = dict(self._base_meta, step=int(step), time=now_iso(), process_count=jax.process_count())
        if metrics:
            meta["metrics"] = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        arrays: dict[str, Any] = {}
        for kp, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            p = path_str(kp)
            entry: dict[str, Any] = {"shape": list(getattr(leaf, "shape", ())),
                                     "dtype": str(getattr(leaf, "dtype", type(leaf).__name__))}
            sharding = getattr(leaf, "sharding", None)
            if isinstance(sharding, NamedSharding):
                entry["spec"] = spec_json(sharding.spec)
                meta.setdefault("mesh", mesh_json(sharding.mesh))
            if p in self._names:
                entry["names"] = self._names[p]
            arrays[p] = entry
        meta["arrays"] = arrays
        return meta

    def save(self, step: int, state: Any, *, metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Saves ``state`` at ``step`` if due (or ``force``); False if skipped or already saved.

        Asynchronous saves return once the device-to-host copies are done, so the
        caller may hand ``state`` to a donating step right away (on the CPU orbax
        keeps zero-copy views and XLA then copies instead of donating, once).
        """
        import orbax.checkpoint as ocp

        step = int(step)
        if not force and not self.should_save(step):
            return False
        if step in self._mngr.all_steps():
            return False
        tracked = None
        if self.keep_best and metrics and _is_number(metrics.get(self.best_metric)):
            tracked = {self.best_metric: float(metrics[self.best_metric])}
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(state),
            META_ITEM: ocp.args.JsonSave(self._step_meta(step, state, metrics)),
        })
        try:
            return bool(self._mngr.save(step, args=args, metrics=tracked, force=True))
        except OSError as e:
            raise CheckpointError(f"{self.directory}/{step}: cannot write checkpoint: {e.strerror or e}") from None

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        try:
            self._mngr.wait_until_finished()
        except OSError as e:
            raise CheckpointError(f"{self.directory}: a checkpoint write failed: {e.strerror or e}") from None

    def close(self) -> None:
        self.wait()
        self._mngr.close()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- restore ------------------------------------------------------------
    def restore(self, target: Any, step: int | None = None, *, params_only: bool = False) -> Any:
        """:func:`restore_checkpoint` of this directory's latest (or ``step``) checkpoint."""
        self.wait()
        return restore_checkpoint(self.directory, target, step=step, params_only=params_only)

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        self.wait()
        return checkpoint_metadata(self.directory, step)


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def save_checkpoint(directory: str | os.PathLike, step: int, state: Any, **manager_kwargs: Any) -> Path:
    """Writes one checkpoint synchronously (same layout as the manager); returns its step dir.

    Example::

        >>> save_checkpoint("exported", int(state.step), state, rules=rules)   # exported/STEP/
    """
    with CheckpointManager(directory, async_=False, keep=0, **manager_kwargs) as mngr:
        mngr.save(step, state, force=True)
    return Path(directory).absolute() / str(int(step))


# -- training-loop hook -------------------------------------------------------------------

class CheckpointHook:
    """Loop hook: resume on start, save every K steps, save on exit (done / Ctrl-C / SIGTERM).

    ``target`` is the restore target (:func:`abstract_target` of the trainer's
    abstract state); without it, the state given to ``on_start`` provides the
    shapes and shardings and its buffers are freed before reading (as donation
    would), so a resume never holds two states.

    Example::

        >>> hook = CheckpointHook(CheckpointManager(run_dir / "checkpoints", every=100))
        >>> state = hook.initial_state(trainer, jax.random.key(0))   # restore or init
        >>> fit(trainer, state, batches, hooks=[hook])
    """

    def __init__(self, manager: CheckpointManager, *, target: Any = None, resume: bool = True,
                 save_on_exit: bool = True, free_init: bool = True, log: Any = None):
        self.manager, self.target, self.resume = manager, target, resume
        self.save_on_exit, self.free_init = save_on_exit, free_init
        self.log = log or (lambda msg: None)
        self.restored_step: int | None = None
        self._started = False
        self._last_metrics: tuple[int, Mapping[str, Any]] | None = None

    def initial_state(self, trainer: Any, rng: Any) -> Any:
        """Restores the latest checkpoint onto the trainer's layout if resuming, else ``trainer.init``."""
        if self.resume and self.manager.latest_step() is not None:
            target = self.target or abstract_target(trainer.abstract_state, shardings=trainer.state_shardings)
            return self._restore(target)
        self._started = True
        return trainer.init(rng)

    def _restore(self, target: Any) -> Any:
        state = self.manager.restore(target)
        self.restored_step = state_step(state)
        self._started = True
        self.log(f"checkpoint: resumed from step {self.restored_step} ({self.manager.directory})")
        return state

    def on_start(self, state: Any) -> Any:
        if self._started or not self.resume or self.manager.latest_step() is None:
            self._started = True
            return state
        target = self.target or target_like(state)
        if self.free_init:
            for x in jax.tree.leaves(state):
                if isinstance(x, jax.Array) and not x.is_deleted():
                    x.delete()
        return self._restore(target)

    def on_step_end(self, step: int, state: Any, metrics: Mapping[str, Any] | None = None) -> None:
        if metrics is not None:
            self._last_metrics = (int(step), metrics)   # for a save on exit at this step
        if self.manager.should_save(int(step)):
            self.manager.save(int(step), state, metrics=metrics, force=True)

    def on_exit(self, state: Any, reason: str = "done") -> None:
        try:
            leaves = jax.tree.leaves(state) if state is not None else []
            # A step interrupted after donating its input leaves nothing to save.
            alive = leaves and not any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves)
            if self.save_on_exit and alive:
                step = state_step(state)
                last = self._last_metrics
                metrics = last[1] if last is not None and last[0] == step else None
                if self.manager.save(step, state, metrics=metrics, force=True):
                    self.log(f"checkpoint: saved step {step} to {self.manager.directory} ({reason})")
        finally:
            self.manager.close()


__all__ = [
    "CheckpointManager", "CheckpointHook", "abstract_target", "target_like", "restore_checkpoint", "restore",
    "checkpoint_metadata",
    "save_checkpoint", "state_step",
]
