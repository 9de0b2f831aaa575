"""What ``probust estimate`` and ``probust certify`` share: settings from flags, and running a
prepared results folder with the same messages (warnings, one-line errors, the summary)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["flags_of", "run_prepared", "settings_of"]


def flags_of(cls: Any) -> dict[str, str]:
    """Every argument of ``cls`` (a settings dataclass) and of the file options, and the flag
    that sets it (errors name arguments; see :func:`probust.cli.flags.message`)."""
    from probust.cli.flags import flag_map
    from probust.data import FileOptions

    return flag_map(cls, FileOptions)


def settings_of(args: argparse.Namespace, cls: Any) -> Any:
    """The ``cls`` settings of the flags given (the others keep their defaults); the file
    options go to ``data_options``.

    Raises:
        ProbustError: a bad value (``field`` names the argument).
    """
    from probust.cli.flags import values
    from probust.data import FileOptions

    file_options = values(args, FileOptions)
    return cls(**values(args, cls), data_options=file_options or None)


def run_prepared(
    command: str,
    args: argparse.Namespace,
    cls: Any,
    prepare: Callable[..., Any],
    execute: Callable[[Any], Any],
) -> int:
    """Build ``cls`` from the flags, ``prepare(settings, argv=...)`` and ``execute(plan)``;
    returns the exit status.

    A bad argument (found by either step before any work) is a one-line usage error naming its
    flag (exit status 2); a failure after the checks (a damaged part file, a model returning NaN,
    a full disk) one line (status 1), the finished work units kept for the next run; an
    interruption 130.
    """
    from probust._extras import MissingExtraError
    from probust.cli import UsageError
    from probust.cli.flags import message
    from probust.errors import ProbustError
    from probust.run import ConfigError

    try:
        settings = settings_of(args, cls)
        plan = prepare(settings, argv=sys.argv[1:] if sys.argv else None)
    except MissingExtraError:
        raise  # not a usage error: probust.cli.main names the extra to install
    except ProbustError as exc:
        raise UsageError(message(exc, flags_of(cls))) from None
    quiet = not settings.show_progress
    main = plan.world.is_main
    if not quiet and main:
        for note in plan.warnings:
            print(f"probust {command}: warning: {note}", file=sys.stderr)
    try:
        summary = execute(plan)
    except ConfigError as exc:
        # Found before any unit ran (estimate's tied prediction): a usage error.
        raise UsageError(message(exc, flags_of(cls))) from None
    except (RuntimeError, ValueError, OSError) as exc:
        # Options named by their flags, also for a setting only the work can check (a memory
        # budget too small for the model).
        shown = message(exc, flags_of(cls)) if isinstance(exc, ProbustError) else str(exc)
        text = shown.strip().splitlines()[0] if shown.strip() else ""
        print(f"probust {command}: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if main:
            print(
                f"probust {command}: interrupted; finished work units are kept in {args.out}: "
                "run the same command again to compute the rest",
                file=sys.stderr,
            )
        return 130
    if not quiet and main:
        where = summary.merged if summary.merged is not None else summary.path / "parts"
        print(
            f"probust {command}: {summary.rows_total} rows in {where} "
            f"({summary.rows_present} already there, {summary.rows_total - summary.rows_present} computed) "
            f"in {summary.seconds:.1f} s",
            file=sys.stderr,
        )
    return 0
