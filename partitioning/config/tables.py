"""A config laid out with another rule table, on a mesh that uses that table's axes (``partitioning compare``).

Comparing tables on one mesh misleads: on the quickstart's ``{data: 1, fsdp: 8,
tensor: 1}`` the ``fsdp_tp`` table is ``fsdp`` (its tensor axis has size 1) and
``tp`` or ``dp`` replicate everything over an ``fsdp`` axis they never use. So
each table gets its own mesh, in this order:

1. the one given for it (``--mesh``);
2. the config's own mesh, when the table is the config's own ``rules``;
3. the mesh the table is meant for: the ``mesh:`` of its preset or rules
   file, fitted to the model and the devices when it does not divide them
   (the mesh over the same axes closest to it that does);
4. the config's mesh, when the table uses all of its axes;

else one error asking for a mesh.

Example::

    >>> from partitioning.config.tables import table_layout
    >>> t = table_layout("configs/quickstart.yaml", [], "tp", devices=8)
    >>> t.plan.mesh, t.source
    ({'data': 2, 'tensor': 4}, 'the mesh of rules tp')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from partitioning.config.build import batch_from_config, grad_accum
from partitioning.config.load import load_config
from partitioning.config.planning import plan_from_config
from partitioning.config.schema import Config
from partitioning.data.batch import batch_specs
from partitioning.errors import ConfigError, PartitioningError
from partitioning.fmt import fmt_mesh
from partitioning.plan.plan import Plan
from partitioning.rules import Rules, table_mesh
from partitioning.tune.space import factorizations

# Meshes tried when a table's own mesh does not fit the model (8 devices have at most 10 over 3 axes).
MAX_TRIES = 12


@dataclasses.dataclass
class TableLayout:
    """One table of a comparison: the config with the table and its mesh applied, its plan, and why this mesh."""

    table: str
    cfg: Config
    plan: Plan
    source: str
    overrides: list[str]


def candidates(shape: Mapping[str, int], devices: int) -> list[dict[str, int]]:
    """Meshes over ``shape``'s axes for ``devices``, closest to ``shape`` first.

    Closest: fixed sizes nearest the asked ones (by ratio), then the most axes
    doing work (size > 1), then the largest ``-1`` axis.
    """
    axes = list(shape)

    def score(sizes: dict[str, int]) -> tuple[float, ...]:
        off = sum(abs(math.log(sizes[a] / s)) for a, s in shape.items() if s != -1)
        rest = sum(sizes[a] for a, s in shape.items() if s == -1)
        working = sum(1 for s in sizes.values() if s > 1)
        return (round(off, 9), -working, -rest)

    out = [dict(zip(axes, f, strict=True)) for f in factorizations(devices, len(axes))]
    return sorted(out, key=score)


def _fits(path: str, sets: Sequence[str], devices: int) -> tuple[Config, Plan] | str:
    """(config, plan) when the layout is one the train step accepts, else the reason it is not."""
    try:
        cfg = load_config(path, list(sets))
        plan, _ = plan_from_config(cfg, devices)
        if plan.errors:
            return plan.errors[0]
        t = cfg.train
        micro = t.batch_size // grad_accum(cfg)
        batch_specs(batch_from_config(cfg), cfg.rules, plan.mesh, micro_batch=micro)
    except PartitioningError as e:
        return str(e).splitlines()[0]
    return cfg, plan


def _same_table(cfg: Config, table: str) -> bool:
    return isinstance(cfg.raw.get("rules"), str) and cfg.raw["rules"] == table


def table_layout(
    path: str, sets: Sequence[str], table: str, devices: int, mesh: Mapping[str, int] | None = None
) -> TableLayout:
    """The config at ``path`` (with ``sets``) laid out with ``table`` on the mesh chosen as the module says.

    ``mesh``: the mesh given for this table (``--mesh``); used as it is.
    """
    base = load_config(path, list(sets))
    rules = [f"rules={table}"]
    if mesh is not None:
        got = _fits(path, [*sets, *rules, f"mesh.shape={fmt_mesh(mesh)}"], devices)
        if isinstance(got, str):
            raise ConfigError(f"--mesh {fmt_mesh(mesh)} for rules {table}: {got}")
        return TableLayout(table, *got, "--mesh", [*rules, f"mesh.shape={fmt_mesh(mesh)}"])
    if _same_table(base, table):
        got = _fits(path, [*sets, *rules], devices)
        if isinstance(got, str):
            raise ConfigError(f"rules {table} on the config's mesh: {got}")
        return TableLayout(table, *got, "the config's mesh", rules)
    try:
        own = table_mesh(table)
    except PartitioningError as e:
        raise ConfigError(f"--rules {table}: {e}") from None
    if own is not None:
        first = None
        # The batch must divide over the batch axes: checked here for every mesh (cheap), planned for the first few.
        batch_axes = Rules.parse(table, path).batch_axes
        micro = base.train.batch_size // grad_accum(base)
        sized = [own, *candidates(own, devices)]
        fitting = [m for m in sized[1:] if micro % math.prod(m.get(a, 1) for a in batch_axes) == 0]
        for sizes in [own, *fitting][:MAX_TRIES]:
            sets_t = [*sets, *rules, f"mesh.shape={fmt_mesh(sizes)}"]
            got = _fits(path, sets_t, devices)
            if not isinstance(got, str):
                source = f"the mesh of rules {table}"
                if sizes is not own:
                    source = f"fitted: the mesh of rules {table}, {fmt_mesh(own)}, does not fit ({first})"
                return TableLayout(table, *got, source, sets_t[len(sets) :])
            first = first or got
        raise ConfigError(
            f"rules {table}: no mesh over {', '.join(own)} fits {devices} devices and this model "
            f"({first}); give one with --mesh"
        )
    got = _fits(path, [*sets, *rules], devices)
    if isinstance(got, str):
        raise ConfigError(
            f"rules {table}: the config's mesh {fmt_mesh(base.mesh.shape)} does not fit it ({got}); "
            f"give the table a mesh: --mesh, or a `mesh:` key in its file"
        )
    return TableLayout(table, *got, "the config's mesh", rules)


def describe(t: TableLayout) -> str:
    """``tp: mesh {data: 2, tensor: 4} (the mesh of rules tp)``."""
    return f"{t.table}: mesh {fmt_mesh(t.plan.mesh)} ({t.source})"


__all__ = ["TableLayout", "table_layout", "candidates", "describe"]
