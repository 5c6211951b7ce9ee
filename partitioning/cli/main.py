"""The ``partitioning`` command line: the command table and the one error contract.

    partitioning check CONFIG [--devices N] [--set k=v ...]
    partitioning rules explain CONFIG [--devices N] [--set k=v ...]
    partitioning train CONFIG [--set k=v ...]
    partitioning plan CONFIG [--devices N] [--json F] [--png F]
    partitioning compare CONFIG --rules A B ...
    partitioning ckpt ls|inspect|reshard ...

Bad input (a :class:`PartitioningError`) prints one line to stderr and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from partitioning.cli import check, ckpt, compare, explain, plan, train
from partitioning.cli.args import say
from partitioning.errors import PartitioningError

EXIT_USAGE = 2

# Each command module has HELP, add_arguments(parser) and run(args) -> exit status.
COMMANDS: dict[str, ModuleType] = {
    "check": check,
    "rules": explain,
    "train": train,
    "plan": plan,
    "compare": compare,
    "ckpt": ckpt,
}


def quiet_orbax() -> None:
    """Bad input must print one line: silence orbax's absl warnings and stray asyncio noise."""
    logging.getLogger("absl").setLevel(logging.ERROR)
    previous = sys.unraisablehook

    def hook(u: Any) -> None:
        # Reads still in flight when orbax gave up on a damaged file finish on a closed loop.
        if isinstance(u.exc_value, RuntimeError) and "Event loop is closed" in str(u.exc_value):
            return
        if "coroutine" in repr(u.object) and "orbax" in repr(getattr(u.object, "cr_code", "")):
            return
        previous(u)

    sys.unraisablehook = hook


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="partitioning",
        description="Logical-axis sharding for JAX/Flax: check, explain, plan, train and checkpoint "
                    "a model under a YAML rule table.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_orbax()
    try:
        return int(args.run(args) or 0)
    except PartitioningError as e:
        # One line per error (a config reports all of its errors at once).
        for line in str(e).splitlines() or [type(e).__name__]:
            say(f"error: {' '.join(line.split())}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
