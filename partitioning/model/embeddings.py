"""Which parameters a model uses as embedding tables: found by tracing it, whatever their names or sizes.

``partitioning annotate`` names an embedding ``(vocab, embed)`` by use: a table whose rows the model
gathers at indices computed from its integer inputs (``nn.Embed``, ``jnp.take``, ``table[ids]``), seen in the
traced program (``jax.make_jaxpr`` of the forward pass on abstract inputs: nothing is computed). Names and
sizes do not matter: Flax's SST-2 classifier's 300-wide embedding under a 256-wide LSTM is one.

Example::

    >>> import flax.linen as nn
    >>> from partitioning.model.embeddings import embedding_tables
    >>> class Classifier(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, ids):
    ...         return nn.Dense(2)(nn.Dense(64)(nn.Embed(1000, 30)(ids)).mean(1))
    >>> ids = jax.ShapeDtypeStruct((2, 7), jnp.int32)
    >>> params = jax.eval_shape(Classifier().init, jax.random.key(0), ids)["params"]
    >>> embedding_tables(lambda p, x: Classifier().apply({"params": p}, x), params, ids)
    {'Embed_0/embedding'}
"""

from __future__ import annotations

from typing import Any

import jax
from jax.extend.core import Literal

from partitioning.paths import path_str

# Primitives through which an array stays the parameter it was (a cast, a copy, a layout constraint).
_SAME = {"convert_element_type", "copy", "copy_p", "sharding_constraint", "reshard", "mesh_cast", "reduce_precision"}


def _subjaxprs(eqn: Any) -> list[Any]:
    """The programs an equation calls (jit, custom_jvp, remat, scan bodies) with its operands as their inputs."""
    out: list[Any] = []
    for value in eqn.params.values():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            inner: Any = getattr(v, "jaxpr", v)
            if hasattr(inner, "eqns") and len(inner.invars) == len(eqn.invars):
                out.append(inner)
    return out


def embedding_tables(fn: Any, params: Any, *inputs: Any) -> set[str]:
    """The paths of ``params`` that ``fn(params, *inputs)`` indexes with its integer inputs: embedding tables.

    Found by use, whatever their names or sizes: the traced program (``jax.make_jaxpr``, nothing computed)
    gathers rows of the parameter (``jnp.take``, ``nn.Embed``, ``x[ids]``) at indices computed from an
    integer input. Paths are as :func:`~partitioning.paths.path_str` writes them, relative to ``params``.

    Example::

        >>> from partitioning.model.embeddings import embedding_tables
        >>> table, w = jax.ShapeDtypeStruct((100, 8), jnp.float32), jax.ShapeDtypeStruct((8, 4), jnp.float32)
        >>> params = {"table": table, "w": w}
        >>> ids = jax.ShapeDtypeStruct((2, 5), jnp.int32)
        >>> sorted(embedding_tables(lambda p, x: p["table"][x] @ p["w"], params, ids))
        ['table']
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [path_str(kp) for kp, _ in flat]
    leaves = [leaf for _, leaf in flat]
    closed = jax.make_jaxpr(lambda ls, *a: fn(jax.tree_util.tree_unflatten(treedef, ls), *a))(leaves, *inputs)
    jaxpr = closed.jaxpr
    origin: dict[Any, str] = dict(zip(jaxpr.invars[: len(paths)], paths, strict=True))
    ints: set[Any] = {v for v in jaxpr.invars[len(paths) :] if jax.numpy.issubdtype(v.aval.dtype, jax.numpy.integer)}
    found: set[str] = set()

    def walk(j: Any, origin: dict[Any, str], ints: set[Any]) -> tuple[dict[Any, str], set[Any]]:
        for eqn in j.eqns:
            ins = [v for v in eqn.invars if not isinstance(v, Literal)]
            name = eqn.primitive.name
            indexed = any(v in ints for v in eqn.invars[1:] if not isinstance(v, Literal))
            if name in ("gather", "dynamic_slice") and eqn.invars[0] in origin and indexed:
                found.add(origin[eqn.invars[0]])
            for inner in _subjaxprs(eqn):
                pairs = list(zip(eqn.invars, inner.invars, strict=True))
                o = {b: origin[a] for a, b in pairs if not isinstance(a, Literal) and a in origin}
                i = {b for a, b in pairs if not isinstance(a, Literal) and a in ints}
                o, i = walk(inner, o, i)
                if len(inner.outvars) == len(eqn.outvars):
                    for a, b in zip(inner.outvars, eqn.outvars, strict=True):
                        if a in o:
                            origin[b] = o[a]
                        if a in i:
                            ints.add(b)
            if name in _SAME and ins and ins[0] in origin:
                origin[eqn.outvars[0]] = origin[ins[0]]
            if any(v in ints for v in ins):
                ints.update(o for o in eqn.outvars if jax.numpy.issubdtype(o.aval.dtype, jax.numpy.integer))
        return origin, ints

    walk(jaxpr, origin, ints)
    return found


__all__ = ["embedding_tables"]
