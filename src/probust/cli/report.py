"""``probust report``: run every experiment on a results folder and write one HTML page."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_EPILOG = """\
examples:
  probust report runs/demo                      # every results folder under runs/demo -> runs/demo/report.html
  probust report results/ --skip runtime case_study --out report/
  probust report results/ --only estimation_error class_bias
  probust report results/ --measure on          # also time the estimators and train the case study's CNNs

On one's own model or data (not a probust-trained model of a built-in data set) the two
experiments that measure (runtime, case_study) are held back unless --measure on or --only
names them.

RESULTS_DIR is a folder written by `probust estimate`, or a folder holding several of them
(one per model). Figures (PNG, SVG) and tables (CSV) go to OUT/experiments/<name>/.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` sub-command."""
    from probust.cli.flags import add_options
    from probust.report import ReportSettings

    p = subparsers.add_parser(
        "report",
        help="run the paper's experiments on results folders and write report.html",
        description="Run every experiment of the paper on the results under RESULTS_DIR (tables from "
        "`probust estimate`) and write one self-contained HTML page with the figures, tables, the "
        "configuration and a reading of each result.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="a results folder, or a folder holding several")
    p.add_argument("--out", metavar="DIR", help="where report.html and experiments/ go (default: RESULTS_DIR)")
    add_options(p, ReportSettings)
    p.add_argument("--quiet", action="store_true", help="print only where the report is")
    p.set_defaults(func=run)


def print_output(output, file=None) -> None:
    """One line per finished experiment (progress of ``probust report`` and ``probust demo``)."""
    file = file if file is not None else sys.stdout
    status = (
        f"skipped: {output.skipped}"
        if output.skipped
        else f"{len(output.figures)} figure(s), {len(output.files)} file(s)"
    )
    print(f"  {output.title}: {status} ({output.seconds:.1f} s)", file=file, flush=True)


def run(args: argparse.Namespace) -> int:
    from probust.cli import UsageError
    from probust.cli.flags import flag_map, message, values
    from probust.errors import ProbustError
    from probust.report import ReportSettings

    try:
        settings = ReportSettings(**values(args, ReportSettings))
    except ProbustError as exc:
        raise UsageError(message(exc, flag_map(ReportSettings))) from None
    import torch

    from probust.experiments import load_results
    from probust.report import build_report

    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        results = load_results(args.results_dir)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a damaged results file, named with what to do
        print(f"probust report: error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    out = args.out if args.out is not None else args.results_dir
    extra = None
    record = Path(args.results_dir) / "demo.json"  # results made by `probust demo`: show how
    if record.is_file():
        try:
            extra = json.loads(record.read_text())
        except ValueError:
            extra = None
    if not args.quiet:
        print(
            f"probust report: {len(results.runs) + len(results.certified)} results folder(s) under "
            f"{args.results_dir}: " + ", ".join(r.label for r in [*results.runs, *results.certified])
        )
    start = time.perf_counter()
    report = build_report(
        results,
        out,
        only=settings.only,
        skip=settings.skip,
        options=settings.experiment_options(),
        title=settings.title,
        extra=extra,
        on_done=None if args.quiet else print_output,
        measure=settings.measure,
    )
    if not args.quiet:
        print(f"report written in {time.perf_counter() - start:.0f} s:")
    print(report.path)
    return 0
