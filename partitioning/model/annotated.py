"""A model whose variables come out named by an annotation table (``annotations:``, :mod:`partitioning.annotations`).

The table names parameters by path for a model nobody annotated; wrapping the model's adapter here means
everything built from its boxed variables — the trainer's state, ``plan``, checkpoints — sees the names.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from partitioning.annotations import as_annotations
from partitioning.model.interface import as_model


def annotated_model(model: Any, annotations: Any) -> Any:
    """The model's adapter (:func:`~partitioning.as_model`) whose variables come out annotated.

    Everything built from the adapter's boxed variables (the trainer's state and
    its optimizer state, ``plan``, checkpoints' recorded names) then sees the names.

    Example::

        >>> from partitioning.model.annotated import annotated_model
        >>> model = annotated_model(nn.Dense(64), [[r"kernel$", ["embed", "mlp"]], [r"bias$", ["mlp"]]])
        >>> model.abstract((jnp.zeros((8, 32)),), {})["params"]["kernel"].names
        ('embed', 'mlp')
    """
    adapter = as_model(model)
    table = as_annotations(annotations)
    if not table:
        return adapter
    if getattr(adapter, "annotations", None) is table:
        return adapter
    out = copy.copy(adapter)
    boxed = adapter.boxed

    def annotated(rng: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        return table.apply(boxed(rng, args, kwargs))

    out.boxed = annotated
    out.annotations = table
    return out


__all__ = ["annotated_model"]
