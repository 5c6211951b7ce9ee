"""The ``partitioning`` command line.

    partitioning check CONFIG [--devices N] [--set k=v ...]
    partitioning rules explain CONFIG [--devices N] [--set k=v ...]
    partitioning train CONFIG [--set k=v ...]
    partitioning plan CONFIG [--devices N] [--json F] [--png F]
    partitioning compare CONFIG --rules A B ...
    partitioning ckpt ls|inspect|reshard ...

Bad input (a :class:`PartitioningError`) prints one line to stderr and exits 2.

Device simulation: a config whose mesh needs more devices than are visible
runs on simulated CPU devices. That needs ``XLA_FLAGS`` set before jax is
imported, so this module imports jax lazily, inside the commands, after
:func:`ensure_devices` has looked at the config.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USAGE = 2

# Each subcommand registers (name, add_arguments, run) here; see the bottom.
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, add_args: Callable[[argparse.ArgumentParser], None]):
    def deco(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (add_args, fn)
        return fn

    return deco


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- device simulation ----------------------------------------------------------

def ensure_devices(n: int | None) -> None:
    """Makes at least ``n`` devices visible, simulating CPU devices if needed.

    Works until jax's backend starts (the first computation or device query);
    after that it can only check, and says how to fix it.
    """
    if not n:
        return
    import jax

    from partitioning.errors import MeshError

    platforms = os.environ.get("JAX_PLATFORMS", "") or jax.config.jax_platforms or ""
    if platforms not in ("", "cpu"):
        return  # a real accelerator platform: never simulate
    try:
        current = jax.config.jax_num_cpu_devices
        if current is not None and current >= n:
            return
        jax.config.update("jax_num_cpu_devices", max(n, current or 0))
    except RuntimeError:  # backend already started
        if jax.device_count() < n:
            raise MeshError(
                f"the config needs {n} devices but jax already started with {jax.device_count()}; "
                f"set JAX_NUM_CPU_DEVICES={n} (or XLA_FLAGS=--xla_force_host_platform_device_count={n}) "
                f"before running"
            ) from None
        return
    if jax.device_count() < n:
        raise MeshError(f"the config needs {n} devices but only {jax.device_count()} are visible")
    if jax.default_backend() == "cpu" and n > 1:
        say(f"simulating {n} CPU devices")


def config_devices(cfg: Any, override: int | None = None) -> int | None:
    """Devices a config asks for: --devices, else mesh.devices, else the product of fixed sizes."""
    if override:
        return override
    if cfg.mesh.devices:
        return cfg.mesh.devices
    sizes = list(cfg.mesh.shape.values())
    if -1 in sizes:
        return None
    import math

    return math.prod(sizes)


def load(args: argparse.Namespace):
    """Loads the config named by ``args.config`` with ``--set`` overrides, then sets up devices."""
    from partitioning.config import load_config

    cfg = load_config(args.config, getattr(args, "set", None) or [])
    n = config_devices(cfg, getattr(args, "devices", None))
    multi = [getattr(args, k, None) for k in ("coordinator", "num_processes", "process_id")]
    if getattr(args, "distributed", False) or any(v is not None for v in multi):
        from partitioning import distributed

        distributed.initialize(*multi, global_devices=n)
    else:
        ensure_devices(n)
    return cfg


def distributed_args(p: argparse.ArgumentParser) -> None:
    """Flags that join several processes (hosts) into one run; see :mod:`partitioning.distributed`."""
    g = p.add_argument_group("multi-host (one process per host)")
    g.add_argument("--distributed", action="store_true",
                   help="join the other hosts via jax.distributed.initialize() (cluster auto-detection)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator service")
    g.add_argument("--num-processes", type=int, metavar="N", help="number of processes in the run")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's id, 0..N-1")


def config_args(p: argparse.ArgumentParser, devices: bool = True) -> None:
    p.add_argument("config", help="run config YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.steps=50 (repeatable)")
    if devices:
        p.add_argument("--devices", type=int, default=None,
                       help="number of devices (simulated on the CPU when more than visible)")


def abstract_model(cfg: Any, batch_size: int | None = None, seq_len: int | None = None):
    """(module, eval_shape of its init) for the config's model, without allocating."""
    import jax
    import jax.numpy as jnp

    from partitioning.registry import build_model

    model = build_model(cfg.model_name, **cfg.model_options)
    b = batch_size or cfg.train.batch_size
    t = seq_len or cfg.train.seq_len
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    return model, jax.eval_shape(model.init, jax.random.key(0), tokens)


def mesh_for(cfg: Any, devices: int | None = None):
    """The config's mesh over its device count (``devices`` overrides, as --devices does)."""
    from partitioning.mesh import make_mesh

    import jax

    n = config_devices(cfg, devices)
    devices = jax.devices()[:n] if n else None
    return make_mesh(cfg.mesh.shape, cfg.mesh.axis_types, devices=devices)


# -- check -----------------------------------------------------------------------

@command("check", config_args)
def cmd_check(args: argparse.Namespace) -> int:
    """Validate a config, its mesh and rules against N devices; print OK or the error."""
    from partitioning.shardings import tree_layouts

    cfg = load(args)
    mesh = mesh_for(cfg, args.devices)
    cfg.rules.validate(mesh)
    _, abstract = abstract_model(cfg)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layouts = tree_layouts(abstract, mesh, cfg.rules, on_indivisible=cfg.on_indivisible)
    for w in caught:
        say(f"warning: {w.message}")
    n_params = sum(l.size for l in layouts)
    print(f"OK: {cfg.path}: model {cfg.model_name} ({n_params:,} parameters, {len(layouts)} arrays) "
          f"on mesh {dict(mesh.shape)} ({mesh.size} devices) with {len(cfg.rules)} rules")
    return 0


# -- rules explain ------------------------------------------------------------------

def _rules_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="rules_cmd", required=True)
    e = sub.add_parser("explain", help="per parameter and dimension, the rule that claimed it")
    config_args(e)


@command("rules", _rules_args)
def cmd_rules(args: argparse.Namespace) -> int:
    """rules explain CONFIG: per parameter and dimension, the rule that claimed it and why others did not."""
    from rich.console import Console
    from rich.table import Table

    from partitioning.shardings import tree_layouts

    cfg = load(args)
    mesh = mesh_for(cfg, args.devices)
    _, abstract = abstract_model(cfg)
    layouts = tree_layouts(abstract, mesh, cfg.rules, on_indivisible=cfg.on_indivisible)
    table = Table(title=f"{cfg.model_name} on mesh {dict(mesh.shape)}: rules from {cfg.path}")
    for col in ("parameter", "dim", "logical", "size", "mesh axes", "claimed by / why not"):
        table.add_column(col, overflow="fold")
    used_rules: set[int] = set()
    names_seen: set[str] = set()
    for l in layouts:
        for d in l.dims:
            if isinstance(d.name, str):
                names_seen.add(d.name)
            if d.rule_index is not None:
                used_rules.add(d.rule_index)
            why = f"rule {d.rule_index} {list(d.rule)}" if d.claimed else "-"
            if d.notes:
                why += "; " + "; ".join(d.notes)
            table.add_row(l.path if d.dim == 0 else "", str(d.dim), str(d.name), str(d.size),
                          "-" if d.mesh_axes is None else str(d.mesh_axes), why)
    Console(width=200).print(table)
    uncovered = sorted(names_seen - set(cfg.rules.logical_names))
    never = [f"rule {i} {list(r)}" for i, r in enumerate(cfg.rules) if i not in used_rules]
    if uncovered:
        print(f"logical names no rule mentions (unsharded): {', '.join(uncovered)}")
    if never:
        print(f"rules that never fire on this model: {', '.join(never)}")
    return 0


# -- entry point --------------------------------------------------------------------

def _load_commands() -> None:
    # Commands that live beside the module they drive register on import.
    for mod in ("partitioning.train_cli", "partitioning.report_cli", "partitioning.checkpoint_cli"):
        try:
            __import__(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def build_parser() -> argparse.ArgumentParser:
    _load_commands()
    parser = argparse.ArgumentParser(
        prog="partitioning",
        description="Logical-axis sharding for JAX/Flax: check, explain, plan, train and checkpoint "
                    "a model under a YAML rule table.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, (add_args, fn) in COMMANDS.items():
        p = sub.add_parser(name, help=(fn.__doc__ or "").strip().split("\n")[0] or None)
        add_args(p)
        p.set_defaults(fn=fn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from partitioning.errors import PartitioningError

    try:
        return int(args.fn(args) or 0)
    except PartitioningError as e:
        say(f"error: {' '.join(str(e).split())}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
