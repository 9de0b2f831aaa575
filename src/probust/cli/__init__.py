"""The ``probust`` command line: one sub-command per module in this package.

Each sub-command module exposes ``register(subparsers) -> None``, which adds its parser and
sets ``func`` to a callable ``(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from probust.errors import ProbustError

# Sub-command modules, in the order `probust --help` lists them.
_COMMANDS = ("estimate", "train", "report", "demo")


class UsageError(ProbustError):
    """A bad argument found before any work started: printed on one line, exit status 2 (the
    message already names the flag, in the command's words)."""


def build_parser() -> argparse.ArgumentParser:
    from probust import __version__

    parser = argparse.ArgumentParser(
        prog="probust",
        description="Average-case robustness of classifiers: the probability that a prediction "
        "survives random noise, per data point.",
    )
    parser.add_argument("--version", action="version", version=f"probust {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"probust.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"probust.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"probust {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"probust {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
