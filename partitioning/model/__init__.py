"""Model: any model behind one interface, and the task it is trained on.

A Flax Linen module, a Flax NNX module or a pair of plain functions is adapted
once (:func:`as_model`) and every later stage — the train step, ``plan``,
checkpoints, LoRA, the pipeline — calls that interface and never asks which
kind it holds. The task says how a batch becomes the model's inputs and what
the loss of its outputs is.

Modules:

- :mod:`~partitioning.model.interface` — Flax Linen, Flax NNX and plain-function models behind one interface.
- :mod:`~partitioning.model.axis_names` — models written for ``pmap``: their collective axis names bound (size 1).
- :mod:`~partitioning.model.tracing` — a model's own failure while traced -> one ``ModelError`` line.
- :mod:`~partitioning.model.task` — what the model is trained to do: built-in losses, custom losses and steps.
- :mod:`~partitioning.model.annotated` — a model whose variables come out named by an annotation table.
- :mod:`~partitioning.model.registry` — ``register_model``: a model class a YAML config can name, options checked.
- :mod:`~partitioning.model.embeddings` — which parameters a model uses as embedding tables, found by tracing it.

Imports: the core modules (``partitioning/*.py``) only.

Example::

    >>> from partitioning.model import as_model, as_task
    >>> adapter = as_model(nn.Dense(4))
    >>> adapter.kind, as_task("next_token").name
    ('linen', 'next_token')
"""

from partitioning.model.interface import FunctionModel, LinenModel, NNXModel, as_model
from partitioning.model.registry import build_model, model_names, register_model
from partitioning.model.task import Task, as_task, lm_loss

__all__ = [
    "as_model",
    "LinenModel",
    "NNXModel",
    "FunctionModel",
    "Task",
    "as_task",
    "lm_loss",
    "register_model",
    "build_model",
    "model_names",
]
