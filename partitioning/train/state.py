"""The train state: what a step reads and writes, its abstract form, and its host-side step.

:class:`TrainState` holds the step counter, the (unboxed) params and the
optimizer state. :func:`abstract_train_state` traces an init without
allocating, keeping the boxes that carry logical names on params *and*
optimizer state (optax states built from boxed params keep the boxes), so
the plan, the trainer and checkpoints lay it out through one rule table.

Example::

    >>> import optax
    >>> from partitioning.models import MLP
    >>> from partitioning.train.state import state_step
    >>> params, opt_state = pt.abstract_train_state(MLP(), optax.adamw(1e-3), batch_size=8, seq_len=64)
    >>> params["wi_0"].names          # boxed: the plan and the trainer read the names
    ('embed', 'mlp')
    >>> state_step(pt.TrainState(step=jnp.array(200), params={}, opt_state={}))   # a Python int
    200
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax
import jax
import numpy as np

from partitioning.annotations import Annotations, as_annotations, factored_names
from partitioning.boxes import is_box, is_logical_box
from partitioning.data.batch import batch_shapes
from partitioning.finetune.trainable import subset_of
from partitioning.model.annotated import annotated_model
from partitioning.model.task import as_task, model_inputs
from partitioning.paths import path_str


@flax.struct.dataclass
class TrainState:
    """What a train step reads and writes, all unboxed.

    ``collections`` holds the model's mutable state other than params
    (BatchNorm's ``batch_stats``, NNX's RNG counters), keyed by collection.

    Example::

        >>> import optax
        >>> from partitioning.models import MLP
        >>> trainer = pt.Trainer(MLP(), optax.adamw(1e-3), pt.make_mesh({"data": 1, "fsdp": -1}), "fsdp",
        ...                      batch_size=8, seq_len=16)
        >>> state = trainer.init(jax.random.key(0))
        >>> int(state.step), state.params["wi_0"].sharding.spec, list(state.collections)
        (0, P('fsdp', None), [])
    """

    step: Any  # a scalar int32 array (its NamedSharding in Trainer.state_shardings)
    params: Any
    opt_state: Any
    collections: Any = flax.struct.field(default_factory=dict)


def host_scalar(x: Any) -> float:
    """A replicated scalar as a Python float, reading only a local shard (multi-host safe).

    Example::

        >>> from partitioning.train.state import host_scalar
        >>> mesh = pt.make_mesh({"data": -1})
        >>> host_scalar(jax.device_put(jnp.float32(2.5), jax.NamedSharding(mesh, jax.P())))
        2.5
    """
    if isinstance(x, jax.Array):
        x = x.addressable_data(0)
    return float(np.asarray(x))


def state_step(state: Any) -> int:
    """The step of a train state (a :class:`TrainState` or a mapping with ``step``), as an int."""
    step = state["step"] if isinstance(state, Mapping) else state.step
    return int(host_scalar(step))


def strip_foreign_boxes(opt_state: Any, params: Any, annotations: Any = None) -> Any:
    """The optimizer state's names: each moment named as its parameter is, a factored one as the optimizer made it.

    Optax maps over the *values* inside boxes, so a state with another shape keeps the param's names: a
    factored moment (adafactor's ``v_row``/``v_col``, the param's shape less one dimension) gets them less the
    dimension the optimizer dropped (:func:`~partitioning.annotations.factored_names`); any other (the ``(1,)``
    placeholders) is unboxed and stays replicated. ``annotations``' rows for optimizer-state paths
    (``opt_state/...``) then name the moments they match, as :func:`~partitioning.tree_layouts` of a whole state
    applies them (a table, its rows, or the annotated model adapter that carries one).
    """
    shapes = {
        path_str(kp): tuple(b.value.shape)
        for kp, b in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_box)[0]
        if is_logical_box(b)
    }

    def param_shape(path: str) -> Any:
        parts = path.split("/")
        return next((shapes[q] for i in range(len(parts)) if (q := "/".join(parts[i:])) in shapes), None)

    def fix(kp: Any, x: Any) -> Any:
        if not is_logical_box(x):
            return x
        path, shape = path_str(kp), tuple(x.value.shape)
        own = param_shape(path)
        if own == shape:
            return x
        names = factored_names(x.names, own, shape, path) if own is not None else None
        return x.replace(names=names) if names is not None else x.value

    named = jax.tree_util.tree_map_with_path(fix, opt_state, is_leaf=is_box)
    if annotations is not None and not isinstance(annotations, (Annotations, list, tuple)):
        annotations = getattr(annotations, "annotations", None)  # a model adapter: the table it carries, if any
    table = as_annotations(annotations)
    return table.apply_moments(named) if table else named


def abstract_train_state(
    model: Any,
    tx: Any,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    batch: Any = None,
    task: Any = None,
    trainable: Any = None,
    annotations: Any = None,
) -> tuple[Any, Any]:
    """(boxed params, boxed optimizer state) as ShapeDtypeStructs, nothing allocated.

    ``model`` is anything :func:`~partitioning.model.interface.as_model` takes; the
    batch is the language-model shorthand (``batch_size``, ``seq_len``) or any
    ``batch`` pytree. Built the way :class:`partitioning.Trainer` builds its
    state, so the plan's paths and layouts are the trainer's: with ``trainable``
    (regexes, see :mod:`partitioning.finetune.trainable`; LoRA adapters by default when
    the model has some) the optimizer state covers only the trainable params. ``annotations``
    name the model's variables by path, as in the trainer.

    Example::

        >>> import optax
        >>> from partitioning.models import GPT
        >>> params, opt_state = pt.abstract_train_state(GPT(), optax.adamw(1e-3), batch_size=8, seq_len=64)
        >>> opt_state[0].mu["blocks"]["mlp"]["wi_0"].names   # adam's moments keep the names
        ('layers', 'embed', 'mlp')
    """
    adapter = annotated_model(model, annotations)
    batch = batch_shapes(batch, batch_size, seq_len, "abstract_train_state")
    args, kwargs = model_inputs(as_task(task), batch)

    def init(rng):
        params = adapter.boxed(rng, args, kwargs)["params"]
        train = subset_of(params, trainable).trainable(params)
        return params, strip_foreign_boxes(tx.init(train), train, adapter)

    return jax.eval_shape(init, jax.random.key(0))


__all__ = ["TrainState", "host_scalar", "state_step", "strip_foreign_boxes", "abstract_train_state"]
