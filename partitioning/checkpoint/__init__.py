"""Checkpoint: sharded orbax checkpoints that restore onto any mesh and rule table.

Hugging Face and PEFT files are in :mod:`partitioning.hf`.

Modules:

- :mod:`~partitioning.checkpoint.disk` — the on-disk layout: finding steps, reading metadata.
- :mod:`~partitioning.checkpoint.diagnose` — damage -> one :class:`CheckpointError` naming the file.
- :mod:`~partitioning.checkpoint.checksum` — a crc32c of every saved slice, recorded at save, verified on demand.
- :mod:`~partitioning.checkpoint.space` — a full disk: refused before writing, or one error after; nothing half-written.
- :mod:`~partitioning.checkpoint.manager` — ``CheckpointManager``: save every N, keep K (and the best), async.
- :mod:`~partitioning.checkpoint.record` — what a step records besides its arrays: versions, mesh, specs, names.
- :mod:`~partitioning.checkpoint.frozen` — frozen params written once per run; each step refers to them.
- :mod:`~partitioning.checkpoint.base` — a step knows its base: the digest of its frozen params' checksums.
- :mod:`~partitioning.checkpoint.advice` — a refused step's advice: the latest good step, the command's flag.
- :mod:`~partitioning.checkpoint.restore` — ``abstract_target`` and ``restore_checkpoint`` (a target, or mesh + rules).
- :mod:`~partitioning.checkpoint.reader` — fast restore reads: each device slice from tensorstore to its device.
- :mod:`~partitioning.checkpoint.target` — restore targets read off a checkpoint: its arrays on a new mesh and rules.
- :mod:`~partitioning.checkpoint.reshard` — ``reshard_checkpoint``: rewrite a checkpoint for another layout.
- :mod:`~partitioning.checkpoint.hook` — ``CheckpointHook``: resume, save every K steps, save on exit.
- :mod:`~partitioning.checkpoint.integrity` — restore-time checks: missing parts, truncated files, crc32c as read.
- :mod:`~partitioning.checkpoint.keep` — ``KeepGood``: damaged steps never count toward ``keep``.
- :mod:`~partitioning.checkpoint.quiet` — after a failed read, the reads still in flight stay silent.

Imports: the core modules, :mod:`partitioning.finetune` (frozen params apart) and :mod:`partitioning.train`
(the state a hook saves).

Example::

    >>> import pathlib, tempfile
    >>> from partitioning.models import MLP
    >>> x, mesh = jnp.zeros((8, 16), jnp.int32), pt.make_mesh({"data": 1, "fsdp": -1})
    >>> abstract = jax.eval_shape(MLP().init, jax.random.key(0), x)
    >>> shardings = pt.tree_shardings(abstract, mesh, "fsdp")
    >>> params = pt.unbox(jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), x))
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> with pt.CheckpointManager(run / "checkpoints", every=100, keep=3, rules="fsdp") as mngr:
    ...     _ = mngr.save(100, params)
    >>> tp_mesh = pt.make_mesh({"data": 1, "tensor": -1})   # another mesh and rule table
    >>> params = pt.restore_checkpoint(run, pt.abstract_target(abstract, tp_mesh, "tp"))
    >>> params["params"]["wi_0"].sharding.spec
    P(None, 'tensor')
"""

from partitioning.checkpoint.hook import CheckpointHook
from partitioning.checkpoint.manager import CheckpointManager, save_checkpoint
from partitioning.checkpoint.reshard import reshard_checkpoint
from partitioning.checkpoint.restore import abstract_target, checkpoint_metadata, restore_checkpoint

__all__ = [
    "CheckpointManager",
    "CheckpointHook",
    "save_checkpoint",
    "abstract_target",
    "restore_checkpoint",
    "checkpoint_metadata",
    "reshard_checkpoint",
]
