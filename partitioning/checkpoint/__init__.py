"""Checkpoint: sharded orbax checkpoints that restore onto any mesh and rule table.

Modules:

- :mod:`~partitioning.checkpoint.disk` — the on-disk layout: finding steps, reading metadata.
- :mod:`~partitioning.checkpoint.diagnose` — damage -> one :class:`CheckpointError` naming the file.
- :mod:`~partitioning.checkpoint.checksum` — a crc32c of every saved slice, recorded at save, verified on demand.
- :mod:`~partitioning.checkpoint.space` — a full disk: refused before writing, or one error after; nothing half-written.
- :mod:`~partitioning.checkpoint.manager` — ``CheckpointManager``: save every N, keep K (and the best), async.
- :mod:`~partitioning.checkpoint.restore` — ``abstract_target`` and ``restore_checkpoint`` (a target, or mesh + rules).
- :mod:`~partitioning.checkpoint.reader` — fast restore reads: each device slice from tensorstore to its device.
- :mod:`~partitioning.checkpoint.target` — restore targets read off a checkpoint: its arrays on a new mesh and rules.
- :mod:`~partitioning.checkpoint.reshard` — ``reshard_checkpoint``: rewrite a checkpoint for another layout.
- :mod:`~partitioning.checkpoint.hook` — ``CheckpointHook``: resume, save every K steps, save on exit.
- :mod:`~partitioning.checkpoint.hf` — ``load_hf`` / ``save_hf`` / ``hf_model``: Hugging Face checkpoints in and out.
- :mod:`~partitioning.checkpoint.hf_files` — ``config.json``, safetensors headers (validated), indexes, writing files.
- :mod:`~partitioning.checkpoint.hf_pattern` — name-map patterns (``"(h k) d -> d h k"``): file boxes of a shard.
- :mod:`~partitioning.checkpoint.hf_map` — a family's name map applied to a model; missing / extra / misshaped tensors.
- :mod:`~partitioning.checkpoint.hf_read` — per-shard reads: each process reads only its devices' bytes.
- :mod:`~partitioning.checkpoint.hf_write` — safetensors out, one tensor gathered at a time.

Example::

    >>> mngr = CheckpointManager("runs/a/checkpoints", every=100, keep=3, rules=rules)
    >>> mngr.save(step, state)
    >>> state = restore_checkpoint("runs/a", abstract_target(abstract_state, new_mesh, new_rules))
"""

from partitioning.checkpoint.hf import hf_family, hf_model, load_hf, save_hf
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
    "load_hf",
    "save_hf",
    "hf_model",
    "hf_family",
]
