"""Saving sharded checkpoints with orbax: every N steps, keep the last K (and the best), async.

Saving goes through ``orbax.checkpoint.CheckpointManager`` (asynchronous by
default: the loop only waits for the device-to-host copy). Each step is a
plain orbax step directory (see :mod:`partitioning.checkpoint.disk`) with a
``state`` item (an orbax PyTree, what ``StandardSave`` writes) and a ``meta``
item (JSON: step, rules, mesh, config, versions, per-array logical names and specs).

Arrays are written uncompressed by default. Orbax's default (zstd on every
chunk) made restores ~4x slower on a 2-core host, where decoding costs more CPU than reading the bytes,
while weights and optimizer moments shrink by only ~8% (mantissas are noise). ``compress=True`` brings it back.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> mngr = pt.CheckpointManager(run / "checkpoints", every=100, keep=3, rules="fsdp")
    >>> mngr.save(100, params)                     # async; returns once arrays are copied
    True
    >>> mngr.wait()
    >>> params = mngr.restore(pt.abstract_target(abstract, mesh, "fsdp"))
    >>> mngr.close()
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from orbax.checkpoint import checkpoint_managers as ocp_policies

from partitioning.checkpoint.checksum import MetaHandler, MetaSave
from partitioning.checkpoint.disk import (
    FORMAT,
    META_ITEM,
    PRUNED,
    STATE_ITEM,
    TMP_SUFFIX,
    dir_bytes,
    drop_pruned,
    drop_tmp_dirs,
    list_steps,
    set_aside_after,
    step_damage,
)
from partitioning.checkpoint.frozen import META_KEY as FROZEN_KEY
from partitioning.checkpoint.frozen import drop_unreferenced, reused, split_for_save
from partitioning.checkpoint.keep import KeepGood
from partitioning.checkpoint.record import mesh_json, names_by_path, now_iso, spec_json, versions
from partitioning.checkpoint.restore import checkpoint_metadata, restore_checkpoint
from partitioning.checkpoint.space import (
    check_space,
    disk_full_error,
    drop_unfinished,
    file_too_big_error,
    is_disk_full,
    is_file_too_big,
    state_nbytes,
)
from partitioning.errors import CheckpointError
from partitioning.layout import path_str
from partitioning.outdir import check_out_dir
from partitioning.rules import as_rules

# OCDBT packs arrays into data files of about this size. Orbax's default (2 GiB)
# writes a state into a handful of files one after the other; 64 MiB files are
# written (and fsynced) in parallel: saves took 0.6x the time on the benchmark.
DATA_FILE_BYTES = 64 * 2**20


class CheckpointManager:
    """Saves every ``every`` steps, keeps the last ``keep`` (+ the best by eval loss), async by default.

    ``rules``, ``config`` (a mapping, e.g. ``cfg.raw``), ``model_name`` and
    ``abstract`` (the boxed ``eval_shape`` of the init, for logical names; or
    ``names``, a ``{path: names}`` mapping) are recorded in each checkpoint's
    metadata with the mesh, step and versions.
    ``compress`` writes arrays zstd-compressed (orbax's default; ~8% smaller
    for float states, restores several times slower on a CPU-bound host).
    ``keep <= 0`` keeps every checkpoint; ``every == 0`` (no schedule) saves
    whenever :meth:`save` is called. ``frozen`` (``trainer.frozen``: paths of
    params that never change) are written once, at the first save, and each
    step refers to them (:mod:`partitioning.checkpoint.frozen`). With ``keep_best``, the checkpoint with the lowest
    ``best_metric`` (among those saved with that metric) is kept too.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
        >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
        >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> with pt.CheckpointManager(run / "ckpts", every=2, keep=2, keep_best=True, rules="fsdp") as mngr:
        ...     for step in range(1, 9):
        ...         _ = mngr.save(step, params, metrics={"eval_loss": abs(step - 4)})
        >>> sorted(int(p.name) for p in (run / "ckpts").iterdir() if p.name.isdigit())   # the last two, the best
        [4, 6, 8]
        >>> params = mngr.restore(pt.abstract_target(abstract, mesh, "fsdp"))
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
        compress: bool = False,
        frozen: Collection[str] | None = None,
    ):
        check_out_dir(directory, "directory", replaceable=lambda _: True, kind="checkpoints")  # before orbax mkdirs
        self.shown = Path(directory)  # as the user gave it (relative or absolute): what messages say
        self.directory = self.shown.absolute()
        self.frozen = frozenset(frozen) if frozen is not None else None
        self._frozen: dict[str, Any] | None = None  # the frozen params this run's steps refer to
        self.directory = self.directory.resolve() if ".." in self.directory.parts else self.directory  # for orbax
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
        self._needed: dict[int, int] = {}  # bytes of each save, for a disk-full message
        self._pending: int | None = None  # the last step handed to orbax
        self._reported: set[str] = set()
        if abstract is not None:
            self._names.update(names_by_path(abstract))
        inner: list[Any] = []
        best_fn: Callable[[Mapping[str, Any]], float] | None = None
        if keep_best:

            def metric(m: Mapping[str, Any]) -> float:
                return float(m[best_metric])

            best_fn = metric
            inner.append(
                ocp_policies.BestN(get_metric_fn=best_fn, reverse=True, n=1, keep_checkpoints_without_metrics=False)
            )
        options = ocp.CheckpointManagerOptions(
            # The last `keep` complete steps (a damaged one never counts) and the healthiest (keep.py).
            preservation_policy=KeepGood(self.directory, self.keep, inner),
            best_fn=best_fn,
            best_mode="min",
            enable_async_checkpointing=async_,
            # Prune by renaming into PRUNED (atomic), never by deleting in place: a kill mid-prune
            # cannot leave a half-deleted step that looks complete.
            todelete_subdir=PRUNED,
        )
        drop_pruned(self.directory)
        # A save killed mid-write leaves a *.orbax-checkpoint-tmp-*: drop it (orbax's cleanup thread is not awaited).
        drop_tmp_dirs(self.directory)
        # The state is written by orbax's PyTree handler (the one behind StandardSave, so
        # ocp.StandardCheckpointer still reads it) to choose the compression.
        handlers = {
            STATE_ITEM: ocp.PyTreeCheckpointHandler(use_compression=compress),
            META_ITEM: MetaHandler(),  # orbax's JSON handler + each process's checksums (checksum.py)
        }
        try:
            self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        except OSError as e:
            raise CheckpointError(f"{self.shown}: cannot create checkpoint directory: {e.strerror}") from None

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
            entry: dict[str, Any] = {
                "shape": list(getattr(leaf, "shape", ())),
                "dtype": str(getattr(leaf, "dtype", type(leaf).__name__)),
            }
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

        With ``every == 0`` (no schedule, the default) an explicit ``save`` always saves.

        Asynchronous saves return once the device-to-host copies are done, so the
        caller may hand ``state`` to a donating step right away (on the CPU orbax
        keeps zero-copy views and XLA then copies instead of donating, once).
        """
        step = int(step)
        if not force and self.every > 0 and not self.should_save(step):
            return False
        if step in self._mngr.all_steps():
            damage = step_damage(self.directory / str(step)) if (self.directory / str(step)).is_dir() else None
            if damage is None:
                return False  # saved already
            self._move_damaged(step, damage)  # never skipped silently: the new save replaces it
        tracked = None
        if self.keep_best and metrics and _is_number(metrics.get(self.best_metric)):
            tracked = {self.best_metric: float(metrics[self.best_metric])}
        drop_pruned(self.directory)
        # Orbax would wait for the previous save here anyway: its failure is reported now, with its step.
        self.wait()
        # A save that cannot fit is refused before anything is written (space.py).
        latest = self._latest_complete()
        # The last step's size on disk counts too: chunk and file overheads outweigh small states.
        last_size = dir_bytes(self.directory / str(latest)) if latest is not None else 0
        drop_unreferenced(self.directory, self._frozen["step"] if self._frozen else None)
        state, split = self._split(step, state)
        self._needed[step] = max(state_nbytes(state), last_size)
        check_space(self.shown, step, self._needed[step], latest)
        meta = self._step_meta(step, state, metrics)
        if split is not None:
            meta[FROZEN_KEY] = split
        args = ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.PyTreeSave(state, ocdbt_target_data_file_size=DATA_FILE_BYTES),
                META_ITEM: MetaSave(meta, state),
            }
        )
        try:
            saved = bool(self._mngr.save(step, args=args, metrics=tracked, force=True))
        except Exception as e:  # this save's, or the previous asynchronous save's, failure
            raise self._failed(e, step) from None
        self._pending = step
        return saved

    def _split(self, step: int, state: Any) -> tuple[Any, dict[str, Any] | None]:
        """The state to write at ``step`` (without frozen params) and the frozen params it refers to."""
        kw = {"rules": self._base_meta.get("rules"), "names": self._names}
        state, self._frozen = split_for_save(
            self.directory, step, state, self.frozen, self._frozen, save_checkpoint, kw
        )
        return state, self._frozen

    def set_aside_after(self, step: int) -> list[str]:
        """Moves every step directory after ``step`` aside (``N.superseded-TIME``): a run resumed from an
        earlier step saves those steps anew. Returns what moved."""
        moved = set_aside_after(self.directory, step)
        if moved:
            self._mngr.reload()
        return moved

    def _move_damaged(self, step: int, damage: str) -> None:
        """A damaged step directory in the way of a save: moved aside (kept as evidence), said on stderr."""
        aside = self.directory / f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            (self.directory / str(step)).rename(aside)
            print(
                f"checkpoint: step {step} was damaged ({damage}); moved it to {self.shown / aside.name} and saved anew",
                file=sys.stderr,
            )
        self._mngr.reload()

    def _failed(self, error: Exception, step: int | None) -> Exception:
        """A failed save as one CheckpointError (its unfinished directory removed); other errors unchanged."""
        m = re.search(rf"/(\d+){re.escape(TMP_SUFFIX)}", str(error))
        step = int(m.group(1)) if m else step if step is not None else self._pending
        with contextlib.suppress(Exception):
            self._mngr.wait_until_finished()  # let orbax's threads settle before removing their files
        if step is not None:
            drop_unfinished(self.directory, step)  # whatever failed: nothing half-written stays
        if not (is_disk_full(error) or isinstance(error, OSError)):
            return error
        if is_file_too_big(error):
            return file_too_big_error(self.shown if step is None else self.shown / str(step), self._latest_complete())
        if is_disk_full(error):
            needed = self._needed.get(step) if step is not None else None
            return disk_full_error(self.shown, step, needed, self._latest_complete())
        what = getattr(error, "strerror", None) or error
        where = self.shown if step is None else self.shown / str(step)
        return CheckpointError(f"{where}: cannot write checkpoint: {what}")

    def _latest_complete(self) -> int | None:
        """The newest step complete on disk (orbax's own list also holds a save that failed)."""
        done = [s.step for s in list_steps(self.directory) if s.complete] if self.directory.is_dir() else []
        return done[-1] if done else None

    def check(self) -> None:
        """Raises a failed asynchronous save's error now (a CheckpointError for a full disk); never waits."""
        try:
            self._mngr.check_for_errors()
        except Exception as e:
            raise self._failed(e, None) from None

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk; a failed one raises (once)."""
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            err = self._failed(e, None)
            if str(err) in self._reported:
                return  # orbax raises a failed save again at every wait: it was said already
            self._reported.add(str(err))
            raise err from None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with contextlib.suppress(Exception):  # a failed save was reported by wait()
                self._mngr.close()
            drop_pruned(self.directory, final=True)
            # A save that failed as its temporary directory was made can leave it behind: nothing is in flight now.
            drop_tmp_dirs(self.directory)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- restore ------------------------------------------------------------
    def restore(self, target: Any, step: int | None = None, *, params_only: bool = False, verify: bool = True) -> Any:
        """:func:`restore_checkpoint` of this directory's latest (or ``step``) checkpoint; messages name it as given."""
        self.wait()
        out = restore_checkpoint(self.shown, target, step=step, params_only=params_only, verify=verify)
        self._frozen = reused(self.directory, step, self.frozen) or self._frozen  # later steps refer to them
        return out

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

        >>> import pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
        >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
        >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> pt.save_checkpoint(run / "exported", 200, params, rules="fsdp").name   # exported/200/
        '200'
    """
    with CheckpointManager(directory, async_=False, keep=0, **manager_kwargs) as mngr:
        mngr.save(step, state, force=True)
    return Path(directory).absolute() / str(int(step))


__all__ = ["CheckpointManager", "save_checkpoint", "names_by_path", "versions"]
