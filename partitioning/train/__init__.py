"""Train: a sharded state, a jitted step, and the loop that drives it with the guards around them.

Modules:

- :mod:`~partitioning.train.state` — ``TrainState``, the abstract (``eval_shape``) state, host-side step.
- :mod:`~partitioning.train.step` — ``Trainer``: the jitted train / eval steps.
- :mod:`~partitioning.train.init` — the sharded init (params, then the optimizer state) and ``init_from``.
- :mod:`~partitioning.train.offload` — host offload: state in ``pinned_host`` memory, the update where it runs.
- :mod:`~partitioning.train.lowering` — what a Trainer shows without running: layouts, lowered steps, init peak, FLOPs.
- :mod:`~partitioning.train.trial` — a default's fitting choices timed on the run's devices, the fastest kept and
  cached by run and devices (every ``auto`` default decides through it).
- :mod:`~partitioning.train.timing` — train steps timed side by side: each choice compiled in threads, stepped in
  turns on one real batch and one state (how the ``auto`` defaults learn which choice is fastest here).
- :mod:`~partitioning.train.optimizer` — optax optimizers and learning-rate schedules.
- :mod:`~partitioning.train.loop` — ``fit``: steps, evals, hooks, progress, clean stops.
- :mod:`~partitioning.train.metrics` — metrics on the host; a masked loss that counts no token is no loss.
- :mod:`~partitioning.train.nonfinite` — divergence: the non-finite flag tallied on device; stop or skip_step.
- :mod:`~partitioning.train.lock` — ``RunLock``: one writer per run directory (an ``flock`` naming its holder).
- :mod:`~partitioning.train.hooks` — loop hooks that record a run (``JsonlLogger``).
- :mod:`~partitioning.train.trackers` — TensorBoard and Weights & Biases as loop hooks.
- :mod:`~partitioning.train.plots` — the loss-curve PNG (and ``LossPlot``, the hook that redraws it).

Imports: the core modules, :mod:`partitioning.model`, :mod:`partitioning.parallel`, :mod:`partitioning.data`,
:mod:`partitioning.finetune` and :mod:`partitioning.plan` (FLOPs and compiled memory of a step).

Example::

    >>> from partitioning.models import MLP
    >>> from partitioning.train import Trainer, fit, make_optimizer
    >>> trainer = Trainer(MLP(), make_optimizer("adamw", lr=3e-3, total_steps=4), pt.make_mesh({"data": 1, "fsdp": -1}),
    ...                   "fsdp", batch_size=8, seq_len=16)
    >>> batches = pt.data.TokenBatches(np.arange(4096) % 256, 8, 16, trainer.batch_sharding)
    >>> state = fit(trainer, trainer.init(jax.random.key(0)), batches, steps=4, progress=False)
    >>> int(state.step)
    4
"""

from partitioning.train.hooks import JsonlLogger
from partitioning.train.loop import fit
from partitioning.train.metrics import evaluate
from partitioning.train.optimizer import lr_schedule, make_optimizer
from partitioning.train.plots import LossPlot, plot_loss
from partitioning.train.state import TrainState, abstract_train_state
from partitioning.train.step import Trainer
from partitioning.train.trackers import TensorBoardLogger, WandbLogger

__all__ = [
    "Trainer",
    "TrainState",
    "abstract_train_state",
    "make_optimizer",
    "lr_schedule",
    "fit",
    "evaluate",
    "JsonlLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "LossPlot",
    "plot_loss",
]
