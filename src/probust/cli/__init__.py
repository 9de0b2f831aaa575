"""The ``probust`` command line: one sub-command per module in this package.

Each sub-command module exposes ``register(subparsers) -> None``, which adds its parser and
sets ``func`` to a callable ``(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from probust._extras import MissingExtraError, missing_extra
from probust.errors import ProbustError

#: MKL's strict reproducible mode: on Intel CPUs with AVX-512 a row of a matrix product then has
#: the same bits whatever the rows of its pass, so a point's number does not depend on its
#: batch (docs/estimate.md, "What probust guarantees"). The command sets it for its own process
#: only, before any product, where the environment has not chosen a mode; ``import probust``
#: leaves a user's process as it is.
STRICT_PRODUCTS = "AUTO,STRICT"

# Sub-command modules, in the order `probust --help` lists them.
_COMMANDS = ("estimate", "certify", "issues", "train", "report", "demo")


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
        try:
            module.register(subparsers)
        except ModuleNotFoundError as exc:  # listed still; running it names the extra to install
            missing = missing_extra(exc, f"probust {name}")
            if missing is None:
                raise
            sub = subparsers.add_parser(
                name, help=f"(needs the {missing.extra!r} extra: pip install 'probust[{missing.extra}]')"
            )
            sub.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            sub.set_defaults(func=_raiser(missing), needs_extra=True)
    return parser


def _raiser(exc: MissingExtraError):
    def run(args: argparse.Namespace) -> int:
        raise exc

    return run


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MKL_CBWR", STRICT_PRODUCTS)  # read by MKL at its first product, still to come
    parser = build_parser()
    # A command whose extra is missing takes any arguments (argparse's REMAINDER does not take a
    # leading flag) and answers with the extra to install.
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "needs_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"probust {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an extra not installed: name it (probust/_extras.py)
        error = missing_extra(exc, f"probust {args.command}")
        if error is None:
            raise
        print(f"probust {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"probust {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
