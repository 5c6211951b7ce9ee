"""Where a mesh's axes sit on nodes: the placements ``tune`` searches for a cluster of ``node_size``-device nodes.

A placement is a mesh's ``nodes`` (``{axis: nodes it spans}``,
:func:`partitioning.make_mesh`): the axes that cross the slow network
between nodes, the rest inside a node on the fast links. ``tune`` prices
each (:meth:`partitioning.tune.Hardware.bandwidth` with ``nodes``) and keeps
the fastest; ``jax.make_mesh``'s own layout (the outer axes across nodes) is
one of them, tried first. ``tensor`` and ``context`` stay inside a node when
the other axes can span the nodes: their collectives wait in every layer's
forward pass, which the roofline (communication overlapped with compute)
does not see.

Example::

    >>> from partitioning.tune.nodes import placements
    >>> placements({"data": 2, "fsdp": 8}, 8)      # 16 devices on 2 nodes
    [{'data': 2}, {'fsdp': 2}]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# Axes whose collectives sit on the critical path of every layer (tensor-parallel activations, context-parallel
# keys and values): kept inside a node, on the fast links, whenever the other axes can span the nodes.
INSIDE = ("tensor", "context")


def default_nodes(mesh: Mapping[str, int], node_size: int) -> dict[str, int]:
    """The ``nodes`` of ``jax.make_mesh``'s layout: consecutive devices share a node, so the outer axes span nodes.

    Example::

        >>> from partitioning.tune.nodes import default_nodes
        >>> default_nodes({"data": 2, "fsdp": 16, "tensor": 4}, 8)
        {'data': 2, 'fsdp': 8}
    """
    out, sizes = {}, list(mesh.items())
    for i, (name, size) in enumerate(sizes):
        stride = math.prod(s for _, s in sizes[i + 1 :])
        inside = 1 if stride >= node_size else min(size, max(1, node_size // stride))
        if size // inside > 1:
            out[name] = size // inside
    return out


def placements(mesh: Mapping[str, int], node_size: int, inside: Sequence[str] = INSIDE) -> list[dict[str, int]]:
    """Every ``nodes`` that puts ``mesh`` on nodes of ``node_size`` devices (an axis spans nodes that divide its
    size), ``jax.make_mesh``'s own first; ``[]`` when the mesh fits one node or its devices fill no whole nodes.
    The ``inside`` axes never span nodes while some placement keeps them inside one.

    Example::

        >>> from partitioning.tune.nodes import placements
        >>> placements({"data": 4, "fsdp": 8}, 8)
        [{'data': 4}, {'data': 2, 'fsdp': 2}, {'fsdp': 4}]
        >>> placements({"fsdp": 8, "tensor": 4}, 8)       # tensor stays inside a node
        [{'fsdp': 4}]
    """
    devices = math.prod(mesh.values())
    if node_size <= 0 or devices <= node_size or devices % node_size:
        return []
    count, axes = devices // node_size, [(a, int(s)) for a, s in mesh.items() if s > 1]

    def split(i: int, left: int) -> list[dict[str, int]]:
        if i == len(axes):
            return [{}] if left == 1 else []
        a, size = axes[i]
        return [
            ({a: n} if n > 1 else {}) | rest
            for n in range(1, min(size, left) + 1)
            if size % n == 0 and left % n == 0
            for rest in split(i + 1, left // n)
        ]

    found = sorted(split(0, count), key=lambda p: [-p.get(a, 1) for a, _ in axes])
    found = [p for p in found if not set(p) & set(inside)] or found
    first = default_nodes(mesh, node_size)
    return [first] + [p for p in found if p != first] if first in found else found


__all__ = ["default_nodes", "placements", "INSIDE"]
