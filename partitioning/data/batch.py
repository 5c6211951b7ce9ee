"""A step's batch: its shape, the logical names of its leaves, its shardings, micro-batches, host -> devices.

A batch is any pytree of arrays whose leaves share a leading batch dimension
(``{"inputs": int32 (B, T), "targets": ...}`` for language models, ``{"inputs":
images, "targets": labels}`` for a classifier). Each leaf may carry logical
names (``("batch", "length")``); by default dim 0 is split over the rule
table's :attr:`~partitioning.Rules.batch_axes` and the rest is unsharded.

Example::

    >>> from partitioning.data.batch import batch_specs, lm_batch
    >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
    >>> specs = batch_specs(lm_batch(32, 128), pt.Rules.preset("fsdp"), mesh)
    >>> specs["inputs"]
    P(('data', 'fsdp'), None)
    >>> host = {"inputs": np.zeros((32, 128), np.int32), "targets": np.zeros((32, 128), np.int32)}
    >>> batch = pt.data.place(host, jax.tree.map(lambda s: jax.NamedSharding(mesh, s), specs))  # numpy -> sharded
    >>> batch["inputs"].sharding.spec
    P(('data', 'fsdp'), None)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from partitioning.boxes import constrain
from partitioning.errors import ShardingError
from partitioning.resolve import axes_tuple, mesh_axis_sizes
from partitioning.rules import Rules


def lm_batch(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The language-model batch: int32 ``inputs`` and ``targets`` of shape ``(batch_size, seq_len)``.

    Example::

        >>> from partitioning.data.batch import lm_batch
        >>> lm_batch(32, 128)["inputs"].shape
        (32, 128)
    """
    tok = jax.ShapeDtypeStruct((int(batch_size), int(seq_len)), jnp.int32)
    return {"inputs": tok, "targets": tok}


def as_abstract(batch: Any) -> Any:
    """``ShapeDtypeStruct`` leaves for a batch of arrays (or of ``ShapeDtypeStruct`` s)."""

    def one(x: Any) -> jax.ShapeDtypeStruct:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            x = np.asarray(x)
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)

    return jax.tree.map(one, batch)


def batch_shapes(batch: Any, batch_size: int | None, seq_len: int | None, who: str) -> Any:
    """``batch`` as shapes, or the language-model batch of ``batch_size`` x ``seq_len`` when ``batch`` is None.

    Example::

        >>> from partitioning.data.batch import batch_shapes
        >>> batch_shapes(None, 8, 64, "plan")["targets"].shape
        (8, 64)
    """
    if batch is not None:
        return as_abstract(batch)
    if batch_size is None or seq_len is None:
        raise TypeError(f"{who} needs batch_size and seq_len (a language-model batch) or batch=")
    return lm_batch(batch_size, seq_len)


def batch_size_of(batch: Any) -> int:
    """The leading dimension all leaves share; a ShardingError when they disagree."""
    sizes = {int(x.shape[0]) for x in jax.tree.leaves(batch) if len(x.shape)}
    if len(sizes) != 1:
        raise ShardingError(
            f"the batch's leaves need one shared leading (batch) dimension, got sizes {sorted(sizes)}", arg="batch_size"
        )
    return sizes.pop()


def batch_specs(
    abstract: Any,
    rules: Rules,
    mesh: Any,
    names: Any = None,
    *,
    micro_batch: int | None = None,
    what: str = "batch_size",
) -> Any:
    """A PartitionSpec per batch leaf: its ``names`` resolved, or dim 0 over the batch axes.

    Checks that the (micro-)batch divides by the mesh axes that split it.
    """
    sizes = mesh_axis_sizes(mesh)
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    # flatten_up_to: a PyTreeDef method that jaxlib ships without type information.
    name_leaves = [None] * len(leaves) if names is None else treedef.flatten_up_to(names)  # type: ignore[attr-defined]  # PyTreeDef's stubs omit it
    specs = []
    for leaf, n in zip(leaves, name_leaves, strict=True):
        ndim = len(leaf.shape)
        spec = rules.batch_spec(ndim) if n is None else rules.resolve(tuple(n), None, sizes)
        if ndim and spec and spec[0] is not None:
            axes = axes_tuple(spec[0])
            n_shards = math.prod(sizes[a] for a in axes)
            rows = micro_batch if micro_batch is not None else int(leaf.shape[0])
            if rows % n_shards:
                raise ShardingError(
                    f"{what} is not divisible by the batch mesh axes {axes!r} of size {n_shards}; "
                    f"use a multiple of {n_shards}",
                    arg="batch_size",
                )
        specs.append(PartitionSpec(*spec) if ndim else PartitionSpec())
    return jax.tree_util.tree_unflatten(treedef, specs)


def micro_batches(batch: Any, count: int, specs: Any) -> Any:
    """The batch as ``count`` stacked micro-batches (a new leading axis), moving no data.

    Micro-batch ``j`` is rows ``j, j + count, j + 2 count, ...``: every device
    already holds its share of each micro-batch.
    """

    def split(x, spec):
        mb = x.shape[0] // count
        return constrain(x.reshape(mb, count, *x.shape[1:]).swapaxes(0, 1), PartitionSpec(None, *spec))

    return jax.tree.map(split, batch, specs)


def local_block(sharding: Any, shape: Sequence[int]) -> tuple[slice, ...]:
    """The slices of a global ``shape`` array this process's devices hold."""
    idx = sharding.addressable_devices_indices_map(tuple(shape)).values()
    out = []
    for d, size in enumerate(shape):
        ranges = [ix[d].indices(size)[:2] for ix in idx]
        out.append(slice(min(r[0] for r in ranges), max(r[1] for r in ranges)))
    return tuple(out)


def place(host_batch: Any, shardings: Any) -> Any:
    """A global batch given as numpy arrays (the same on every process) -> sharded global jax Arrays.

    Each process hands over only the rows its devices hold
    (``jax.make_array_from_process_local_data``), so this works on many hosts.

    Example::

        >>> mesh = pt.make_mesh({"data": -1})
        >>> shardings = {k: jax.NamedSharding(mesh, jax.P("data")) for k in ("inputs", "targets")}
        >>> images, labels = np.zeros((16, 28, 28, 1), np.float32), np.zeros((16,), np.int32)
        >>> batch = pt.data.place({"inputs": images, "targets": labels}, shardings)
        >>> batch["inputs"].shape, batch["inputs"].sharding.spec
        ((16, 28, 28, 1), P('data',))
    """

    def one(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x[local_block(sharding, x.shape)], x.shape)

    return jax.tree.map(one, host_batch, shardings)


def stream_keys(seed: int, step: Any, streams: Sequence[str], micro: Any = None) -> dict[str, jax.Array]:
    """One PRNG key per named stream for ``step`` (and micro-batch): a pure function of the seed and the step.

    Keys do not depend on the layout (JAX's partitionable threefry), so a run
    draws the same dropout masks on any mesh and after a resume.
    """
    base = jax.random.fold_in(jax.random.key(seed), step)
    if micro is not None:
        base = jax.random.fold_in(base, micro)
    return {name: jax.random.fold_in(base, zlib.crc32(name.encode()) & 0x7FFFFFFF) for name in streams}


__all__ = [
    "lm_batch",
    "as_abstract",
    "batch_size_of",
    "batch_specs",
    "micro_batches",
    "constrain",
    "local_block",
    "place",
    "stream_keys",
]
