"""``partitioning config schema|show``: the config's JSON Schema, and a config fully resolved.

``schema`` prints the JSON Schema of a run config (point your editor's YAML
support at it to complete and check configs). ``show CONFIG`` prints the
config with every default filled in, ``base:`` and ``--set`` applied, the rule
tables written out and the mesh sizes resolved for the device count — what
``partitioning train`` writes to ``run_dir/config.yaml``.
"""

from __future__ import annotations

import argparse
import json

from partitioning.cli.args import config_args, leaf, load_with_devices
from partitioning.cli.compiling import plan_devices
from partitioning.config.build import model_options_resolved
from partitioning.config.schema import json_schema
from partitioning.errors import MeshError
from partitioning.plan.plan import mesh_sizes

HELP = "the config's JSON Schema (schema), or a config with every default resolved (show)"
EXAMPLES = """examples:
  partitioning config schema > partitioning.schema.json
  partitioning config show configs/quickstart.yaml --set train.steps=50"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_cmd", metavar="{schema,show}")
    leaf(sub, "schema", "print the JSON Schema of a run config (for editors that complete and check YAML)")
    config_args(leaf(sub, "show", "print a config fully resolved: every default, base: and --set applied, mesh sizes"))


def run(args: argparse.Namespace) -> int:
    if args.config_cmd is None:
        return args.print_help()
    if args.config_cmd == "schema":
        print(json.dumps(json_schema(), indent=1))
        return 0
    cfg = load_with_devices(args, simulate=False)
    devices = plan_devices(cfg, args.devices)
    try:
        sizes = mesh_sizes(cfg.mesh.shape, devices)
    except MeshError as e:
        raise MeshError(f"{cfg.where('mesh', 'shape')}: {e}") from None
    print(cfg.to_yaml(sizes, model_options_resolved(cfg)), end="")
    return 0
