"""What a checkpoint step records about itself besides its arrays: package versions, the mesh, specs, logical
names and the time (``meta/metadata``, written by :mod:`partitioning.checkpoint.manager`).

Example::

    >>> from partitioning.checkpoint.record import mesh_json, spec_json
    >>> mesh_json(pt.make_mesh({"data": 2, "fsdp": 4}))["shape"], spec_json(jax.P("fsdp", None, ("data", "fsdp")))
    ([2, 4], ['fsdp', None, ['data', 'fsdp']])
"""

from __future__ import annotations

import contextlib
import time
from importlib import metadata as md
from typing import Any

import jax

from partitioning.boxes import is_box
from partitioning.layout import path_str


def versions() -> dict[str, str]:
    """Versions of the packages that wrote a checkpoint."""
    out = {}
    for dist in ("partitioning", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def mesh_json(mesh: Any) -> dict[str, Any]:
    return {
        "axis_names": list(mesh.axis_names),
        "shape": [int(s) for s in mesh.devices.shape],
        "axis_types": [str(t).rsplit(".", 1)[-1] for t in getattr(mesh, "axis_types", ())],
        "devices": int(mesh.devices.size),
    }


def spec_json(spec: Any) -> list[Any]:
    return [None if a is None else a if isinstance(a, str) else list(a) for a in spec]


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def names_by_path(abstract: Any) -> dict[str, list[Any]]:
    """Logical names of every boxed leaf of an abstract tree, by (unboxed) path."""
    leaves = jax.tree_util.tree_flatten_with_path(abstract, is_leaf=is_box)[0]
    out = {}
    for kp, leaf in leaves:
        names = getattr(leaf, "names", None) if is_box(leaf) else None
        if names is not None:
            out[path_str(kp)] = [n if n is None or isinstance(n, str) else list(n) for n in names]
    return out


__all__ = ["versions", "mesh_json", "spec_json", "now_iso", "names_by_path"]
