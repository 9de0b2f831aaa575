"""``probust estimate``: score a data set into a resumable results table (see probust.run)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

_EPILOG = """\
examples:
  probust estimate --data fashion-mnist --model cnn.pt --sigma 0.05 0.1 0.2 \\
      --methods mc taylor mmse taylor_mvs mmse_mvs softmax --out results/
  probust estimate --data digits --model m.pt --sigma 0.1 --methods mc --mc-samples 100 1000 10000 \\
      --indices 0-99 --out convergence/
  probust estimate --data digits --model m.pt --sigma 0.02 --methods taylor mc_is --p-fail --out tails/
  probust estimate --data photos/ --image-size 32 --model net.ts --sigma 0.05 --methods mc taylor --out r/
  probust estimate --data wine.parquet --label-column target --model mlp.pt --sigma 0.1 \
      --noise-scale std --out wine_results/
  probust estimate --data x.npz --model mypkg.nets:make_net --weights w.pt --sigma 0.1 --noise laplace \
      --methods mc taylor --out r/
  probust estimate --data photos/ --image-size 224 --model torchvision.models:resnet18 \
      --model-arg num_classes=3 --weights w.pt --sigma 0.05 --out r/
  torchrun --standalone --nproc-per-node 4 -m probust estimate ... --device cuda --out results/

Run the same command again to resume an interrupted run: only missing rows are computed
(with the same probust version: see --allow-version-change). With --target prediction a point
whose clean prediction is tied between two classes stops the run before any estimate, naming it.
Read the table with probust.run.read_results(OUT) (also while the run is going).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` sub-command: one flag per declared field of
    :class:`probust.run.RunSettings` (by group) and of :class:`probust.data.FileOptions`."""
    from probust.cli.flags import add_options
    from probust.data import FileOptions
    from probust.run.settings import GROUPS

    p = subparsers.add_parser(
        "estimate",
        help="score a data set's points with estimators of p_robust into a results table",
        description="Estimate p_robust, the probability that a prediction survives Gaussian noise of\n"
        "standard deviation sigma per input coordinate (or the noise of --noise), for every selected point,\n"
        "noise level, method and sample count, into a Parquet results folder that survives interruption.\n"
        "The data may be a built-in data set, a tensor file, a table or a folder of images (docs/estimate.md).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Values are read as words and checked by RunSettings, so that a bad value gets the same
    # one-line message (exit status 2) from the CLI and from Python.
    for group in GROUPS:
        add_options(p, group, required=("data", "model", "sigmas", "out"))
        if group.__name__ == "DataOptions":
            add_options(p, FileOptions)
    p.set_defaults(func=run)


def flags() -> dict[str, str]:
    """Every argument of a run and the flag that sets it (errors name arguments; see
    :func:`probust.cli.flags.message`)."""
    from probust.cli.flags import flag_map
    from probust.data import FileOptions
    from probust.run import RunSettings

    return flag_map(RunSettings, FileOptions)


def settings_from(args: argparse.Namespace) -> Any:
    """The :class:`~probust.run.RunSettings` of the flags given (the others keep their defaults).

    Raises:
        ProbustError: a bad value (``field`` names the argument).
    """
    from probust.cli.flags import values
    from probust.data import FileOptions
    from probust.run import RunSettings

    file_options = values(args, FileOptions)
    return RunSettings(**values(args, RunSettings), data_options=file_options or None)


def run(args: argparse.Namespace) -> int:
    """Run ``probust estimate``; returns the exit status."""
    from probust._extras import MissingExtraError
    from probust.cli import UsageError
    from probust.cli.flags import message
    from probust.errors import ProbustError
    from probust.run import ConfigError, execute, prepare

    try:
        settings = settings_from(args)
        plan = prepare(settings, argv=sys.argv[1:] if sys.argv else None)
    except MissingExtraError:
        raise  # not a usage error: probust.cli.main names the extra to install
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    quiet = not settings.show_progress
    main = plan.world.is_main
    if not quiet and main:
        for note in plan.warnings:
            print(f"probust estimate: warning: {note}", file=sys.stderr)
    try:
        summary = execute(plan)
    except ConfigError as exc:
        # Found by the clean pass before any estimator ran (a tied prediction): a usage error.
        raise UsageError(message(exc, flags())) from None
    except (RuntimeError, ValueError, OSError) as exc:
        # Failures after the checks (a damaged part file, a model returning NaN, a full disk, a
        # setting only the work can check, such as a memory budget too small for the model): one
        # line, options named by their flags, and the finished work units stay for the next run.
        shown = message(exc, flags()) if isinstance(exc, ProbustError) else str(exc)
        text = shown.strip().splitlines()[0] if shown.strip() else ""
        print(f"probust estimate: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if main:
            print(
                f"probust estimate: interrupted; finished work units are kept in {args.out}: "
                "run the same command again to compute the rest",
                file=sys.stderr,
            )
        return 130
    if not quiet and main:
        where = summary.merged if summary.merged is not None else summary.path / "parts"
        print(
            f"probust estimate: {summary.rows_total} rows in {where} "
            f"({summary.rows_present} already there, {summary.rows_total - summary.rows_present} computed) "
            f"in {summary.seconds:.1f} s",
            file=sys.stderr,
        )
    return 0
