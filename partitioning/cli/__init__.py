"""CLI: argument parsing and rendering only; the work is done by the stages below.

Modules:

- :mod:`~partitioning.cli.main` — the command table, ``main``, the one-line error contract (exit 2).
- :mod:`~partitioning.cli.args` — the arguments config commands share; loading a config with its devices.
- :mod:`~partitioning.cli.check` — ``check``: validate a config, mesh and rules against N devices.
- :mod:`~partitioning.cli.explain` — ``rules explain``: which rule claimed each dimension, and why.
- :mod:`~partitioning.cli.annotate` — ``annotate``: a proposed annotation table for a model without names.
- :mod:`~partitioning.cli.train` — ``train``: the main job.
- :mod:`~partitioning.cli.faults` — ``train`` meeting a fault: the run's locks, divergence, the closing summary.
- :mod:`~partitioning.cli.plan` — ``plan``: every parameter's layout, memory and communication.
- :mod:`~partitioning.cli.compare` — ``compare``: several rule tables side by side.
- :mod:`~partitioning.cli.tune` — ``tune``: every candidate layout priced, the best one recommended and written.
- :mod:`~partitioning.cli.tune_report` — ``tune``'s ranked table, recommendation, rejections and best YAML.
- :mod:`~partitioning.cli.ckpt` — ``ckpt ls|inspect|reshard|export-hf``.
- :mod:`~partitioning.cli.export_hf` — ``ckpt export-hf``: a run that started from Hugging Face weights, back out.
- :mod:`~partitioning.cli.generate` — ``generate``: greedy or sampled decoding with a KV cache (a run, HF weights).
- :mod:`~partitioning.cli.config` — ``config show|schema``: the resolved config, the JSON Schema.
- :mod:`~partitioning.cli.compiling` — where the compiled view is computed (here or a child process).
- :mod:`~partitioning.cli.render` — rich tables for the terminal.
- :mod:`~partitioning.cli.preflight` — the one pre-flight ``check`` and ``train`` both run (they agree by construction).

Example::

    $ partitioning train configs/quickstart.yaml
"""

from partitioning.cli.main import main

__all__ = ["main"]
