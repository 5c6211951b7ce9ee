"""``partitioning check CONFIG``: validate a config, its mesh and rules against N devices."""

from __future__ import annotations

import argparse
import warnings

from partitioning.cli.args import config_args, load_with_devices, say
from partitioning.config.build import abstract_model, mesh_from_config
from partitioning.layout import tree_layouts

HELP = "validate a config, its mesh and rules against N devices; print OK or the error"


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)


def run(args: argparse.Namespace) -> int:
    cfg = load_with_devices(args)
    mesh = mesh_from_config(cfg, args.devices)
    cfg.rules.validate(mesh)
    _, abstract = abstract_model(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layouts = tree_layouts(abstract, mesh, cfg.rules, on_indivisible=cfg.on_indivisible)
    for w in caught:
        say(f"warning: {w.message}")
    params = [l for l in layouts if l.path.startswith("params/")]
    n_params = sum(l.size for l in params)
    print(f"OK: {cfg.path}: model {cfg.model_name} ({n_params:,} parameters, {len(params)} arrays) "
          f"on mesh {dict(mesh.shape)} ({mesh.size} devices) with {len(cfg.rules)} rules")
    return 0
