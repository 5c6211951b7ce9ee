"""Per mesh axis: what each axis splits (memory) and what travels over it (collectives of the compiled step).

A collective's devices come from its HLO ``replica_groups`` (explicit lists,
iota forms ``[2,4]<=[8]`` / ``[4,2]<=[2,4]T(1,0)``, or ``mesh[...]``) or a
permute's ``source_target_pairs``. Device ``i`` of an SPMD program is the
``i``-th device of the mesh in row-major order, so the mesh axes along which
a group's devices differ are the axes the collective runs over: an FSDP
all-gather over ``fsdp``, a pipeline shift over ``stage``, an expert
dispatch all-to-all over ``expert``.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
    ...                      batch_size=8, seq_len=16)
    >>> from partitioning.plan.axes import collectives_by_axis, memory_by_axis
    >>> view = pt.plan.compiled_view(trainer.lower_train_step)
    >>> sorted(collectives_by_axis(view["collective_ops"], {"data": 1, "fsdp": 8})["fsdp"])
    ['all-gather', 'all-reduce', 'all-to-all', 'collective-permute', 'reduce-scatter']
    >>> memory_by_axis(trainer.state_layouts(), {"data": 1, "fsdp": 8})["fsdp"]["splits"]
    ['embed']
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from partitioning.mesh import node_ids
from partitioning.plan.hlo import KINDS
from partitioning.resolve import axes_tuple


def _iota(dims: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(dims)).reshape(dims)
    return ids.transpose(perm) if perm else ids


def _ints(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def device_groups(text: str, num_devices: int) -> list[list[int]]:
    """The device groups of a ``replica_groups`` / ``source_target_pairs`` text (pairs for a permute).

    Forms: ``{{0,1},{2,3}}``, ``{}`` (all devices), the iota forms ``[2,4]<=[8]`` and
    ``[4,2]<=[2,4]T(1,0)``, and ``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}`` (optionally with
    ``device_ids=([4,2]T(1,0))``): devices laid out in that shape, a group varying along the
    named axes (only the first group is returned for this form).

    Example::

        >>> from partitioning.plan.axes import device_groups
        >>> device_groups("[2,4]<=[8]", 8)
        [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> device_groups("[4,2]<=[2,4]T(1,0)", 8)[0]
        [0, 4]
        >>> device_groups("mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", 8)
        [[0, 2, 4, 6]]
    """
    text = text.strip()
    if not text or text == "{}":
        return [list(range(num_devices))]
    if text.startswith("{{"):
        return [_ints(g) for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m:
        return _iota(_ints(m.group(2)), _ints(m.group(3))).reshape(_ints(m.group(1))[0], -1).tolist()
    m = re.fullmatch(r"mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", text)
    if m:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        sizes = [int(n) for _, n in axes]
        ids = _iota(_ints(m.group(2)), _ints(m.group(3))) if m.group(2) else np.arange(math.prod(sizes))
        ids = ids.reshape(sizes)
        chosen = set(re.findall(r"'([^']+)'", m.group(4)))
        index = tuple(slice(None) if name in chosen else 0 for name, _ in axes)
        return [ids[index].reshape(-1).tolist()]
    return []


def group_axes(text: str, mesh: Mapping[str, int], permute: bool = False) -> tuple[str, ...]:
    """The mesh axes (size > 1) a collective's device groups span; ``()`` when it cannot tell.

    Example::

        >>> from partitioning.plan.axes import group_axes
        >>> group_axes("[2,4]<=[8]", {"data": 2, "fsdp": 4})
        ('fsdp',)
        >>> group_axes("{{0,2},{2,4},{4,6},{6,0}}", {"stage": 4, "data": 2}, permute=True)
        ('stage',)
    """
    names, sizes = list(mesh), [int(v) for v in mesh.values()]
    n = math.prod(sizes)
    groups = device_groups(text, n)
    varying: set[int] = set()
    for g in groups if permute else groups[:1]:
        coords = [np.unravel_index(d, sizes) for d in g if d < n]
        for a in range(len(sizes)):
            if len({c[a] for c in coords}) > 1:
                varying.add(a)
    return tuple(names[a] for a in sorted(varying) if sizes[a] > 1)


def _field(op: Any, name: str) -> Any:
    """A field of a collective or of its JSON record (None when the record has no such key)."""
    return op.get(name) if isinstance(op, Mapping) else getattr(op, name)


def collectives_by_axis(
    ops: Sequence[Mapping[str, Any]] | Sequence[Any], mesh: Mapping[str, int]
) -> dict[str, dict[str, dict[str, int]]]:
    """Per mesh axis (or ``"a+b"`` for a collective over several): per kind, executions and bytes per step.

    ``ops`` are :class:`~partitioning.plan.hlo.Collective` s or their ``to_json()`` plus ``groups``.
    """
    out: dict[str, dict[str, dict[str, int]]] = {}
    for c in ops:
        kind, executions = _field(c, "kind"), int(_field(c, "executions"))
        axes = group_axes(_field(c, "groups") or "", mesh, permute=kind == "collective-permute")
        key = "+".join(axes) if axes else "?"
        row = out.setdefault(key, {k: {"count": 0, "bytes": 0} for k in KINDS})
        row[kind]["count"] += executions
        row[kind]["bytes"] += executions * int(_field(c, "bytes"))
    return out


def group_nodes(text: str, ids: np.ndarray, permute: bool = False) -> tuple[int, float]:
    """``(nodes, share)``: how many nodes the widest device group of a collective spans (1: inside one node) and
    the share of its traffic that crosses nodes (a permute's pairs that cross; else 1 or 0). ``ids``: the node
    of each mesh position, flat (:func:`partitioning.mesh.node_ids`).

    Example::

        >>> from partitioning.plan.axes import group_nodes
        >>> ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])       # {data: 2, fsdp: 4} with nodes {data: 2}
        >>> group_nodes("[2,4]<=[8]", ids), group_nodes("[4,2]<=[2,4]T(1,0)", ids)   # over fsdp, over data
        ((1, 0.0), (2, 1.0))
        >>> group_nodes("{{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}", ids, permute=True)
        (2, 0.25)
    """
    n = len(ids)
    groups = device_groups(text, n)
    if permute:
        pairs = [g for g in groups if len(g) == 2 and max(g) < n]
        crossing = sum(1 for a, b in pairs if ids[a] != ids[b])
        return (2 if crossing else 1), (crossing / len(pairs) if pairs else 0.0)
    widest = max((len({int(ids[d]) for d in g if d < n}) for g in groups), default=1)
    return widest, 1.0 if widest > 1 else 0.0


def nodes_by_axis(ids: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """Per mesh axis: how many nodes each of its groups spans (1: the axis stays inside a node). ``ids``: the
    node of each mesh position, in the mesh's shape.

    Example::

        >>> from partitioning.mesh import node_ids
        >>> from partitioning.plan.axes import nodes_by_axis
        >>> nodes_by_axis(node_ids({"data": 4, "fsdp": 8}, {"data": 2, "fsdp": 2}), ["data", "fsdp"])
        {'data': 2, 'fsdp': 2}
    """
    out = {}
    for i, name in enumerate(names):
        moved = np.moveaxis(ids, i, -1).reshape(-1, ids.shape[i])
        out[name] = max(len(set(row.tolist())) for row in moved) if moved.size else 1
    return out


def node_layout(sizes: Mapping[str, int], nodes: Mapping[str, int] | None = None, ids: Any = None) -> dict[str, Any]:
    """How a mesh of ``sizes`` sits on nodes: their count, devices per node, the split (``{axis: nodes}``) and per
    axis the nodes its groups span (what ``plan``, ``check`` and ``train`` print). From ``nodes`` (the plan of
    a ``mesh.nodes``) or ``ids`` (each device's node, :func:`partitioning.mesh.mesh_node_ids`: what was built).

    Example::

        >>> from partitioning.plan.axes import node_layout
        >>> node_layout({"data": 4, "fsdp": 8}, {"data": 4})
        {'count': 4, 'per_node': 8, 'split': {'data': 4}, 'axes': {'data': 4, 'fsdp': 1}}
    """
    if ids is None:
        ids = node_ids(sizes, {a: int(n) for a, n in (nodes or {}).items()})
    axes = nodes_by_axis(np.asarray(ids).reshape([int(s) for s in sizes.values()]), list(sizes))
    count = len(np.unique(ids))
    return {
        "count": count,
        "per_node": math.prod(sizes.values()) // count,
        "split": {a: n for a, n in axes.items() if n > 1},
        "axes": axes,
    }


def memory_by_axis(layouts: Sequence[Any], mesh: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per mesh axis: the logical names it splits, the per-device bytes of the arrays it splits, and those
    bytes were the axis to split nothing (its saving).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(embed=64, mlp=128, layers=4), optax.adamw(1e-3),
        ...                                             batch_size=8, seq_len=16)
        >>> from partitioning.plan.axes import memory_by_axis
        >>> plan = pt.build_plan(params, opt_state, {"data": 1, "fsdp": 2, "tensor": 4}, "fsdp_tp")
        >>> memory_by_axis(plan.params + plan.opt_state, plan.mesh)["tensor"]["splits"]
        ['heads', 'kv_heads', 'mlp', 'vocab']
    """
    out: dict[str, dict[str, Any]] = {}
    for axis, size in mesh.items():
        names: set[str] = set()
        split = 0
        for leaf in layouts:
            hit = [d for d in leaf.dims if axis in axes_tuple(d.mesh_axes)]
            if not hit and not any(axis in axes_tuple(e) for e in leaf.spec if e is not None):
                continue
            names.update(str(d.name) for d in hit)
            split += leaf.per_device_bytes
        out[axis] = {
            "size": int(size),
            "splits": sorted(names),
            "per_device_bytes": split,
            "unsplit_bytes": split * int(size),
        }
    return out


__all__ = [
    "device_groups",
    "group_axes",
    "collectives_by_axis",
    "memory_by_axis",
    "group_nodes",
    "nodes_by_axis",
    "node_layout",
]
