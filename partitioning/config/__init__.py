"""Config: YAML run configs, typed, with ``file:line`` errors; and the one place they become objects.

Modules:

- :mod:`~partitioning.config.schema` — the typed sections (``mesh``, ``train``, ``optimizer``, ...) and defaults.
- :mod:`~partitioning.config.load` — YAML -> :class:`Config`, ``--set`` overrides, every error at ``file:line``.
- :mod:`~partitioning.config.targets` — ``_target_`` objects (Hydra's convention): imported beside the config,
  built recursively, options checked against the constructor.
- :mod:`~partitioning.config.build` — Config -> mesh, model, optimizer, task, trainer
  (imported on its own: it brings the reference models).
- :mod:`~partitioning.config.run` — Config -> a run's batches, checkpoint hook and trackers.
- :mod:`~partitioning.config.planning` — Config -> the plan and the compiled view of the train step.
- :mod:`~partitioning.config.preflight` — every check ``train`` makes, before anything is compiled or written.

Example::

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("{model: {name: mlp}, mesh: {shape: {data: 1, fsdp: -1}}, rules: fsdp,"
    ...                     " train: {steps: 20, batch_size: 8, seq_len: 16}}")
    >>> cfg = pt.load_config(path, overrides=["train.steps=50"])
    >>> cfg.train.steps, cfg.rules[0]
    (50, ('batch', ('data', 'fsdp')))
"""

from partitioning.config.load import load_config, load_rules_file
from partitioning.config.schema import Config

__all__ = ["Config", "load_config", "load_rules_file"]
