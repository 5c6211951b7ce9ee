"""What a plan reports as waste: parameters left whole on every device, and mesh axes that split no parameter.

:func:`~partitioning.plan.plan.build_plan` fills ``plan.replicated`` and ``plan.idle_axes`` with these.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> params, opt = pt.abstract_train_state(MLP(), optax.adamw(1e-3), batch_size=8, seq_len=16)
    >>> plan = pt.build_plan(params, opt, {"data": 8}, "dp")        # data parallel: every parameter whole
    >>> [a.axis for a in plan.idle_axes], plan.replicated[0].per_device_cost > plan.replicated[0].bytes
    (['data'], True)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from partitioning.layout import LeafLayout


@dataclasses.dataclass(frozen=True)
class Replicated:
    """A parameter left whole on every device, and what it costs there."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    logical: list[str] | None
    bytes: int  # the parameter's own bytes
    per_device_cost: int  # per device, with its gradient and optimizer state
    share: float  # of a device's state memory


@dataclasses.dataclass(frozen=True)
class IdleAxis:
    """A mesh axis (size > 1) that splits no parameter: the state is copied across it."""

    axis: str
    size: int
    shards_optimizer: bool


def _axes_used(layouts: list[LeafLayout]) -> set[str]:
    used: set[str] = set()
    for leaf in layouts:
        for entry in leaf.spec:
            if isinstance(entry, str):
                used.add(entry)
            elif isinstance(entry, tuple):
                used.update(entry)
    return used


def idle_axes(plan: Any) -> list[IdleAxis]:
    """Mesh axes (size > 1) that split no parameter: state is copied across them."""
    by_params, by_opt = _axes_used(plan.params), _axes_used(plan.opt_state)
    return [IdleAxis(a, n, a in by_opt) for a, n in plan.mesh.items() if n > 1 and a not in by_params]


def replicated_params(plan: Any, top: int) -> list[Replicated]:
    if plan.devices == 1:
        return []
    total = plan.totals["total"]["per_device"] or 1
    out = []
    for leaf in plan.params:
        if not leaf.replicated or leaf.size <= 1:
            continue
        # The optimizer state of a param sits at .../<param path without 'params/'>.
        suffix = leaf.path[len("params/") :]
        opt = [o for o in plan.opt_state if o.path.endswith("/" + suffix) and o.shape == leaf.shape and o.replicated]
        cost = (2 if plan.trains(leaf) else 1) * leaf.per_device_bytes + sum(o.per_device_bytes for o in opt)
        out.append(
            Replicated(
                leaf.path,
                tuple(leaf.shape),
                str(leaf.dtype),
                None if leaf.names is None else [str(n) for n in leaf.names],
                leaf.nbytes,
                cost,
                cost / total,
            )
        )
    out.sort(key=lambda r: -r.per_device_cost)
    return out[:top]


__all__ = ["Replicated", "IdleAxis", "idle_axes", "replicated_params"]
