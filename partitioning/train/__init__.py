"""Train: a sharded state, a jitted step, the data that feeds it and the loop that drives it.

Modules:

- :mod:`~partitioning.train.model` — Flax Linen, Flax NNX and plain-function models behind one interface.
- :mod:`~partitioning.train.axis_names` — models written for ``pmap``: their collective axis names bound (size 1).
- :mod:`~partitioning.train.lora` — ``LoRA`` options: rank, alpha, targets (regexes over parameter paths), checks.
- :mod:`~partitioning.train.lora_model` — ``LoRAModel``: LoRA on any model, adapters merged into the weights.
- :mod:`~partitioning.train.tracing` — a model's own failure while traced -> one ``ModelError`` line.
- :mod:`~partitioning.train.task` — what the model is trained to do: built-in losses, custom losses and steps.
- :mod:`~partitioning.train.batch` — a step's batch: names, shardings, micro-batches, host -> devices, RNG keys.
- :mod:`~partitioning.train.state` — ``TrainState``, the abstract (``eval_shape``) state, host-side step.
- :mod:`~partitioning.train.step` — ``Trainer``: the sharded init and the jitted train / eval steps.
- :mod:`~partitioning.train.lowering` — what a Trainer shows without running: layouts, lowered steps, init peak, FLOPs.
- :mod:`~partitioning.train.trainable` — ``trainable`` regexes: the params that train; the params tree split.
- :mod:`~partitioning.train.optimizer` — optax optimizers and learning-rate schedules.
- :mod:`~partitioning.train.sources` — where tokens come from: text files (bytes), ``.npy`` / ``.bin`` token arrays.
- :mod:`~partitioning.train.tokenize` — text -> tokens with a ``tokenizer.json``: BOS / EOS per document, cached.
- :mod:`~partitioning.train.order` — the grain ``MapDataset`` s: seeded example order, each process's rows.
- :mod:`~partitioning.train.data` — corpora and resumable, per-process global batches (the public API).
- :mod:`~partitioning.train.chat` — a checkpoint's Jinja chat template, rendered as ``transformers`` renders it.
- :mod:`~partitioning.train.instruct` — chat / prompt_completion JSONL rows -> tokens and assistant loss masks.
- :mod:`~partitioning.train.packing` — instruction rows: several examples per row with segment ids and positions.
- :mod:`~partitioning.train.generate` — decoding with a KV cache (``generate``), on a mesh under rules; batches.
- :mod:`~partitioning.train.sampling` — next-token choice as transformers does it: temperature, top-k, top-p.
- :mod:`~partitioning.train.prompts` — ``generate``'s prompt files and stop tokens (``generation_config.json``).
- :mod:`~partitioning.train.loop` — ``fit``: steps, evals, hooks, progress, clean stops.
- :mod:`~partitioning.train.nonfinite` — divergence: the non-finite flag tallied on device; stop or skip_step.
- :mod:`~partitioning.train.lock` — ``RunLock``: one writer per run directory (an ``flock`` naming its holder).
- :mod:`~partitioning.train.hooks` — loop hooks that record a run (``JsonlLogger``).
- :mod:`~partitioning.train.trackers` — TensorBoard and Weights & Biases as loop hooks.
- :mod:`~partitioning.train.plots` — the loss-curve PNG (and ``LossPlot``, the hook that redraws it).

Example::

    >>> from partitioning.models import MLP
    >>> from partitioning.train import Trainer, fit, make_optimizer
    >>> trainer = Trainer(MLP(), make_optimizer("adamw", lr=3e-3, total_steps=4), pt.make_mesh({"data": 1, "fsdp": -1}),
    ...                   "fsdp", batch_size=8, seq_len=16)
    >>> batches = pt.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> state = fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, progress=False)
    >>> int(state.step)
    4
"""

from partitioning.train.batch import place
from partitioning.train.data import Corpus, TokenBatches, load_corpus
from partitioning.train.hooks import JsonlLogger
from partitioning.train.loop import evaluate, fit
from partitioning.train.model import FunctionModel, LinenModel, NNXModel, as_model
from partitioning.train.optimizer import lr_schedule, make_optimizer
from partitioning.train.plots import LossPlot, plot_loss
from partitioning.train.state import TrainState, abstract_train_state
from partitioning.train.step import Trainer
from partitioning.train.task import Task, as_task, lm_loss
from partitioning.train.trackers import TensorBoardLogger, WandbLogger

__all__ = [
    "Trainer",
    "TrainState",
    "abstract_train_state",
    "lm_loss",
    "Task",
    "as_task",
    "LinenModel",
    "NNXModel",
    "FunctionModel",
    "as_model",
    "place",
    "make_optimizer",
    "lr_schedule",
    "Corpus",
    "TokenBatches",
    "load_corpus",
    "fit",
    "evaluate",
    "JsonlLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "LossPlot",
    "plot_loss",
]
