"""Restore: read a checkpoint onto the *current* mesh and rules, each device only its slices.

The target is built from the current layout — ``jax.eval_shape`` of the init
plus :func:`~partitioning.tree_shardings` — so orbax reads only the slices each
device needs, whatever layout wrote the checkpoint.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
    >>> target = pt.abstract_target(abstract, pt.make_mesh({"data": 1, "tensor": -1}), "tp")   # no allocation
    >>> state = pt.restore_checkpoint(run, target)                     # latest complete step
    >>> params = pt.restore_checkpoint(run, pt.abstract_target(abstract["params"], mesh, "fsdp",
    ...                                dtype=jnp.bfloat16), params_only=True)
    >>> params["wi_0"].dtype, params["wi_0"].sharding.spec
    (dtype(bfloat16), P('fsdp', None))
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from partitioning.annotations import as_annotations
from partitioning.boxes import is_box
from partitioning.checkpoint.diagnose import diagnose
from partitioning.checkpoint.disk import CheckpointRef, flat_saved, read_metadata, resolve_checkpoint, saved_tree
from partitioning.checkpoint.frozen import frozen_ref, restore_split, without_frozen
from partitioning.checkpoint.integrity import check_parts, read_check, refuse
from partitioning.checkpoint.quiet import ignore_stray_reads
from partitioning.checkpoint.reader import fast_registry
from partitioning.checkpoint.target import check_fits, layout_target
from partitioning.errors import CheckpointError
from partitioning.layout import path_str, tree_shardings


def abstract_target(
    abstract: Any,
    mesh: jax.sharding.Mesh | None = None,
    rules: Any = None,
    *,
    shardings: Any = None,
    dtype: Any = None,
    on_indivisible: str = "error",
    annotations: Any = None,
) -> Any:
    """``jax.ShapeDtypeStruct`` leaves carrying the shardings the current mesh + rules give.

    ``abstract`` is ``jax.eval_shape`` of the init (boxed or not), or an NNX
    state (``nnx.state(nnx.eval_shape(...))``: its Variables are kept). Pass ``mesh``
    and ``rules``, or ``shardings`` you already have (e.g. ``trainer.state_shardings``).
    ``dtype`` casts every floating-point leaf on restore (e.g. ``jnp.bfloat16``).
    An indivisible dimension raises the same :class:`ShardingError` as at init.
    ``annotations`` name the leaves of ``abstract`` by path first (:class:`~partitioning.Annotations`).

    Example::

        >>> from partitioning.models import MLP
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.zeros((8, 16), jnp.int32))
        >>> target = pt.abstract_target(abstract, pt.make_mesh({"data": 1, "tensor": -1}), "tp")
        >>> target["params"]["wi_0"].sharding.spec
        P(None, 'tensor')
    """
    if shardings is None:
        if mesh is None:
            raise TypeError("abstract_target needs a mesh (and rules) or shardings")
        shardings = tree_shardings(
            abstract, mesh, rules, on_indivisible=on_indivisible, warn_replicated=False, annotations=annotations
        )

    def sds(value: Any, s: Any) -> jax.ShapeDtypeStruct:
        dt = jnp.dtype(value.dtype)
        if dtype is not None and jnp.issubdtype(dt, jnp.floating):
            dt = jnp.dtype(dtype)
        return jax.ShapeDtypeStruct(tuple(value.shape), dt, sharding=s)

    def one(leaf: Any, s: Any) -> Any:
        # An NNX Variable stays a Variable (holding the target): a saved nnx.State has that structure.
        if isinstance(leaf, nnx.Variable):
            return leaf.replace(sds(leaf.get_value(), s))
        return sds(leaf.value if is_box(leaf) else leaf, s)

    return jax.tree.map(one, abstract, shardings, is_leaf=lambda x: is_box(x) or isinstance(x, nnx.Variable))


def target_like(tree: Any) -> Any:
    """A restore target with the shapes, dtypes and shardings of existing arrays."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


# -- restore --------------------------------------------------------------------------


class _MissingMetadata(logging.Filter):
    """Orbax warns that a step's ``_CHECKPOINT_METADATA`` is missing on every restore of an item it did not
    write through its own manager (the toolkit's checkpoints keep theirs beside the state): not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Metadata file does not exist")


@contextlib.contextmanager
def _quiet_missing_metadata() -> Any:
    """Only during the toolkit's restores: orbax in the user's own code still says it."""
    logger, quiet = logging.getLogger("absl"), _MissingMetadata()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@_quiet_missing_metadata()  # the whole restore: reading the saved tree's metadata warns too
def restore_checkpoint(
    path: str | os.PathLike,
    target: Any = None,
    *,
    mesh: Any = None,
    rules: Any = None,
    optimizer_rules: Any = None,
    on_indivisible: str = "error",
    step: int | None = None,
    params_only: bool = False,
    max_inflight_bytes: int | None = None,
    verify: bool = True,
    frozen: bool = True,
    annotations: Any = None,
) -> Any:
    """Restores a checkpoint onto the shardings (and dtypes) of ``target``, or onto ``mesh`` and ``rules``.

    ``path`` is a run dir or checkpoints dir (latest complete step, or ``step``),
    a step dir, or a directory written by plain ``ocp.StandardCheckpointer``.
    ``target`` comes from :func:`abstract_target` (an NNX state of Variables
    works too), or is a pytree of ``NamedSharding`` s (shapes and dtypes are
    the saved ones). Without a ``target``, pass ``mesh`` (and ``rules``): the
    checkpoint's own arrays are laid out there — by their logical names
    (recorded in its metadata) under ``rules``, and an array without names
    keeps the spec it was saved with, on the axes ``mesh`` has
    (:mod:`partitioning.checkpoint.target`); ``annotations`` name arrays whose
    metadata records no names (optimizer moments follow their parameter's
    row). Orbax reads only the slices each
    device needs. With ``params_only``, ``target`` is the params tree (or
    ``{"params": ...}``) and only the checkpoint's ``params`` are read.
    ``max_inflight_bytes`` bounds the host buffers being read at once (default:
    256 MiB or the largest array), so peak memory stays near the state's size.
    ``verify`` (the default) refuses a damaged checkpoint
    (:mod:`partitioning.checkpoint.integrity`): a missing part, a missing or
    truncated data file, or a slice whose bytes no longer match the crc32c
    recorded at save (computed while the bytes are read) is a CheckpointError
    naming the step, the file and the earlier good step. ``verify=False`` reads
    without checking.
    A step of a run with frozen params refers to them (written once per run,
    :mod:`partitioning.checkpoint.frozen`): they are read from there and merged, so
    the params come back whole (a base that is missing or another run's is refused);
    ``frozen=False`` reads only the step's own arrays (a ``target`` loses its frozen params), base or not.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
        >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
        >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
        >>> target = pt.abstract_target(abstract, shardings=shardings)   # e.g. a Trainer's state_shardings
        >>> pt.restore_checkpoint(run / "checkpoints" / "10", target)["params"]["wo_0"].shape
        (256, 64)
        >>> tp = pt.make_mesh({"data": 2, "tensor": 4})    # no model needed: onto another mesh by its names
        >>> pt.restore_checkpoint(run / "checkpoints" / "10", mesh=tp, rules="tp")["params"]["wo_0"].sharding.spec
        P('tensor', None)
    """
    ref = resolve_checkpoint(path, step, base=frozen)
    split = frozen_ref(ref)
    if split is not None and not frozen:  # the step's own arrays only: the frozen paths leave the target
        target = without_frozen(target, split)
        split = None
    if split is not None:
        kw = {"mesh": mesh, "rules": rules, "optimizer_rules": optimizer_rules, "on_indivisible": on_indivisible}
        kw.update(params_only=params_only, max_inflight_bytes=max_inflight_bytes, verify=verify)
        return restore_split(ref, split, target, restore_checkpoint, layout_target, **kw)
    if verify:
        check_parts(ref, base=frozen)  # before anything is read: a missing part or data file
    try:
        saved = flat_saved(saved_tree(ref))
    except CheckpointError as e:  # an unreadable _METADATA is damage too: the step and the good one
        raise (refuse(ref, e) if verify else e) from None
    check = read_check(ref, {p: md.dtype for p, md in saved.items()}) if verify else None
    if target is None:
        if mesh is None:
            raise TypeError("restore_checkpoint needs a target, or a mesh (and rules) to lay the checkpoint out on")
        target, _ = layout_target(
            ref,
            mesh,
            rules,
            optimizer_rules=optimizer_rules,
            on_indivisible=on_indivisible,
            unnamed="saved",
            names=annotated_names(saved, annotations),
            frozen=frozen,
        )
        if params_only and isinstance(target, Mapping) and "params" in target:
            target = target["params"]
    if target is not None and (where := _unplaced(target)) is not None:
        if mesh is None:
            raise CheckpointError(
                f"restore_checkpoint: the target's leaf {where!r} has no sharding to restore onto (an abstract or "
                "boxed state, e.g. trainer.abstract_state): pass mesh= and rules= to lay it out, or "
                "pt.abstract_target(abstract, shardings=trainer.state_shardings)"
            )
        target = abstract_target(target, mesh, rules, on_indivisible=on_indivisible, annotations=annotations)
    target = _from_shardings(ref, target, saved, "params/" if params_only and _has_params(saved) else "")
    target, refill = _plain_variables(target, saved, params_only)
    tgt, unwrap, partial = target, False, False
    if params_only:
        partial = True
        has_params = _has_params(saved)
        if isinstance(target, Mapping) and set(target) == {"params"}:
            pass
        elif has_params:
            tgt, unwrap = {"params": target}, True
        else:
            partial = False  # the checkpoint holds only params
    check_fits(ref, saved, tgt, partial)
    restore_args = ocp.checkpoint_utils.construct_restore_args(tgt)
    if max_inflight_bytes is None:
        # orbax's default (96 GB) lets every read buffer live at once next to the
        # arrays being built: ~1.7x the state at peak. One array at a time is enough.
        largest = max((_nbytes(md) for md in saved.values()), default=0)
        max_inflight_bytes = max(256 * 2**20, largest + 2**20)
    # Arrays are read by partitioning.checkpoint.reader: one tensorstore read per device slice.
    handler = ocp.PyTreeCheckpointHandler(
        restore_concurrent_gb=max_inflight_bytes / 1e9, type_handler_registry=fast_registry(max_inflight_bytes, check)
    )
    # A restore makes thousands of short-lived asyncio objects; the cyclic GC would then
    # walk every live jax/flax object again and again (~15% of a restore on the CPU).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with ocp.Checkpointer(handler) as ckptr:
            out = ckptr.restore(
                ref.item.resolve(),
                args=ocp.args.PyTreeRestore(item=tgt, restore_args=restore_args, partial_restore=partial),
            )
    except Exception as e:  # orbax / tensorstore internals -> one actionable line
        ignore_stray_reads()  # reads still in flight finish on orbax's closed loop, after this error
        err = diagnose(ref, e)
        what = str(err).split(f"checkpoint {ref}: ", 1)[-1]
        damage = any(w in what for w in ("missing file", "truncated file", "damaged file", "unreadable data"))
        raise (refuse(ref, what) if verify and damage else err) from None
    finally:
        if gc_was_enabled:
            gc.enable()
    if check is not None:
        check.finish()  # a slice whose bytes differ from the crc32c recorded at save
    return refill(out["params"] if unwrap else out)


def annotated_names(saved: Mapping[str, Any], annotations: Any) -> dict[str, Any]:
    """Logical names by saved path from an annotation table (paths its rows match, with the right rank)."""
    table = as_annotations(annotations)
    out: dict[str, Any] = {}
    for p, md in saved.items() if table else ():
        names = table.names_for(p) if table is not None else None
        if names is not None and len(names) == len(md.shape):
            out[p] = list(names)
    return out


def _has_params(saved: Mapping[str, Any]) -> bool:
    return any(p == "params" or p.startswith("params/") for p in saved)


def _unplaced(target: Any) -> str | None:
    """The path of the first leaf with nowhere to go: a Flax box, or a ShapeDtypeStruct without a sharding."""
    for kp, leaf in jax.tree_util.tree_flatten_with_path(target, is_leaf=is_box)[0]:
        if is_box(leaf) or (isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None):
            return path_str(kp)
    return None


def _from_shardings(ref: CheckpointRef, target: Any, saved: Mapping[str, Any], prefix: str) -> Any:
    """A target of shardings -> ShapeDtypeStructs with the saved shapes and dtypes."""

    def one(kp: Any, leaf: Any) -> Any:
        if not isinstance(leaf, jax.sharding.Sharding):
            return leaf
        p = prefix + path_str(kp)
        if p not in saved:
            raise CheckpointError(f"checkpoint {ref} has no array {p} (the target's sharding for it has nowhere to go)")
        md = saved[p]
        return jax.ShapeDtypeStruct(tuple(int(s) for s in md.shape), md.dtype, sharding=leaf)

    return jax.tree_util.tree_map_with_path(one, target, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _plain_variables(target: Any, saved: Mapping[str, Any], params_only: bool) -> tuple[Any, Any]:
    """An NNX target (Variables) for a checkpoint that holds plain arrays: (plain target, refill).

    The Trainer saves an NNX model's state as plain arrays (``nnx.to_pure_dict``); a target of
    Variables (``abstract_target(nnx.state(model, nnx.Param), ...)``) then restores into plain
    arrays, which ``refill`` puts back into copies of the target's Variables. A checkpoint of an
    ``nnx.State`` itself (a ``value`` under every Variable) restores as it is.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_variable)
    variables = [(path_str(kp), leaf) for kp, leaf in leaves if _is_variable(leaf)]
    if not variables:
        return target, lambda out: out
    prefix = "params/" if params_only and any(p.startswith("params/") for p in saved) else ""
    if any(f"{prefix}{p}/value" in saved for p, _ in variables):
        return target, lambda out: out
    values = [leaf.get_value() if _is_variable(leaf) else leaf for _, leaf in leaves]
    plain = _as_dicts(jax.tree_util.tree_unflatten(treedef, values))

    def refill(out: Any) -> Any:
        restored = jax.tree.leaves(out)
        return jax.tree_util.tree_unflatten(
            treedef,
            [leaf.replace(x) if _is_variable(leaf) else x for (_, leaf), x in zip(leaves, restored, strict=True)],
        )

    return plain, refill


def _as_dicts(tree: Any) -> Any:
    """``nnx.State`` containers as plain dicts (the structure a saved pure dict has)."""
    if isinstance(tree, Mapping):
        return {k: _as_dicts(v) for k, v in tree.items()}
    return tree


def _nbytes(md: Any) -> int:
    n = math.prod(int(s) for s in md.shape)
    try:
        return n * jnp.dtype(md.dtype).itemsize
    except TypeError:
        return n * 8


def checkpoint_metadata(path: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
    """The metadata saved with a checkpoint (``{}`` for plain orbax ones), plus ``path`` and ``step``.

    Example::

        >>> import pathlib, tempfile
        >>> from partitioning.models import MLP
        >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
        >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
        >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
        >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> step_dir = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
        >>> meta = pt.checkpoint.checkpoint_metadata(run)
        >>> meta["step"], meta["mesh"]["shape"], meta["arrays"]["params/embedding"]["names"]
        (10, [1, 8], ['vocab', 'embed'])
    """
    ref = resolve_checkpoint(path, step)
    meta = dict(read_metadata(ref))
    meta.setdefault("step", ref.step)
    meta["path"] = str(ref.path)
    return meta


__all__ = ["abstract_target", "target_like", "check_fits", "restore_checkpoint", "checkpoint_metadata"]
