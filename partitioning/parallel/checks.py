"""Up-front checks of a pipeline layout: stages, layers, micro-batches and rules fit before anything is traced.

:mod:`partitioning.parallel.pipeline` runs the schedule; these are the checks
it, the Trainer and ``plan`` / ``check`` share, each a :class:`PipelineError`
naming the config key to change.

Example::

    >>> from partitioning.parallel.checks import check_layers
    >>> check_layers([8], stages=4)      # 8 layers over 4 stages: fine
    >>> check_layers([6], stages=4)
    Traceback (most recent call last):
    ...
    partitioning.parallel.checks.PipelineError: ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from partitioning.boxes import is_logical_box
from partitioning.errors import PartitioningError
from partitioning.parallel.schedule import STAGE_AXIS
from partitioning.resolve import axes_tuple, mesh_axis_sizes


class PipelineError(PartitioningError, ValueError):
    """A pipeline layout that cannot run: stages, layers, micro-batches or rules do not fit.

    ``arg`` is ``"stage"`` (the mesh axis) or ``"microbatches"``, so a config
    front end can point at ``mesh.shape.stage`` or ``train.microbatches``.
    """


def pipeline_stages(mesh: Any = None) -> int:
    """``S``: the size of the ``stage`` axis of ``mesh`` (default: the mesh in context); 1 without one.

    Example::

        >>> pt.parallel.pipeline_stages(pt.make_mesh({"stage": 4, "data": 2})), pt.parallel.pipeline_stages()
        (4, 1)
    """
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return 1
    return int(mesh_axis_sizes(mesh).get(STAGE_AXIS, 1))


def check_microbatches(
    mesh: Any, rules: Any, microbatches: int | None, rows: int, what: str = "batch_size", repeats: int = 1
) -> tuple[int, int, str]:
    """What can be checked before the model is traced: ``(M, rows per micro-batch, their description)``.

    ``rows`` is the batch one forward pass sees (``batch_size / grad_accum``).
    Without a ``stage`` axis (size > 1) nothing is pipelined: ``(1, rows, what)``.
    ``repeats`` (the circular schedule) needs ``M >= S``. Raises :class:`PipelineError`
    naming what to change.

    Example::

        >>> from partitioning.parallel.pipeline import check_microbatches
        >>> check_microbatches({"stage": 4, "data": 2}, pt.Rules.preset("pp"), 8, 32)
        (8, 4, 'pipeline micro-batch 4 (batch_size / microbatches 8)')
    """
    if microbatches is not None and (isinstance(microbatches, bool) or int(microbatches) < 1):
        raise PipelineError(f"microbatches must be a positive integer, got {microbatches!r}", arg="microbatches")
    if isinstance(repeats, bool) or int(repeats) < 1:
        raise PipelineError(f"pipeline_repeats must be a positive integer, got {repeats!r}", arg="repeats")
    stages = pipeline_stages(mesh)
    if stages <= 1:
        return 1, rows, what
    types = getattr(mesh, "axis_types", ())
    if any(t == jax.sharding.AxisType.Explicit for t in types):
        raise PipelineError(
            "pipeline stages run on Auto mesh axes (GSPMD places the stage buffers); use axis_types 'auto'",
            arg="axis_types",
        )
    if STAGE_AXIS not in axes_tuple(rules.resolve(("layers",))[0]):
        raise PipelineError(
            f"the mesh has a 'stage' axis of size {stages} but the rules do not put 'layers' on it; "
            "add the rule [layers, stage] (presets pp, pp_fsdp)",
            arg="stage",
        )
    if STAGE_AXIS in rules.batch_axes:
        raise PipelineError(
            "the 'stage' axis cannot also split the batch: remove it from the batch rules "
            "(stages pass micro-batches to each other)",
            arg="stage",
        )
    m = int(microbatches or stages)
    if repeats > 1 and m < stages:
        raise PipelineError(
            f"the circular schedule (pipeline_repeats {repeats}) needs at least as many micro-batches as "
            f"stages: microbatches {m} < {stages} stages; use microbatches >= {stages}",
            arg="microbatches",
        )
    if rows % m:
        raise PipelineError(
            f"{what} cannot be split into {m} pipeline micro-batches; use a multiple of {m}"
            + ("" if microbatches else " (microbatches defaults to the stage axis size)"),
            arg="microbatches",
        )
    return m, rows // m, f"pipeline micro-batch {rows // m} ({what} / microbatches {m})"


def check_layers(layers: Sequence[int], stages: int, repeats: int = 1) -> None:
    """Every stacked ``layers`` dimension (sizes in ``layers``) splits into ``stages`` x ``repeats`` chunks;
    else :class:`PipelineError`.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> from partitioning.parallel.pipeline import check_layers, layers_sizes
        >>> params, _ = pt.abstract_train_state(GPT(layers=4), optax.sgd(0.1), batch_size=8, seq_len=16)
        >>> check_layers(layers_sizes(params), 4)
        >>> check_layers(layers_sizes(params), 2, repeats=2)   # 2 stages x 2 chunks each
        >>> check_layers(layers_sizes(params), 3)
        Traceback (most recent call last):
        ...
        partitioning.parallel.checks.PipelineError: 4 layers cannot be split into 3 pipeline stages: ...
    """
    if stages <= 1:
        return
    if not layers:
        raise PipelineError(
            f"the mesh has a 'stage' axis of size {stages} but the model has no stacked 'layers' "
            "axis to split into stages; stack the repeated block with LayerStack / scan_layers "
            "(GPT: scan_layers: true), or set the stage axis to 1",
            arg="stage",
        )
    for n in sorted(set(layers)):
        if n % stages:
            raise PipelineError(
                f"{n} layers cannot be split into {stages} pipeline stages: the number of layers "
                f"must be a multiple of the stage axis size",
                arg="stage",
            )
        if n % (stages * repeats):
            raise PipelineError(
                f"{n} layers cannot be split into {stages} stages x {repeats} repeats: the number of layers "
                f"must be a multiple of {stages * repeats}",
                arg="repeats",
            )


def layers_sizes(params: Any) -> list[int]:
    """The size of the ``layers`` dimension of every boxed param that has one (abstract or concrete).

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> from partitioning.parallel.pipeline import layers_sizes
        >>> params, _ = pt.abstract_train_state(GPT(layers=4), optax.sgd(0.1), batch_size=8, seq_len=16)
        >>> layers_sizes(params)   # every stacked leaf's `layers` dimension
        [4, 4, 4, 4, 4, 4, 4, 4, 4]
    """
    out = []
    for leaf in jax.tree.leaves(params, is_leaf=is_logical_box):
        if is_logical_box(leaf) and "layers" in tuple(leaf.names):
            out.append(int(leaf.value.shape[tuple(leaf.names).index("layers")]))
    return out


__all__ = ["PipelineError", "pipeline_stages", "check_microbatches", "check_layers", "layers_sizes"]
