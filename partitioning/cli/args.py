"""Arguments every config command shares, and loading a config with its devices set up.

Devices must be set up before JAX's backend starts, so :func:`load_with_devices`
reads the config first, then simulates CPU devices (or joins the other hosts)
for the mesh it asks for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from partitioning.config.build import config_devices
from partitioning.config.load import load_config
from partitioning.config.schema import Config
from partitioning.devices import initialize_distributed, simulate_devices
from partitioning.errors import MeshError
from partitioning.peers import DEFAULT_TIMEOUT


def say(msg: str) -> None:
    """One line to stderr (progress and notes; stdout stays for results)."""
    print(msg, file=sys.stderr, flush=True)


def leaf(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A sub-command's parser whose ``--help`` starts with what it does (argparse shows ``help`` only in the list)."""
    return sub.add_parser(name, help=help, description=help)


def config_args(p: argparse.ArgumentParser, devices: bool = True) -> None:
    """CONFIG, --set (and --devices)."""
    p.add_argument("config", help="run config YAML")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.steps=50 (repeatable)",
    )
    if devices:
        p.add_argument(
            "--devices", type=int, default=None, help="number of devices (simulated on the CPU when more than visible)"
        )


def resume_args(p: argparse.ArgumentParser, check: bool = False) -> None:
    """``--resume`` / ``--no-resume`` / ``--resume-from N``: the same flags for ``train`` and ``check``."""
    as_ = "check as `train %s` would" if check else "%s"
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--resume",
        dest="resume",
        action="store_true",
        default=None,
        help="check as `train --resume` would (a checkpoint must exist and fit)"
        if check
        else "continue from the latest checkpoint (the default when one exists; error if none or if it is damaged)",
    )
    g.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help=as_ % "--no-resume" if check else "start over (existing checkpoints are moved aside, never deleted)",
    )
    g.add_argument(
        "--resume-from",
        dest="resume_from",
        type=int,
        metavar="STEP",
        default=None,
        help=as_ % "--resume-from STEP"
        if check
        else "continue from this step's checkpoint, not the latest (later steps are moved aside, never deleted)",
    )


def resume_of(args: argparse.Namespace) -> bool | None:
    """``--resume-from`` implies ``--resume``."""
    return True if getattr(args, "resume_from", None) is not None else args.resume


def distributed_args(p: argparse.ArgumentParser) -> None:
    """Flags that join several processes (hosts) into one run; see :mod:`partitioning.devices`."""
    g = p.add_argument_group("multi-host (one process per host)")
    g.add_argument(
        "--distributed",
        action="store_true",
        help="join the other hosts via jax.distributed.initialize() (cluster auto-detection)",
    )
    g.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator service")
    g.add_argument("--num-processes", type=int, metavar="N", help="number of processes in the run")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's id, 0..N-1")
    g.add_argument(
        "--peer-timeout",
        type=float,
        metavar="S",
        default=DEFAULT_TIMEOUT,
        help=f"a process that dies or is silent this many seconds stops all the others, with one line "
        f"(default {DEFAULT_TIMEOUT:g})",
    )


def device_count(args: argparse.Namespace) -> int | None:
    """``--devices``, checked: a positive integer."""
    n = getattr(args, "devices", None)
    if n is not None and n < 1:
        raise MeshError(f"--devices must be a positive number of devices, got {n}", arg="devices")
    return n


def load_with_devices(args: argparse.Namespace, config: str | None = None, simulate: bool = True) -> Config:
    """Loads the config (``args.config`` or ``config``) with ``--set``, then sets up its devices.

    ``simulate=False`` leaves devices alone (a mesh priced from shapes only).
    """
    requested = device_count(args)
    cfg = load_config(config or args.config, getattr(args, "set", None) or [])
    n = config_devices(cfg, requested)
    multi = [getattr(args, k, None) for k in ("coordinator", "num_processes", "process_id")]
    if getattr(args, "distributed", False) or any(v is not None for v in multi):
        timeout = getattr(args, "peer_timeout", DEFAULT_TIMEOUT)
        if not timeout > 0:
            raise MeshError(f"--peer-timeout must be a positive number of seconds, got {timeout:g}", arg="peer_timeout")
        coordinator, num_processes, process_id = multi
        initialize_distributed(coordinator, num_processes, process_id, global_devices=n, peer_timeout=timeout)
    elif simulate:
        try:
            simulate_devices(n, quiet=False)
        except MeshError as e:
            source = "--devices" if requested else cfg.where("mesh", "devices" if cfg.mesh.devices else "shape")
            raise MeshError(f"{source}: {e}") from None
    return cfg


__all__ = ["say", "leaf", "config_args", "distributed_args", "load_with_devices"]
