"""How an array is split, for people: which mesh axes split which dimension, then JAX's device grid.

``jax.debug.visualize_array_sharding`` draws a grid of device numbers but not
what its rows and columns are; :func:`show_sharding` says it first, with the
logical names when the array is still in its box.

Example::

    >>> mesh = pt.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    >>> wi = jax.device_put(jnp.zeros((64, 256)), jax.NamedSharding(mesh, jax.P("fsdp", "tensor")))
    >>> pt.show_sharding(pt.LogicallyPartitioned(wi, ("embed", "mlp")))
    (64, 256) float32 P('fsdp', 'tensor') on mesh {data: 1, fsdp: 4, tensor: 2}
      rows: dim 0 (embed, 64) split 4 ways over fsdp: 16 per device
      columns: dim 1 (mlp, 256) split 2 ways over tensor: 128 per device
    ┌───────────────┬─────────────┬───────────────┐
    │               │ mlp [0:128] │ mlp [128:256] │
    ├───────────────┼─────────────┼───────────────┤
    │  embed [0:16] │    CPU 0    │     CPU 1     │
    ├───────────────┼─────────────┼───────────────┤
    │ embed [16:32] │    CPU 2    │     CPU 3     │
    ├───────────────┼─────────────┼───────────────┤
    │ embed [32:48] │    CPU 4    │     CPU 5     │
    ├───────────────┼─────────────┼───────────────┤
    │ embed [48:64] │    CPU 6    │     CPU 7     │
    └───────────────┴─────────────┴───────────────┘
"""

from __future__ import annotations

import math
from typing import Any

from partitioning.boxes import is_box
from partitioning.fmt import fmt_mesh, fmt_spec
from partitioning.resolve import axes_tuple


def _dim_line(i: int, size: int, name: Any, entry: Any, mesh: dict[str, int]) -> str:
    label = f"dim {i} ({name}, {size})" if isinstance(name, str) else f"dim {i} ({size})"
    axes = [a for a in axes_tuple(entry) if mesh.get(a, 1) > 1]
    if not axes:
        return f"{label} not split: {size} per device"
    ways = math.prod(mesh[a] for a in axes)
    return f"{label} split {ways} ways over {' x '.join(axes)}: {-(-size // ways)} per device"


def describe_sharding(x: Any) -> list[str]:
    """The lines :func:`show_sharding` prints before the grid (for an array, or a box holding one).

    Example::

        >>> mesh = pt.make_mesh({"data": -1})
        >>> x = jax.device_put(jnp.zeros((8, 4)), jax.NamedSharding(mesh, jax.P("data")))
        >>> pt.show.describe_sharding(x)[1]
        '  rows: dim 0 (8) split 8 ways over data: 1 per device'
    """
    names: tuple[Any, ...] = ()
    if is_box(x):
        names, x = tuple(x.names), x.value
    sharding = x.sharding
    spec = getattr(sharding, "spec", None)
    mesh = dict(sharding.mesh.shape) if hasattr(sharding, "mesh") else {}
    if spec is None:
        return [f"{tuple(x.shape)} {x.dtype} on {len(sharding.device_set)} device(s) ({type(sharding).__name__})"]
    head = f"{tuple(x.shape)} {x.dtype} {fmt_spec(spec)} on mesh {fmt_mesh(mesh)}"
    where = ("rows", "columns") if x.ndim == 2 else ("columns",) if x.ndim == 1 else ()
    lines = [head]
    for i, size in enumerate(x.shape):
        entry = spec[i] if i < len(spec) else None
        name = names[i] if i < len(names) else None
        prefix = f"{where[i]}: " if i < len(where) else ""
        lines.append(f"  {prefix}{_dim_line(i, size, name, entry, mesh)}")
    return lines


def _grid(value: Any, names: tuple[Any, ...]) -> Any:
    """A rich table of the blocks of a 1-D or 2-D array: one cell per block with the devices holding it,
    rows and columns labelled with the index ranges they cover (and the logical names)."""
    from rich.box import SQUARE
    from rich.table import Table

    shape = tuple(value.shape) if value.ndim == 2 else (1, *value.shape)
    blocks: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for device, index in value.sharding.devices_indices_map(tuple(value.shape)).items():
        index = index if value.ndim == 2 else (slice(None), *index)
        key = tuple(sl.indices(n)[:2] for sl, n in zip(index, shape, strict=True))
        blocks.setdefault(key, []).append(device)
    rows = sorted({k[0] for k in blocks})
    cols = sorted({k[1] for k in blocks})

    def label(dim: int, span: tuple[int, int]) -> str:
        name = names[dim] if dim < len(names) and isinstance(names[dim], str) else f"dim {dim}"
        return f"{name} [{span[0]}:{span[1]}]"

    kind = next(iter(value.sharding.device_set)).platform.upper()
    table = Table(box=SQUARE, show_lines=True, show_header=True, header_style="")
    if value.ndim == 2:
        table.add_column("", justify="right")
    for c in cols:
        table.add_column(label(value.ndim - 1, c), justify="center")
    for r in rows:
        cells = [f"{kind} " + ",".join(str(d.id) for d in sorted(blocks[(r, c)], key=lambda d: d.id)) for c in cols]
        table.add_row(*([label(0, r)] if value.ndim == 2 else []), *cells)
    return table


def show_sharding(x: Any) -> None:
    """Prints which mesh axes split which dimension of ``x``, then a grid of its blocks and the devices holding
    each (what ``jax.debug.visualize_array_sharding`` draws, with the rows and columns labelled).

    ``x`` is a 1-D or 2-D ``jax.Array`` or a box holding one
    (``LogicallyPartitioned``, Flax's ``nn.Partitioned``): a box adds the
    logical names. Arrays of more dimensions get the lines only.

    Example::

        >>> mesh = pt.make_mesh({"data": 1, "fsdp": -1})
        >>> w = jax.device_put(jnp.zeros((64, 256)), jax.NamedSharding(mesh, jax.P("fsdp")))
        >>> pt.show_sharding(pt.LogicallyPartitioned(w, ("embed", "mlp")))  # doctest: +ELLIPSIS
        (64, 256) float32 P('fsdp',) on mesh {data: 1, fsdp: 8}
          rows: dim 0 (embed, 64) split 8 ways over fsdp: 8 per device
          columns: dim 1 (mlp, 256) not split: 256 per device
        ...
    """
    from rich.console import Console

    for line in describe_sharding(x):
        print(line)
    names = tuple(x.names) if is_box(x) else ()
    value = x.value if is_box(x) else x
    if value.ndim in (1, 2) and hasattr(value.sharding, "devices_indices_map"):
        Console(width=100, highlight=False).print(_grid(value, names))


__all__ = ["show_sharding", "describe_sharding"]
