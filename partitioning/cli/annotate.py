"""``partitioning annotate CONFIG [--out FILE]``: propose an annotation table for a model without names.

Reads the model's abstract variables (nothing allocated), names each unnamed
dimension from the model's sizes with a reason (:mod:`partitioning.propose`), an embedding
table by use (the one its integer inputs index: :mod:`partitioning.model.embeddings`),
groups arrays that differ only by a layer index, and prints the table as YAML
(or writes it to ``--out``), ready for ``base:``. Arrays that already carry
names — their own, or from the config's ``annotations:`` — keep them. Arrays left
unnamed are listed largest first with their share of the state; one over 5% is a warning.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from partitioning.boxes import unbox
from partitioning.cli.args import config_args, say
from partitioning.config.build import abstract_model, batch_from_config, task_from_config
from partitioning.config.load import load_config
from partitioning.config.schema import Config
from partitioning.errors import ConfigError
from partitioning.fmt import fmt_bytes, fmt_shape
from partitioning.model.embeddings import embedding_tables
from partitioning.model.interface import as_model
from partitioning.model.task import model_inputs
from partitioning.propose import Proposal, propose_annotations

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


def proposal_yaml(proposal: Proposal, title: str, kept: Sequence[Any] = ()) -> str:
    """The table as a YAML file a run config extends with ``base:``, each row's reasons as a comment.

    ``kept``: rows that named arrays already (the config's own ``annotations:``), written first.
    """
    read = ", ".join(f"{k} {v}" for k, v in proposal.sizes.items()) or "none"
    out = [
        f"# Annotations proposed by `partitioning annotate` for {title}.",
        f"# Sizes read off the model: {read}.",
        "# A proposal: check each row's reasons, fix what is wrong, then extend a run config",
        "# with `base: <this file>` (a row's names are logical names; the rules decide the mesh axes).",
    ]
    if proposal.named:
        out.append(f"# {len(proposal.named)} arrays already carry names and keep them.")
    unnamed = [str(u) for u in proposal.unnamed]
    for what, items in (("left null (ambiguous)", proposal.ambiguous), ("no rule of thumb names", unnamed)):
        if items:
            out.append(f"# {what}:")
            out += [f"#   {x}" for x in items]
    out.append("annotations:")
    for r in kept:
        out.append(f"  # kept: {r.origin}")
        names = ", ".join("null" if n is None else n for n in r.names)
        out.append(f"  - ['{r.pattern.replace(chr(39), chr(39) * 2)}', [{names}]]")
    for r in proposal.rows:
        many = f", {len(r.paths)} arrays" if len(r.paths) > 1 else ""
        out.append(f"  # {r.paths[0]} {fmt_shape(r.shape)}{many}: {'; '.join(r.reasons)}")
        names = ", ".join("null" if n is None else n for n in r.names)
        out.append(f"  - ['{r.pattern.replace(chr(39), chr(39) * 2)}', [{names}]]")
    return "\n".join(out) + "\n"


def _embeddings(cfg: Config, model: Any, abstract: Any) -> set[str]:
    """The tables the model indexes with its integer inputs (``params/...`` paths): embeddings, by use."""
    args, kwargs = model_inputs(task_from_config(cfg), batch_from_config(cfg))
    if not any(jnp.issubdtype(getattr(x, "dtype", jnp.float32), jnp.integer) for x in jax.tree.leaves((args, kwargs))):
        return set()
    adapter = as_model(model)
    variables = unbox(abstract)

    def forward(params: Any, *a: Any) -> Any:
        return adapter.apply({**variables, "params": params}, a, kwargs, rngs={}, train=False)

    return {f"params/{p}" for p in embedding_tables(forward, variables["params"], *args)}


def _summary(proposal: Proposal) -> str:
    arrays = sum(len(r.paths) for r in proposal.rows)
    out = (
        f"{len(proposal.rows)} rows name {arrays} arrays; {len(proposal.ambiguous)} dimensions left null "
        f"(ambiguous), {len(proposal.unnamed)} arrays unnamed, {len(proposal.named)} already named"
    )
    if proposal.unnamed:
        out += f" (the largest unnamed: {proposal.unnamed[0]})"
    return out


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set or [])
    if args.out and Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: is a folder; give a file name, e.g. annotations.yaml")
    model, abstract = abstract_model(cfg)
    embeddings = _embeddings(cfg, model, abstract)
    proposal = propose_annotations(abstract, input_channels=_input_channels(cfg), embeddings=embeddings)
    # The config's own rows stay first: the file replaces them when it becomes the config's annotations.
    text = proposal_yaml(proposal, f"{cfg.model_name} ({cfg.path})", kept=list(cfg.annotations or ()))
    summary = _summary(proposal)
    for u in proposal.heavy():  # replicated under every rule table: said, with what it costs
        say(
            f"warning: {u.path} {fmt_shape(u.shape)} is unnamed and {u.share:.1%} of the state "
            f"({fmt_bytes(u.nbytes)}): every rule table replicates it; give it a row [regex, [names]]"
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
