"""Config: YAML run configs, typed, with ``file:line`` errors; and the one place they become objects.

Modules:

- :mod:`~partitioning.config.schema` — the typed sections (``mesh``, ``train``, ``optimizer``, ...) and defaults.
- :mod:`~partitioning.config.load` — YAML -> :class:`Config`, ``--set`` overrides, every error at ``file:line``.
- :mod:`~partitioning.config.hf` — ``model: {hf: DIR}``: a Hugging Face checkpoint, checked and built; its tokenizer.
- :mod:`~partitioning.config.lora` — ``model.lora`` (or a PEFT ``model.adapter`` setting it): parsed, errors at
  their keys, other models wrapped.
- :mod:`~partitioning.config.merge` — how ``base:`` and ``--set`` combine with what they override (one rule).
- :mod:`~partitioning.config.annotations` — ``annotations:``: the table, each row at its ``file:line``, names checked.
- :mod:`~partitioning.config.targets` — ``_target_`` objects (Hydra's convention): imported beside the config,
  built recursively, options checked against the constructor.
- :mod:`~partitioning.config.build` — Config -> mesh, model, optimizer, task, trainer
  (imported on its own: it brings the reference models).
- :mod:`~partitioning.config.run` — Config -> a run's batches, checkpoint hook and trackers.
- :mod:`~partitioning.config.planning` — Config -> the plan and the compiled view of the train step; the
  tuner's inputs.
- :mod:`~partitioning.config.remat` — ``model.remat: auto`` (the default) -> the policy tune prices fastest here.
- :mod:`~partitioning.config.context` — ``model.context_parallel: auto`` -> the attention strategy tune prices
  faster for a split ``length`` (ring or all_gather).
- :mod:`~partitioning.config.axes` — every mesh axis does work: one no rule uses is an error (did-you-mean).
- :mod:`~partitioning.config.resume` — a run resuming its run dir's checkpoint is that experiment, further on;
  anything else (nothing to train, another model or optimizer) says what to do.
- :mod:`~partitioning.config.rundir` — starting over moves the previous run whole into ``RUN_DIR/previous/``;
  ``checkpoint.dir`` holds checkpoints only, not the user's own files.
- :mod:`~partitioning.config.positions` — a model's learned-position limit against ``train.seq_len`` (and
  ``generate``'s own length), both sources named.
- :mod:`~partitioning.config.foreign` — a file that is not a run config (``tokenizer.json``, ...): one line.
- :mod:`~partitioning.config.preflight` — every check ``train`` makes, before anything is compiled or written.
- :mod:`~partitioning.config.tables` — a config laid out with other rule tables, each on a mesh that uses its
  axes (``compare``).

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
