"""``partitioning annotate CONFIG [--out FILE]``: propose an annotation table for a model without names.

Reads the model's abstract variables (nothing allocated), names each unnamed
dimension from the model's sizes with a reason (:mod:`partitioning.propose`),
groups arrays that differ only by a layer index, and prints the table as YAML
(or writes it to ``--out``), ready for ``base:``. Arrays that already carry
names — their own, or from the config's ``annotations:`` — keep them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import jax.numpy as jnp

from partitioning.cli.args import config_args, say
from partitioning.config.build import abstract_model, batch_from_config, task_from_config
from partitioning.config.load import load_config
from partitioning.config.schema import Config
from partitioning.errors import ConfigError
from partitioning.model.task import model_inputs
from partitioning.propose import propose_annotations

HELP = "propose logical names by parameter path for a model that has none (YAML for `base:`)"
EXAMPLES = """examples:
  partitioning annotate resnet.yaml                          # print the proposal
  partitioning annotate resnet.yaml --out annotations.yaml   # then `base: annotations.yaml` in resnet.yaml"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p, devices=False)
    p.add_argument("--out", metavar="FILE", help="write the proposal here (default: print it)")


def _input_channels(cfg: Config) -> int | None:
    """The channels of an image input (a float array of rank >= 3): a first convolution's input."""
    args, kwargs = model_inputs(task_from_config(cfg), batch_from_config(cfg))
    first = args[0] if args else next(iter(kwargs.values()), None)
    shape: tuple[int, ...] = tuple(getattr(first, "shape", ()))
    dtype = getattr(first, "dtype", None)
    if len(shape) >= 3 and dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        return int(shape[-1])
    return None


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set or [])
    if args.out and Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: is a folder; give a file name, e.g. annotations.yaml")
    _, abstract = abstract_model(cfg)
    proposal = propose_annotations(abstract, input_channels=_input_channels(cfg))
    # The config's own rows stay first: the file replaces them when it becomes the config's annotations.
    text = proposal.to_yaml(f"{cfg.model_name} ({cfg.path})", kept=list(cfg.annotations or ()))
    arrays = sum(len(r.paths) for r in proposal.rows)
    summary = (
        f"{len(proposal.rows)} rows name {arrays} arrays; {len(proposal.ambiguous)} dimensions left null "
        f"(ambiguous), {len(proposal.unnamed)} arrays unnamed, {len(proposal.named)} already named"
    )
    if not args.out:
        print(text, end="")
        say(summary)
        return 0
    out = Path(args.out)
    # Written whole or not at all: a failed write leaves no half file behind.
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"wrote {out}: {summary}; extend your config with `base: {out.name}`")
    return 0
