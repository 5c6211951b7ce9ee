"""The ``partitioning`` command line: the command table and the one error contract.

    partitioning check CONFIG [--devices N] [--set k=v ...]
    partitioning rules explain CONFIG [--devices N] [--set k=v ...]
    partitioning annotate CONFIG [--out annotations.yaml] [--set k=v ...]
    partitioning train CONFIG [--set k=v ...]
    partitioning plan CONFIG [--devices N] [--json F] [--png F]
    partitioning compare CONFIG --rules A B ...
    partitioning tune CONFIG [--devices N] [--hardware NAME|FILE] [--device-memory X] [--out best.yaml]
    partitioning ckpt ls|inspect|reshard|export-hf ...
    partitioning generate CONFIG (--prompt TEXT | --prompts FILE) [--chat] [--temperature T] [--top-k K] [--top-p P]
                          [--seed S] [--max-tokens N] [--step N | --from-hf]

Bad input (a :class:`PartitioningError`) prints one line to stderr and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

import partitioning
from partitioning import peers
from partitioning.annotations import AnnotationWarning
from partitioning.checkpoint.quiet import ignore_stray_reads
from partitioning.checkpoint.space import FULL_ERRNOS
from partitioning.cli import annotate, check, ckpt, compare, config, explain, generate, plan, train, tune
from partitioning.cli.args import say
from partitioning.errors import PartitioningError, did_you_mean
from partitioning.replication import ReplicationWarning
from partitioning.resolve import IndivisibleWarning

EXIT_USAGE = 2

# Each command module has HELP, add_arguments(parser) and run(args) -> exit status.
COMMANDS: dict[str, ModuleType] = {
    "check": check,
    "rules": explain,
    "annotate": annotate,
    "train": train,
    "plan": plan,
    "compare": compare,
    "tune": tune,
    "ckpt": ckpt,
    "generate": generate,
    "config": config,
}


def quiet_orbax() -> None:
    """Bad input must print one line: silence orbax's absl logs and stray asyncio noise.

    Orbax logs each failure of its background save threads (with a traceback) before
    raising it where the toolkit catches it and says it in one line (a full disk, a
    damaged file): those logs, and asyncio's, would only repeat it as 100 lines.
    """
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    ignore_stray_reads()


_MOMENT = re.compile(r"^(?:opt_state(?:/[\w.]+)*?/(?:mu|nu|trace|momentum|ema)/|params/)")


def plain_warnings() -> None:
    """The toolkit's own warnings (replication, indivisible fallbacks) print as one ``warning:`` line each."""
    previous = warnings.showwarning
    if getattr(previous, "plain", False):  # installed by an earlier main() in this process
        previous.seen.clear()  # type: ignore[attr-defined]  # each command says each warning once
        return

    seen: set[str] = set()

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, (ReplicationWarning, IndivisibleWarning, AnnotationWarning)):
            text = " ".join(str(message).split())
            # One line per array: its optimizer moments (mu, nu, ...) share the param's layout and its warning.
            key = _MOMENT.sub("", text)
            if key in seen:
                return
            seen.add(key)
            say(f"warning: {text}")
        else:
            previous(message, category, *args, **kwargs)

    show.plain = True  # type: ignore[attr-defined]  # a marker on the function object
    show.seen = seen  # type: ignore[attr-defined]
    warnings.showwarning = show


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``error: MESSAGE; see 'partitioning train --help'`` and exit 2."""

    def error(self, message: str) -> NoReturn:
        for action in self._actions:
            # A missing subcommand: name the choices, not argparse's internal dest (`ckpt_cmd`).
            if isinstance(action, argparse._SubParsersAction) and action.required and action.choices:
                names = {action.dest, str(action.metavar)}
                if any(re.search(rf"required: .*{re.escape(n)}", message) for n in names if n):
                    message = f"missing command: choose one of {', '.join(action.choices)}"
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
    sub = parser.add_subparsers(dest="cmd", parser_class=Parser, metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=getattr(module, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        # A command with sub-commands (rules, ckpt, config) given none prints its help, as bare `partitioning` does.
        p.set_defaults(run=module.run, print_help=_help_of(p))
    parser.set_defaults(run=None, print_help=_help_of(parser))
    return parser


def _help_of(parser: argparse.ArgumentParser) -> Any:
    def show() -> int:
        parser.print_help()
        return 0

    return show


def version() -> str:
    """The installed version: ``partitioning.__version__`` (pyproject reads it from there too)."""
    return partitioning.__version__


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run is None:  # bare `partitioning`: the commands, not an error
        return args.print_help()
    quiet_orbax()
    plain_warnings()
    code = 1
    try:
        code = _run(args)
        return code
    finally:
        peers.goodbye(code)  # the other processes of a multi-host run: this exit is not a death


def _run(args: argparse.Namespace) -> int:
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
    except OSError as e:
        # A full disk (or quota) under any file the run writes (metrics, plots, configs): one line, not a bug.
        if e.errno not in FULL_ERRNOS:
            raise
        say(f"error: {e.filename or 'a file'}: {e.strerror}; free space or write the run elsewhere (run_dir)")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
