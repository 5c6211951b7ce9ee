"""Every mesh axis of a config does work: one a rule table never uses is a mistake, said before anything runs.

A mesh axis of size ``n > 1`` that no rule maps a name onto, that splits no
batch and that no parameter names directly makes every device along it repeat
the same work (a typo such as ``--set mesh.shape.tensr=2``, or ``--set
rules=tp`` on a mesh whose ``fsdp`` axis only ``fsdp`` uses). ``check``,
``train``, ``plan``, ``compare``, ``tune`` and ``rules explain`` refuse it with
one line, naming the key and the nearest axis name. Kept on purpose: size 1,
or listed in ``mesh.unused_axes``.

Example::

    >>> from partitioning.config.axes import check_axes_used
    >>> cfg = pt.load_config("configs/quickstart.yaml", ["mesh.shape.tensr=2"])
    >>> check_axes_used(cfg, {"data": 1, "fsdp": 4, "tensor": 1, "tensr": 2})
    Traceback (most recent call last):
    partitioning.errors.MeshError: configs/quickstart.yaml (--set mesh.shape.tensr=2): mesh.shape.tensr: no rule uses \
mesh axis 'tensr' (size 2): its 2 devices would repeat the same work (rules fsdp use ...); did you mean 'tensor'? ...
    >>> check_axes_used(pt.load_config("configs/quickstart.yaml"), {"data": 1, "fsdp": 8, "tensor": 1})  # size 1: kept
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from partitioning.config.schema import Config
from partitioning.errors import MeshError, did_you_mean
from partitioning.layout import LeafLayout
from partitioning.plan.coverage import unused_mesh_axes
from partitioning.resolve import axes_tuple

# Names a typo is most likely a misspelling of, besides the axes the rules use.
STANDARD_AXES = ("data", "fsdp", "tensor", "stage", "expert")


def check_axes_used(cfg: Config, sizes: Mapping[str, int], layouts: Iterable[LeafLayout] = ()) -> None:
    """Raises one :class:`MeshError` at ``mesh.shape.AXIS`` for the first axis of size > 1 nothing uses.

    ``layouts``: the parameters' (and optimizer state's) layouts, for models
    annotated with mesh-axis names. Axes in ``mesh.unused_axes`` pass.
    """
    unused = [
        a
        for a in unused_mesh_axes(dict(sizes), cfg.rules, layouts, cfg.optimizer_rules)
        if a not in cfg.mesh.unused_axes
    ]
    if not unused:
        return
    axis = unused[0]
    used = list(dict.fromkeys(a for _, axes in cfg.rules for a in axes_tuple(axes)))
    near = did_you_mean(axis, [a for a in dict.fromkeys(used + list(STANDARD_AXES) + list(sizes)) if a != axis])
    n = sizes[axis]
    raise MeshError(
        f"{cfg.where('mesh', 'shape', axis)}: no rule uses mesh axis {axis!r} (size {n}): its {n} devices would "
        f"repeat the same work ({cfg.rules_label(located=False)} use {', '.join(used) or 'no mesh axis'})"
        f"{near + ' Otherwise' if near else ';'} give it size 1, or list it in mesh.unused_axes to keep it",
        arg="mesh",
    )


__all__ = ["check_axes_used", "STANDARD_AXES"]
