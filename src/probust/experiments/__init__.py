"""The paper's evaluation, one module per experiment, each reading results tables.

Every experiment takes the runs found in a results folder (:func:`load_results`) and an
output folder, and writes a tidy CSV and a figure (PNG and SVG)::

    from probust import experiments
    results = experiments.load_results("runs/demo/results")       # every `probust estimate` folder below
    out = experiments.run("estimation_error", results, "runs/demo/experiments")
    out.table            # the tidy table (also estimation_error/estimation_error.csv)
    out.figures          # [.../estimation_error.png]; an .svg lies beside each
    out.reading          # short statements computed from the numbers

or all of them: ``experiments.run_all(results, out_dir)``. :data:`EXPERIMENTS` lists them in the
paper's order. An experiment that finds nothing to work on returns an :class:`Output` whose
``skipped`` says what is missing, instead of raising.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from probust.experiments._base import ExperimentSkipped, Output
from probust.experiments.run_info import Run
from probust.experiments.runs import Results, find_runs, load_results

__all__ = [
    "EXPERIMENTS",
    "ExperimentSkipped",
    "Output",
    "Results",
    "Run",
    "describe",
    "find_runs",
    "load_results",
    "run",
    "run_all",
]

#: Experiment names in the paper's order (module names in this package); the last one,
#: robust training against gradient-norm regularisation, goes beyond the paper.
EXPERIMENTS: tuple[str, ...] = (
    "estimation_error",
    "convergence",
    "runtime",
    "mv_sigmoid",
    "softmax_correlation",
    "robust_models",
    "class_bias",
    "vulnerable_points",
    "case_study",
    "distribution",
    "robust_training",
)

#: Experiments that compute something besides reading tables (they time estimators or train
#: small models); ``probust report --skip`` can leave them out to save time.
MEASURING = ("runtime", "case_study")


def module(name: str):
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"probust.experiments.{name}")


def describe(name: str) -> tuple[str, str]:
    """(title, description) of an experiment."""
    m = module(name)
    return m.TITLE, m.DESCRIPTION


def run(name: str, results: Results | str | Path, out: str | Path, **options: Any) -> Output:
    """Run one experiment; its files go to ``out/<name>/``.

    Args:
        name: one of :data:`EXPERIMENTS`.
        results: the runs, or a folder to load them from.
        out: the experiments' folder.
        **options: the experiment's own keyword arguments (see its ``run``).

    Returns:
        The :class:`Output`; ``skipped`` is set when the results hold nothing it can use.
    """
    m = module(name)
    if not isinstance(results, Results):
        results = load_results(results)
    folder = Path(out) / name
    start = time.perf_counter()
    try:
        output = m.run(results, folder, **options)
    except ExperimentSkipped as exc:
        output = Output(name=name, title=m.TITLE, description=m.DESCRIPTION, skipped=str(exc))
    output.seconds = time.perf_counter() - start
    return output


def run_all(
    results: Results | str | Path,
    out: str | Path,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
    on_done: Callable[[Output], None] | None = None,
    keep_going: bool = True,
) -> list[Output]:
    """Run every experiment (or those in ``only``, minus ``skip``) in the paper's order.

    Args:
        options: per-experiment keyword arguments, e.g. ``{"runtime": {"points": 10}}``.
        on_done: called with each output as it is finished (progress reporting).
        keep_going: an experiment that fails with an unexpected error is reported as skipped
            (with the error) instead of stopping the others.
    """
    if not isinstance(results, Results):
        results = load_results(results)
    names = list(only) if only is not None else list(EXPERIMENTS)
    for n in [*names, *skip]:
        module(n)  # unknown names fail before any work
    options = options or {}
    outputs = []
    for name in names:
        if name in skip:
            continue
        try:
            output = run(name, results, out, **options.get(name, {}))
        except Exception as exc:
            if not keep_going:
                raise
            m = module(name)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            output = Output(name=name, title=m.TITLE, description=m.DESCRIPTION, skipped=f"failed: {detail}")
        outputs.append(output)
        if on_done is not None:
            on_done(output)
    return outputs
