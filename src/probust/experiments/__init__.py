"""The paper's evaluation, one module per experiment, each reading results tables.

Every experiment takes the runs found in a results folder (:func:`load_results`) and an
output folder, and writes a tidy CSV and a figure (PNG and SVG)::

    from probust import experiments
    results = experiments.load_results("runs/demo/results")       # every `probust estimate` folder below
    out = experiments.run("estimation_error", results, "runs/demo/experiments")
    out.table            # the tidy table (also estimation_error/estimation_error.csv)
    out.figures          # [.../estimation_error.png]; an .svg lies beside each
    out.reading          # short statements computed from the numbers

or all of them: ``experiments.run_all(results, out_dir)``. The experiments are registered, in
the paper's order, in :data:`REGISTRY` (:mod:`probust.experiments.registry`); :data:`EXPERIMENTS`
is the tuple of their names. An experiment that finds nothing to work on returns an
:class:`Output` whose ``skipped`` says what is missing, instead of raising.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from probust._extras import MissingExtraError

try:  # the figures and their tables: the 'report' extra (matplotlib, and the 'run' extra's pandas)
    import matplotlib  # noqa: F401
    import pandas  # noqa: F401
except ModuleNotFoundError as exc:
    raise MissingExtraError(exc.name or "matplotlib", "report", "probust's experiments and report") from exc

from probust.experiments.base import Experiment, ExperimentSkipped, Output
from probust.experiments.registry import REGISTRY
from probust.experiments.run_info import Run
from probust.experiments.runs import Results, find_runs, load_results

__all__ = [
    "EXPERIMENTS",
    "REGISTRY",
    "Experiment",
    "ExperimentSkipped",
    "Output",
    "Results",
    "Run",
    "describe",
    "find_runs",
    "get",
    "load_results",
    "run",
    "run_all",
]


def __getattr__(name: str) -> Any:
    # EXPERIMENTS is read from the registry on every access, so that it lists experiments
    # registered after this package was imported
    if name == "EXPERIMENTS":
        return REGISTRY.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str) -> Experiment:
    """The registered experiment called ``name`` (a ValueError names the known ones)."""
    return REGISTRY.get(name)


def describe(name: str) -> tuple[str, str]:
    """(title, description) of an experiment."""
    e = get(name)
    return e.title, e.description


def run(name: str, results: Results | str | Path, out: str | Path, **options: Any) -> Output:
    """Run one experiment; its files go to ``out/<name>/``.

    Args:
        name: a registered name (one of :data:`EXPERIMENTS`).
        results: the runs, or a folder to load them from.
        out: the experiments' folder.
        **options: the experiment's own keyword arguments (see its ``run``).

    Returns:
        The :class:`Output`; ``skipped`` is set when the results hold nothing it can use.
    """
    e = get(name)
    if not isinstance(results, Results):
        results = load_results(results)
    folder = Path(out) / name
    start = time.perf_counter()
    try:
        output = e.run(results, folder, **options)
    except ExperimentSkipped as exc:
        output = e.skipped(str(exc))
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
    hold: Mapping[str, str] | None = None,
) -> list[Output]:
    """Run every registered experiment (or those in ``only``, minus ``skip``) in the registry's order.

    Args:
        options: per-experiment keyword arguments, e.g. ``{"runtime": {"points": 10}}``.
        on_done: called with each output as it is finished (progress reporting).
        keep_going: an experiment that fails with an unexpected error is reported as skipped
            (with the error) instead of stopping the others.
        hold: experiments reported as skipped, for the reason given, without running (the
            report holds back the measuring experiments on one's own results this way).
    """
    if not isinstance(results, Results):
        results = load_results(results)
    names = list(only) if only is not None else list(REGISTRY.names())
    for n in [*names, *skip]:
        get(n)  # unknown names fail before any work
    options = options or {}
    outputs = []
    for name in names:
        if name in skip:
            continue
        if hold and name in hold:
            output = get(name).skipped(hold[name])
            outputs.append(output)
            if on_done is not None:
                on_done(output)
            continue
        try:
            output = run(name, results, out, **options.get(name, {}))
        except Exception as exc:
            if not keep_going:
                raise
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            output = get(name).skipped(f"failed: {detail}")
        outputs.append(output)
        if on_done is not None:
            on_done(output)
    return outputs
