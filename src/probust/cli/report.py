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

RESULTS_DIR is a folder written by `probust estimate`, or a folder holding several of them
(one per model). Figures (PNG, SVG) and tables (CSV) go to OUT/experiments/<name>/.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` sub-command."""
    from probust.experiments import EXPERIMENTS

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
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=EXPERIMENTS,
        help=f"run only these experiments: {' '.join(EXPERIMENTS)}",
    )
    p.add_argument(
        "--skip",
        nargs="+",
        default=[],
        metavar="NAME",
        choices=EXPERIMENTS,
        help="leave these experiments out (e.g. runtime case_study, which measure and train)",
    )
    p.add_argument("--title", default="probust report", help="page title")
    g = p.add_argument_group("experiment settings")
    g.add_argument(
        "--runtime-points",
        type=int,
        default=5,
        metavar="N",
        help="points the runtime experiment times (default 5; the paper: 50)",
    )
    g.add_argument(
        "--runtime-sigma",
        type=float,
        default=0.1,
        metavar="S",
        help="noise level of the runtime experiment (default 0.1)",
    )
    g.add_argument("--case-seeds", type=int, default=5, metavar="N", help="repetitions of the case study (default 5)")
    g.add_argument(
        "--case-epochs", type=int, default=30, metavar="N", help="training epochs of the case study's CNN (default 30)"
    )
    g.add_argument(
        "--case-k", type=int, default=25, metavar="K", help="images per class and end in the case study (default 25)"
    )
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="print only where the report is")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace) -> dict:
    return {
        "runtime": {"points": args.runtime_points, "sigma": args.runtime_sigma},
        "case_study": {"seeds": args.case_seeds, "epochs": args.case_epochs, "k": args.case_k},
    }


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

    for name in ("runtime_points", "case_seeds", "case_epochs", "case_k"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads: must be at least 1")
    import torch

    from probust.experiments import load_results
    from probust.report import build_report

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        results = load_results(args.results_dir)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
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
            f"probust report: {len(results)} results folder(s) under {args.results_dir}: "
            + ", ".join(r.label for r in results)
        )
    start = time.perf_counter()
    report = build_report(
        results,
        out,
        only=args.only,
        skip=args.skip,
        options=options_from(args),
        title=args.title,
        extra=extra,
        on_done=None if args.quiet else print_output,
    )
    if not args.quiet:
        print(f"report written in {time.perf_counter() - start:.0f} s:")
    print(report.path)
    return 0
