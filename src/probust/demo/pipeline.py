"""The demo's pipeline, :func:`run_demo`: train and score every model, run every experiment, write the report."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probust.demo.settings import DemoConfig, check_config, config_for
from probust.demo.specs import GRID_FILE, model_specs
from probust.demo.worker import run_model

if TYPE_CHECKING:
    from probust.experiments import Output

__all__ = ["DemoSummary", "run_demo"]


@dataclass
class DemoSummary:
    """What :func:`run_demo` did.

    Attributes:
        out: the demo's folder.
        config: the settings.
        report: the :class:`probust.report.Report` (``report.path`` is the HTML page).
        models: per model: label, checkpoint, results folder, test accuracy, seconds.
        seconds: per stage, and ``total``.
        fell_back: the reason for using digits instead of Fashion-MNIST, or None.
    """

    out: Path
    config: DemoConfig
    report: Any
    models: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    fell_back: str | None = None


def _resolve_data(data: str | None, say: Callable[[str], None]) -> tuple[str, str | None]:
    from probust import data as pdata

    if data is not None:
        name = pdata.canonical_name(data)
        pdata.load(name, "test")  # fails with the loader's message (where it looked, how to get it)
        return name, None
    try:
        pdata.load("fashion-mnist", "test")
        pdata.load("fashion-mnist", "train")
        return "fashion-mnist", None
    except pdata.ProbustDataError as exc:
        first = str(exc).splitlines()[0]
        hint = next((line for line in str(exc).splitlines() if line.startswith("to get it")), "")
        reason = f"Fashion-MNIST is not on this machine ({first}). {hint}".strip()
        say(f"NOTE: {reason}")
        say(
            "NOTE: falling back to scikit-learn's 8x8 digits (bundled, offline); the numbers will not be the paper's Fashion-MNIST ones."
        )
        return "digits", reason


def _remove_stale(results_root: Path, keep: set[str], say: Callable[[str], None]) -> None:
    """Delete result folders an earlier demo with other settings left (only the demo's own)."""
    if not results_root.is_dir():
        return
    for folder in results_root.iterdir():
        if folder.is_dir() and folder.name not in keep and (folder / GRID_FILE).is_file():
            shutil.rmtree(folder)
            say(f"removed {folder} (left by a demo with other settings)")


def run_demo(
    out: str | os.PathLike = "runs/demo",
    *,
    data: str | None = None,
    quick: bool = False,
    points: int | None = None,
    seed: int = 0,
    jobs: int | None = None,
    threads: int = 1,
    config: DemoConfig | None = None,
    verbose: bool = True,
    argv: Sequence[str] | None = None,
    on_output: Callable[[Output], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> DemoSummary:
    """Train, score, run every experiment and write ``out/report.html``.

    Args:
        out: the demo's folder (models/, results/, experiments/, report.html, demo.json).
        data: the data set; default Fashion-MNIST, or digits (with a message) when it is missing.
        quick: a tiny configuration (well under a minute), for tests.
        points: test points on the main grid (default 200; 30 with ``quick``).
        seed: the seed of everything random.
        jobs: worker processes training and scoring models in parallel (default: 2, or 1 with
            ``quick`` or on a single CPU); does not change any number.
        threads: torch threads per worker and for the experiments (default 1: several threads
            per process slow down a busy machine a lot); does not change any number.
        config: full settings (overrides ``data``/``quick``/``points``/``seed``).
        verbose: report progress through ``say`` (False: ``say`` is not called).
        argv: the command line, recorded in demo.json.
        on_output: called with each experiment's :class:`~probust.experiments.Output` as it
            finishes (``probust demo`` prints a line per experiment).
        say: called with each line of progress (None: the demo reports nothing; it never prints
            by itself). With ``jobs`` > 1 the models' lines are said in the worker processes, so
            ``say`` must then be picklable (a module-level function, e.g. ``print``).

    Returns:
        A :class:`DemoSummary`.

    Raises:
        probust.data.ProbustDataError: ``data`` was given and is not on the machine.
        DemoConfigError: bad settings (before any work).
        TypeError: ``say`` cannot be sent to the worker processes (``jobs`` > 1).
    """
    import torch

    from probust.experiments import load_results
    from probust.report import build_report

    if not verbose:
        say = None
    report_line: Callable[[str], None] = say if say is not None else (lambda text: None)
    t_start = time.perf_counter()
    out = Path(out)
    fell_back = None
    if config is None:
        name, fell_back = _resolve_data(data, report_line)
        config = config_for(name, quick=quick, points=points, seed=seed)
    check_config(config)
    from probust import data as pdata

    n_test = len(pdata.load(config.data, "test"))
    if config.points > n_test or config.pool_points > n_test:
        config = dataclasses.replace(
            config, points=min(config.points, n_test), pool_points=min(config.pool_points, n_test)
        )
    if jobs is None:
        jobs = 1 if quick or (os.cpu_count() or 1) < 2 else 2
    if jobs > 1 and say is not None:
        try:
            pickle.dumps(say)
        except Exception as exc:
            raise TypeError(f"say: must be picklable when jobs > 1 (a module-level function), got {say!r}") from exc
    out.mkdir(parents=True, exist_ok=True)
    specs = model_specs(config, out)
    keep = {s.results.name for s in specs} | {s.certified.name for s in specs if s.certified is not None}
    _remove_stale(out / "results", keep, report_line)
    robust_text = (
        f"; CNN with RobustLoss μ = {', '.join(f'{v:g}' for v in sorted(set(config.robust_mus)))} at σ = {config.robust_sigma:g}"
        if config.robust_mus
        else ""
    )
    report_line(
        f"probust demo: {config.data}, {len(specs)} models (linear; CNN at λ = {', '.join(f'{v:g}' for v in sorted(set(config.lambdas) | {0.0}))}{robust_text}), "
        f"{config.points} test points x σ = {', '.join(f'{s:g}' for s in config.sigmas)}, Monte Carlo n = {config.mc_samples:,}, "
        f"MMSE N = {config.mmse_samples}; {jobs} worker(s) x {threads} thread(s); output in {out}/"
    )

    # 1-2. train and score, longest jobs first
    report_line("training and scoring:")
    t0 = time.perf_counter()
    done: list[dict[str, Any]] = []
    order = sorted(specs, key=lambda s: -s.cost)
    if jobs <= 1:
        previous = torch.get_num_threads()
        try:
            for s in order:
                done.append(run_model(config, s, threads, say))
        finally:
            torch.set_num_threads(previous)
    else:
        import multiprocessing

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_model, config, s, threads, say) for s in order]
            for f in as_completed(futures):
                done.append(f.result())
    by_name = {d["name"]: d for d in done}
    models = [by_name[s.name] for s in specs]
    t_models = time.perf_counter() - t0

    # 3. experiments and report
    report_line("experiments:")
    t1 = time.perf_counter()
    results = load_results(
        [Path(m["results"]) for m in models] + [Path(m["certified"]) for m in models if m["certified"]]
    )
    results.root = out / "results"
    options: dict[str, dict[str, Any]] = {
        "runtime": {
            "points": config.runtime_points,
            "sigma": 0.1,
            "mc_counts": config.runtime_mc,
            "mmse_counts": config.runtime_mmse,
        },
        "case_study": {
            "seeds": config.case_seeds,
            "epochs": config.case_epochs,
            "k": config.case_k,
            "sigma": config.case_sigma,
        },
        "vulnerable_points": {"sigma": config.case_sigma},
        "mv_sigmoid": {"sigma": config.case_sigma},
        "softmax_correlation": {"sigma": config.case_sigma},
    }
    extra = {
        "command": " ".join(argv) if argv is not None else None,
        "settings": config.to_dict(),
        "fell_back_to_digits": fell_back,
        "models": models,
        "jobs": jobs,
        "threads": threads,
    }
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        report = build_report(
            results,
            out,
            options=options,
            title=f"probust demo: average-case robustness on {config.data}",
            extra=extra,
            on_done=on_output,
        )
    finally:
        torch.set_num_threads(previous)
    t_report = time.perf_counter() - t1
    seconds = {
        "train_and_score": round(t_models, 1),
        "experiments_and_report": round(t_report, 1),
        "total": round(time.perf_counter() - t_start, 1),
    }
    (out / "demo.json").write_text(json.dumps({**extra, "seconds": seconds}, indent=2, default=str) + "\n")
    return DemoSummary(out=out, config=config, report=report, models=models, seconds=seconds, fell_back=fell_back)
