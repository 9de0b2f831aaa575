"""``probust demo``: train, score, run every experiment and write the report (the main job)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from probust.demo import DemoSummary

_EPILOG = """\
what it does (about 10 minutes on 2 CPU cores; a second run reuses models and results):
  1. trains the Fashion-MNIST linear model and CNN, and the CNN at a few gradient-norm
     regularisation weights lambda (the robust family) and with the RobustLoss
     (CE + mu * mean -log p_robust, mu = 1 at sigma = 0.4), one epoch each;
  2. scores the first 200 test images at sigma = 0.05, 0.1, 0.2, 0.4 with every estimator
     (Monte Carlo n = 1,000, MMSE N = 10), plus a convergence subset and a 1,000-image pool;
  3. certifies the first 100 test images of the main CNN and of the RobustLoss CNN by
     randomized smoothing at sigma = 0.4 (Cohen et al.'s CERTIFY, N0 = 100, N = 5,000);
  4. runs the paper's ten experiments, the robust-training comparison and the certified
     accuracy, and writes OUT/report.html.
Without Fashion-MNIST on the machine it says so and uses scikit-learn's digits.

examples:
  probust demo                      # -> runs/demo/report.html
  probust demo --quick              # a tiny configuration (under a minute), for a smoke test
  probust demo --points 500 --out runs/demo500
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo",
        help="the paper's evaluation end to end on Fashion-MNIST (train, score, report)",
        description="Train the paper's Fashion-MNIST models, score test points with every estimator, run "
        "every experiment and write an HTML report. Every number follows from the seed and the options.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/demo, or runs/demo-quick with --quick)")
    p.add_argument(
        "--points", type=int, metavar="N", help="test points scored at every sigma by every estimator (default 200)"
    )
    p.add_argument("--quick", action="store_true", help="a tiny configuration for tests: well under a minute")
    p.add_argument(
        "--data", metavar="NAME", help="data set (default fashion-mnist, falling back to digits when it is missing)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of training, noise and the case study (default 0)")
    p.add_argument(
        "--jobs", type=int, metavar="N", help="models trained and scored in parallel (default 2; 1 with --quick)"
    )
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads per job (default 1)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=run)


def _command(args: argparse.Namespace, out: str) -> list[str]:
    """The command line that reproduces this run (every option spelled out)."""
    argv = ["probust", "demo", "--out", out, "--seed", str(args.seed)]
    if args.quick:
        argv.append("--quick")
    if args.points is not None:
        argv += ["--points", str(args.points)]
    if args.data is not None:
        argv += ["--data", args.data]
    return argv


def run(args: argparse.Namespace) -> int:
    from probust.cli import UsageError

    if args.points is not None and args.points < 2:
        raise UsageError(f"--points: must be at least 2, got {args.points}")
    for name in ("jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name}: must be at least 1, got {value}")
    from probust import data as pdata
    from probust.cli.report import print_output
    from probust.demo import DemoConfigError, run_demo

    if args.data is not None:
        try:
            pdata.canonical_name(args.data)
        except ValueError as exc:
            raise UsageError(f"--data: {exc}") from None
    out = args.out or ("runs/demo-quick" if args.quick else "runs/demo")
    try:
        summary = run_demo(
            out,
            data=args.data,
            quick=args.quick,
            points=args.points,
            seed=args.seed,
            jobs=args.jobs,
            threads=args.threads,
            verbose=not args.quiet,
            argv=_command(args, out),
            on_output=None if args.quiet else print_output,
            say=say,
        )
    except pdata.ProbustDataError as exc:
        raise UsageError(f"--data: {str(exc).splitlines()[0]}") from None
    except DemoConfigError as exc:
        raise UsageError(str(exc)) from None
    print_summary(summary)
    return 0


def say(text: str) -> None:
    """One line of the demo's progress, printed at once (module-level: the demo's worker processes call it)."""
    print(text, flush=True)


def print_summary(summary: DemoSummary, file: TextIO | None = None) -> None:
    """The terminal summary: each estimator's mean |error| against Monte Carlo at each sigma."""
    import pandas as pd

    from probust.report import error_summary

    file = file or sys.stdout
    report = summary.report
    standard = [r.label for r in report.results.standard()]
    table = error_summary(report.outputs, standard)
    cfg = summary.config
    print("", file=file)
    if not table.empty:
        print(
            f"Mean |p_hat - p_mc| over {cfg.points} test points (Monte Carlo n={cfg.mc_samples:,}, MMSE N={cfg.mmse_samples}):",
            file=file,
        )
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"), file=file)
    rt = report.output("runtime")
    if rt is not None and not rt.skipped:
        t = rt.table
        b = t[t["mode"] == "batched"]
        picks = [(m, n) for m, n in (("taylor", 0), ("mmse", 5), ("mmse", cfg.mmse_samples), ("softmax", 0))]
        parts = []
        for m, n in dict.fromkeys(picks):
            r = b[(b["method"] == m) & (b["n_samples"] == n)]
            if len(r):
                parts.append(f"p^{m}{'' if n == 0 else f' N={n}'} {r['speedup_vs_mc'].iloc[0]:.0f}x")
        if parts:
            print(
                f"Speed-up over {t['speedup_reference'].iloc[0]} (batched, this machine): " + ", ".join(parts),
                file=file,
            )
    cb = report.output("class_bias")
    if cb is not None and not cb.skipped:
        t = cb.table
        t = t[(t["method"] == "mc")] if (t["method"] == "mc").any() else t
        for model, g in t.groupby("model", sort=False):
            r = g.sort_values("sigma").iloc[-1]
            print(
                f"{model}, σ={r['sigma']:g}: least robust class {r['least_robust_class']} (mean p {r['least_robust_mean_p']:.3f}), "
                f"most robust {r['most_robust_class']} ({r['most_robust_mean_p']:.3f}), Kruskal-Wallis p = {r['p_value']:.2g}",
                file=file,
            )
    rt11 = report.output("robust_training")
    if rt11 is not None and not rt11.skipped and rt11.reading:
        import re

        print(re.sub(r"<[^>]+>", "", rt11.reading[0].replace("<sup>", "^")), file=file)
    skipped = [o.name for o in report.outputs if o.skipped]
    if skipped:
        print(f"Experiments not run: {', '.join(skipped)} (see the report)", file=file)
    s = summary.seconds
    print(
        f"\nDone in {s['total']:.0f} s (models {s['train_and_score']:.0f} s, experiments and report {s['experiments_and_report']:.0f} s).",
        file=file,
    )
    print(f"Report: {report.path}", file=file)
