"""The ``partitioning`` command line: the command table and the one error contract.

    partitioning check CONFIG [--devices N] [--set k=v ...]
    partitioning rules explain CONFIG [--devices N] [--set k=v ...]
    partitioning train CONFIG [--set k=v ...]
    partitioning plan CONFIG [--devices N] [--json F] [--png F]
    partitioning compare CONFIG --rules A B ...
    partitioning tune CONFIG [--devices N] [--hardware NAME|FILE] [--device-memory X] [--out best.yaml]
    partitioning ckpt ls|inspect|reshard ...

Bad input (a :class:`PartitioningError`) prints one line to stderr and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import partitioning
from partitioning.cli import check, ckpt, compare, config, explain, plan, train, tune
from partitioning.cli.args import say
from partitioning.errors import PartitioningError, did_you_mean

EXIT_USAGE = 2

# Each command module has HELP, add_arguments(parser) and run(args) -> exit status.
COMMANDS: dict[str, ModuleType] = {
    "check": check,
    "rules": explain,
    "train": train,
    "plan": plan,
    "compare": compare,
    "tune": tune,
    "ckpt": ckpt,
    "config": config,
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


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``error: MESSAGE; see 'partitioning train --help'`` and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        hint = did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2))) if m else ""
        say(f"error: {' '.join(message.split())}{hint}; see '{self.prog} --help'")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="partitioning",
        description="Logical-axis sharding for JAX/Flax: check, explain, plan, train and checkpoint "
        "a model under a YAML rule table.",
        epilog="Run 'partitioning COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"partitioning {version()}")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for name, module in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=getattr(module, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def version() -> str:
    """The installed version: ``partitioning.__version__`` (pyproject reads it from there too)."""
    return partitioning.__version__


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_orbax()
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe is noticed here, not at exit
        return code
    except BrokenPipeError:
        # `partitioning ... | head`: the reader left; stop quietly (and keep Python from complaining at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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
