"""``partitioning rules explain CONFIG``: per parameter and dimension, the rule that claimed it and why."""

from __future__ import annotations

import argparse

from partitioning.boxes import compute_spec
from partitioning.cli.args import config_args, leaf, load_with_devices
from partitioning.cli.render import console, explain_table
from partitioning.config.axes import check_axes_used
from partitioning.config.build import abstract_model, batch_from_config, mesh_from_config, task_from_config
from partitioning.fmt import fmt_rule, fmt_spec
from partitioning.layout import tree_layouts
from partitioning.plan.coverage import activation_names, rule_coverage

HELP = "per parameter and dimension, the rule that claimed it and why others did not"
EXAMPLES = """examples:
  partitioning rules explain configs/quickstart.yaml
  partitioning rules explain configs/quickstart.yaml --set rules=fsdp_tp --set mesh.shape.tensor=2"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="rules_cmd", metavar="{explain}")
    config_args(leaf(sub, "explain", HELP))


def run(args: argparse.Namespace) -> int:
    if args.rules_cmd is None:
        return args.print_help()
    cfg = load_with_devices(args)
    mesh = mesh_from_config(cfg, args.devices)
    model, abstract = abstract_model(cfg)
    layouts = tree_layouts(abstract, mesh, cfg.rules, on_indivisible=cfg.on_indivisible, warn_replicated=False)
    check_axes_used(cfg, dict(mesh.shape), layouts)
    collections = {k: v for k, v in abstract.items() if k != "params"}
    acts = activation_names(
        model,
        abstract["params"],
        mesh,
        cfg.rules,
        batch=batch_from_config(cfg),
        task=task_from_config(cfg),
        collections=collections,
    )
    computes = {x.path: fmt_spec(compute_spec(x.names, cfg.rules, mesh)) for x in layouts if x.names is not None}
    out = console()
    out.print(
        explain_table(layouts, computes, title=f"{cfg.model_name} on mesh {dict(mesh.shape)}: {cfg.rules_label()}")
    )
    rules = cfg.rules
    axes = ", ".join(rules.batch_axes) or "none"
    length = [a for a in rules.token_axes if a not in rules.batch_axes]
    over = f"; and the sequence axes {', '.join(length)}" if length else ""
    print(
        f"compute layout: parameters are gathered over the batch axes ({axes}; "
        f"{rules.batch_axes_origin}{over}) before use: 'compute spec' above"
    )
    cov = rule_coverage(layouts, rules, acts, mesh)
    if cov.uncovered:
        print(f"logical names no rule mentions (unsharded): {', '.join(cov.uncovered)}")
    if cov.unused:
        unused = ", ".join(f"rule {u.index} {fmt_rule(u.rule)}" for u in cov.unused)
        print(f"rules that never fire on this model: {unused}")
    return 0
