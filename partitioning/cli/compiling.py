"""The compiled view from the command line: where to compile a config's train step, and the child that does.

Small meshes compile in this process on simulated CPU devices; larger ones in
a child process (``python -m partitioning.cli.compiling CONFIG --devices N
--out FILE``), because a process holding thousands of CPU devices is slow to
start and to exit. XLA's CPU backend stops at 2048 devices; beyond that the
view is skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from partitioning.config.build import config_devices
from partitioning.config.load import load_config
from partitioning.config.planning import compiled_from_config
from partitioning.config.schema import Config
from partitioning.devices import simulate_devices
from partitioning.errors import ConfigError, MeshError, PartitioningError
from partitioning.plan.compiled import (
    CPU_LIMIT_REASON,
    CPU_MAX_DEVICES,
    compile_in_child,
    failed,
    skipped,
    write_and_exit,
)
from partitioning.plan.plan import Plan

# Meshes up to this size are simulated in this process; larger ones compile in a child.
IN_PROCESS_MAX = 64


def compile_args(p: argparse.ArgumentParser) -> None:
    """--no-compile, --compile-in, --timeout."""
    p.add_argument("--no-compile", action="store_true", help="skip the compiled view (eval_shape table only)")
    p.add_argument(
        "--compile-in",
        choices=("auto", "here", "child"),
        default="auto",
        help="where to compile: this process, a child process with simulated devices, "
        f"or auto (here up to {IN_PROCESS_MAX} devices)",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed for one compile (default 900)")


def plan_devices(cfg: Config, override: int | None) -> int:
    """The device count to plan for: --devices, else the config's, else the visible devices."""
    if override is not None and override < 1:
        raise MeshError(f"--devices must be a positive number of devices, got {override}")
    n = config_devices(cfg, override)
    return n if n is not None else jax.device_count()


def setup_devices(cfg: Config, args: argparse.Namespace) -> tuple[int, bool]:
    """(devices, compile here?). Sets up simulated devices before any jax computation."""
    devices = plan_devices(cfg, args.devices)
    if args.no_compile or args.compile_in == "child":
        return devices, False
    if args.compile_in == "auto" and devices > IN_PROCESS_MAX:
        return devices, False
    try:
        simulate_devices(devices, quiet=False)
    except MeshError:
        if args.compile_in == "here":
            raise
        return devices, False
    return devices, True


def compiled(
    cfg: Config, args: argparse.Namespace, devices: int, here: bool, plan: Plan, extra_set: Sequence[str] = ()
) -> dict[str, Any]:
    """The compiled view (or a ``skipped`` / ``failed`` record saying why there is none)."""
    if args.no_compile:
        return skipped("--no-compile")
    if plan.errors:
        return skipped(f"the train step would refuse this layout: {plan.errors[0]}")
    if here:
        try:
            return compiled_from_config(cfg, devices, plan)
        except PartitioningError as e:
            return failed(str(e))
    if devices > CPU_MAX_DEVICES:
        return skipped(CPU_LIMIT_REASON.format(n=devices))
    child_args = [str(cfg.path), "--devices", str(devices)]
    for s in list(args.set or []) + list(extra_set):
        child_args += ["--set", s]
    return compile_in_child("partitioning.cli.compiling", child_args, devices, timeout=args.timeout)


def write_json(path: str, data: Any) -> None:
    """Writes ``--json FILE`` (one error line if it cannot)."""
    write_text(path, json.dumps(data, indent=1, default=str), "--json")


def write_text(path: str, text: str, flag: str) -> Path:
    """Writes a file a command was asked for with ``flag`` (one error line if it cannot), and says so."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write: {e.strerror}") from None
    print(f"wrote {p}", file=sys.stderr, flush=True)
    return p


def _child(argv: list[str]) -> None:
    """The compile child: ``CONFIG --devices N [--set ...] --out FILE``; writes the view, then ``os._exit``."""
    p = argparse.ArgumentParser(prog="python -m partitioning.cli.compiling")
    p.add_argument("config")
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        cfg = load_config(a.config, a.set)
        simulate_devices(a.devices)
        view = compiled_from_config(cfg, a.devices)
    except PartitioningError as e:
        view = failed(str(e))
    except Exception as e:  # a bug or an XLA failure: the parent reports it on one line
        view = failed(f"{type(e).__name__}: {e}")
    write_and_exit(a.out, view)


if __name__ == "__main__":
    _child(sys.argv[1:])
