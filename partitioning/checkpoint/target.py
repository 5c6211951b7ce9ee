"""Restore targets read off a checkpoint itself: its shapes and dtypes, laid out for a new mesh and rules.

What :func:`~partitioning.restore_checkpoint` needs when there is no model at
hand (``restore_checkpoint(path, mesh=..., rules=...)``) and what
:func:`~partitioning.reshard_checkpoint` writes: each saved array laid out
by its logical names (recorded in the checkpoint's metadata; optimizer
moments take their parameter's) under the rules, and — for a restore — an
array without names keeps the spec it was saved with, on the axes the new
mesh has. Also :func:`check_fits`, which compares a target with the saved
tree before anything is read.

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.checkpoint.disk import flat_saved, resolve_checkpoint, saved_tree
    >>> from partitioning.checkpoint.target import check_fits, layout_target
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = pt.save_checkpoint(run / "checkpoints", 10, params, rules="fsdp", abstract=abstract)
    >>> ref = resolve_checkpoint(run)
    >>> target, names = layout_target(ref, pt.make_mesh({"data": 1, "tensor": -1}), "tp")
    >>> names["params/wi_0"], target["params"]["wi_0"].sharding.spec    # names recorded at save, laid out by "tp"
    (['embed', 'mlp'], P(None, 'tensor'))
    >>> wider = pt.unbox(jax.eval_shape(MLP(mlp=512).init, jax.random.key(0), x))
    >>> check_fits(ref, flat_saved(saved_tree(ref)), wider, partial=False)
    Traceback (most recent call last):
    partitioning.errors.CheckpointError: checkpoint .../10 does not fit the model (4 of 6 arrays differ): \
params/wi_0: checkpoint (64, 256) vs model (64, 512); ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from partitioning.annotations import factored_names
from partitioning.checkpoint.disk import (
    CheckpointRef,
    flat_saved,
    is_saved_leaf,
    read_metadata,
    resolve_checkpoint,
    saved_tree,
)
from partitioning.checkpoint.frozen import frozen_path, frozen_ref
from partitioning.errors import CheckpointError, ShardingError
from partitioning.finetune.trainable import merge_trees
from partitioning.fmt import fmt_shape
from partitioning.layout import path_str
from partitioning.resolve import axes_tuple, mesh_axis_sizes
from partitioning.rules import as_rules

UNNAMED = ("replicate", "saved")


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
    diffs = []
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


def reshard_target(
    saved: dict[str, Any],
    names: Mapping[str, Any],
    mesh: Any,
    rules: Any,
    optimizer_rules: Any,
    on_indivisible: str,
    tree: Any,
    unnamed: str = "replicate",
) -> Any:
    """A restore target shaped like the saved tree, laid out by the new mesh and rules.

    ``names`` maps paths to logical names; the optimizer state follows
    ``optimizer_rules``. Arrays without names are replicated, or with
    ``unnamed="saved"`` keep their saved spec on the axes ``mesh`` has.
    """
    rules = as_rules(rules)
    opt_rules = as_rules(optimizer_rules) if optimizer_rules is not None else rules
    specs = {}
    # Parameters first, so an indivisible dimension is reported as at init.
    for p in sorted(saved, key=lambda p: not p.startswith("params")):
        shape = tuple(int(s) for s in saved[p].shape)
        n = names.get(p)
        specs[p] = PartitionSpec()
        if n is None and unnamed == "saved":
            specs[p] = _saved_spec(p, saved[p], shape, mesh, on_indivisible)
        if n is not None and len(n) == len(shape):
            table = opt_rules if p.startswith("opt_state") else rules
            specs[p] = table.resolve(
                tuple(tuple(x) if isinstance(x, list) else x for x in n),
                shape,
                mesh,
                on_indivisible=on_indivisible,
                path=p,
            )

    def one(kp: Any, md: Any) -> jax.ShapeDtypeStruct:
        shape = tuple(int(s) for s in md.shape)
        return jax.ShapeDtypeStruct(shape, md.dtype, sharding=NamedSharding(mesh, specs[path_str(kp)]))

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_saved_leaf)


def names_for_moments(saved: Mapping[str, Any], names: dict[str, Any]) -> None:
    """Optimizer moments without recorded names take their parameter's (``opt_state/0/mu/<param>``).

    Checkpoints written by plain orbax carry no logical names; optax moments
    mirror the params tree, so a path ending in a parameter's path with the
    parameter's shape is laid out like that parameter, and a factored one (one
    dimension less) takes its names less the one the optimizer dropped.
    """
    params = {p[len("params/") :]: p for p in names if p.startswith("params/")}
    for p, md in saved.items():
        if p in names or not p.startswith("opt_state/"):
            continue
        parts = p.split("/")
        for i in range(1, len(parts)):
            q = params.get("/".join(parts[i:]))
            if q is None or q not in saved:
                continue
            own, shape = tuple(saved[q].shape), tuple(md.shape)
            found = names[q] if own == shape else factored_names(names[q], own, shape, p)
            if found is not None:
                names[p] = list(found)
                break


def _saved_spec(path: str, md: Any, shape: tuple[int, ...], mesh: Any, on_indivisible: str) -> PartitionSpec:
    """The spec an array was saved with, kept on the axes ``mesh`` has (an axis it lacks: unsharded there)."""
    spec = getattr(getattr(md, "sharding", None), "partition_spec", None) or ()
    sizes = mesh_axis_sizes(mesh)
    out: list[Any] = []
    for i, entry in enumerate(list(spec)[: len(shape)]):
        axes = tuple(a for a in axes_tuple(entry if isinstance(entry, (str, type(None))) else tuple(entry)))
        kept = tuple(a for a in axes if a in sizes)
        n = math.prod(sizes[a] for a in kept)
        if kept and shape[i] % n:
            msg = f"{path}: dim {i} (size {shape[i]}) is not divisible by mesh axes {kept!r} of size {n}"
            if on_indivisible == "error":
                raise ShardingError(msg + " (its saved spec); pass rules for it, or on_indivisible='replicate'")
            kept = ()
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


def layout_target(
    ref: CheckpointRef,
    mesh: Any,
    rules: Any = None,
    *,
    optimizer_rules: Any = None,
    on_indivisible: str = "error",
    unnamed: str = "saved",
    names: Mapping[str, Any] | None = None,
    frozen: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """(target, names): checkpoint ``ref`` laid out for ``mesh`` and ``rules`` (see the module docstring).

    ``names``: logical names by path for arrays whose metadata records none (e.g. the new model's).
    ``frozen=False``: the step's own arrays only, not the frozen params it refers to.
    """
    if unnamed not in UNNAMED:
        raise ValueError(f"unnamed must be one of {UNNAMED}, got {unnamed!r}")
    meta = read_metadata(ref)
    tree = saved_tree(ref)
    saved = flat_saved(tree)
    rules = as_rules(rules)
    rules.validate(mesh)
    found = {p: a["names"] for p, a in (meta.get("arrays") or {}).items() if a.get("names") is not None}
    for p, n in (names or {}).items():
        found.setdefault(p, n)
    names_for_moments(saved, found)
    target = reshard_target(saved, found, mesh, rules, optimizer_rules, on_indivisible, tree, unnamed)
    if not frozen:
        return target, found
    return with_frozen_target(ref, target, found, mesh, rules, on_indivisible=on_indivisible, unnamed=unnamed)


def with_frozen_target(
    ref: CheckpointRef, target: Any, names: dict[str, Any], mesh: Any, rules: Any, **kw: Any
) -> tuple[Any, dict[str, Any]]:
    """A step's target with the frozen params it refers to laid out too (:mod:`partitioning.checkpoint.frozen`)."""
    split = frozen_ref(ref)
    if split is None or not isinstance(target, Mapping) or not isinstance(target.get("params"), Mapping):
        return target, names
    fixed, fixed_names = layout_target(resolve_checkpoint(frozen_path(ref, split)), mesh, rules, names=names, **kw)
    return {**target, "params": merge_trees(target["params"], fixed["params"])}, {**fixed_names, **names}


__all__ = ["check_fits", "reshard_target", "names_for_moments", "layout_target", "UNNAMED"]
