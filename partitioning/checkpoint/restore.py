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

import gc
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from partitioning.boxes import is_box
from partitioning.checkpoint.diagnose import diagnose
from partitioning.checkpoint.disk import CheckpointRef, flat_saved, read_metadata, resolve_checkpoint, saved_tree
from partitioning.checkpoint.reader import fast_registry
from partitioning.errors import CheckpointError
from partitioning.fmt import fmt_shape
from partitioning.layout import path_str, tree_shardings


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

    ``abstract`` is ``jax.eval_shape`` of the init (boxed or not), or an NNX
    state (``nnx.state(nnx.eval_shape(...))``: its Variables are kept). Pass ``mesh``
    and ``rules``, or ``shardings`` you already have (e.g. ``trainer.state_shardings``).
    ``dtype`` casts every floating-point leaf on restore (e.g. ``jnp.bfloat16``).
    An indivisible dimension raises the same :class:`ShardingError` as at init.

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
        shardings = tree_shardings(abstract, mesh, rules, on_indivisible=on_indivisible)

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


def check_fits(ref: CheckpointRef, saved: dict[str, Any], target: Any, partial: bool) -> None:
    """Raises a CheckpointError listing the first paths whose presence or shape differs.

    ``saved`` is :func:`~partitioning.checkpoint.disk.flat_saved` of the checkpoint;
    with ``partial``, arrays only in the checkpoint are fine.
    """
    want = {path_str(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(target)[0]}
    # A saved NNX Variable's value is a `value` key in orbax's metadata; in the target it is the Variable itself.
    saved = {
        p[: -len("/value")] if p.endswith("/value") and p not in want and p[: -len("/value")] in want else p: md
        for p, md in saved.items()
    }
    diffs: list[tuple[str, str]] = []
    for p, leaf in want.items():
        if p not in saved:
            diffs.append((p, f"{p}: not in the checkpoint (model {fmt_shape(leaf.shape)})"))
        elif tuple(saved[p].shape) != tuple(leaf.shape):
            diffs.append((p, f"{p}: checkpoint {fmt_shape(saved[p].shape)} vs model {fmt_shape(leaf.shape)}"))
    if not partial:
        diffs += [
            (p, f"{p}: only in the checkpoint ({fmt_shape(md.shape)})") for p, md in saved.items() if p not in want
        ]
    # Parameters first: they name the model change; optimizer moments only repeat it.
    lines = [d for _, d in sorted(diffs, key=lambda pd: not pd[0].startswith("params"))]
    if lines:
        more = f"; … and {len(lines) - 5} more" if len(lines) > 5 else ""
        raise CheckpointError(
            f"checkpoint {ref} does not fit the model ({len(lines)} of {len(want)} arrays differ): "
            + "; ".join(lines[:5])
            + more
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
    """
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
    check_fits(ref, saved, tgt, partial)
    restore_args = ocp.checkpoint_utils.construct_restore_args(tgt)
    if max_inflight_bytes is None:
        # orbax's default (96 GB) lets every read buffer live at once next to the
        # arrays being built: ~1.7x the state at peak. One array at a time is enough.
        largest = max((_nbytes(md) for md in saved.values()), default=0)
        max_inflight_bytes = max(256 * 2**20, largest + 2**20)
    # Arrays are read by partitioning.checkpoint.reader: one tensorstore read per device slice.
    handler = ocp.PyTreeCheckpointHandler(
        restore_concurrent_gb=max_inflight_bytes / 1e9, type_handler_registry=fast_registry(max_inflight_bytes)
    )
    # A restore makes thousands of short-lived asyncio objects; the cyclic GC would then
    # walk every live jax/flax object again and again (~15% of a restore on the CPU).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with ocp.Checkpointer(handler) as ckptr:
            out = ckptr.restore(
                ref.item.absolute(),
                args=ocp.args.PyTreeRestore(item=tgt, restore_args=restore_args, partial_restore=partial),
            )
    except Exception as e:  # orbax / tensorstore internals -> one actionable line
        raise diagnose(ref, e) from None
    finally:
        if gc_was_enabled:
            gc.enable()
    return out["params"] if unwrap else out


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
        >>> meta = pt.checkpoint_metadata(run)
        >>> meta["step"], meta["mesh"]["shape"], meta["arrays"]["params/embedding"]["names"]
        (10, [1, 8], ['vocab', 'embed'])
    """
    ref = resolve_checkpoint(path, step)
    meta = dict(read_metadata(ref))
    meta.setdefault("step", ref.step)
    meta["path"] = str(ref.path)
    return meta


__all__ = ["abstract_target", "target_like", "check_fits", "restore_checkpoint", "checkpoint_metadata"]
