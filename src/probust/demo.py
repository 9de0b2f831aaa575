"""``probust demo``: the paper's evaluation end to end on Fashion-MNIST, in minutes on a CPU.

The pipeline (every step reuses what an earlier run with the same settings left on disk):

1. **Train** the paper's Fashion-MNIST models: the linear model and the CNN, and a small robust
   family, the same CNN trained with gradient-norm regularisation at a few lambdas (the CNN at
   lambda = 0 is both the main CNN and the family's first member); and, beyond the paper, the
   same CNN trained with the robust loss CE + mu * mean(-log p_robust) (:class:`probust.RobustLoss`
   at ``robust_sigma``, one model per ``robust_mus``), compared with the family at matched
   accuracy by the last experiment. A checkpoint whose name encodes its settings is reused when
   it exists.
2. **Score** the first ``points`` test images at several sigma with every estimator into one
   results folder per model (:func:`probust.run.run_estimate`): Monte Carlo at a modest n,
   MMSE at N copies (the family members and the robust-loss CNNs with mc, taylor, mmse and
   softmax); for the main models also a convergence subset (Monte Carlo up to 10^4 or
   10^5 samples, MMSE N = 1 ... 100), and for the main CNN a larger pool scored with MMSE and
   softmax at one sigma, for the image grids and the case study.
3. **Report**: every experiment (:mod:`probust.experiments`) on those folders, and
   ``report.html`` (:mod:`probust.report`).

Models are trained and scored in ``jobs`` worker processes with ``threads`` torch threads each
(default 2 and 1): the numbers do not depend on either, only on the seed and the settings. When
Fashion-MNIST is not on the machine the demo says so and uses scikit-learn's digits instead.

Example:
    >>> summary = probust.demo.run_demo(out="runs/demo")
    >>> summary.report.path
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probust.experiments import Output

__all__ = ["DemoConfig", "DemoConfigError", "DemoSummary", "config_for", "run_demo"]

PAPER_METHODS = ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax")
FAMILY_METHODS = ("mc", "taylor", "mmse", "softmax")
_GRID_FILE = "demo-grid.json"


class DemoConfigError(ValueError):
    """A bad demo setting, found before any work started."""


@dataclass(frozen=True)
class DemoConfig:
    """Everything that determines the demo's numbers (plus ``jobs``/``threads``, which do not).

    Attributes:
        data: "fashion-mnist" (or any probust data set with 10 classes, e.g. "mnist", "digits").
        points: test points scored at every sigma with every estimator (the first ones).
        sigmas: noise levels, per pixel in [0, 1] units.
        mc_samples: Monte Carlo samples per point on the main grid.
        mmse_samples: MMSE noisy copies per point on the main grid.
        pool_points: points of the main CNN scored with MMSE and softmax at ``case_sigma``.
        case_sigma: the noise level of the image grids and the case study.
        lambdas: gradient-norm regularisation weights of the CNN family (0 first: the main CNN).
        robust_mus: weights mu of the CNNs trained with :class:`probust.RobustLoss` (one model
            each, trained like the family; () for none).
        robust_sigma: the noise level those are trained for (one of ``sigmas``).
        robust_max_points: the robust term is evaluated on the first this many images of each
            batch (its cost: a double-backpropagated Jacobian per image).
        robust_warmup: the term's weight ramps up over this fraction of the training steps
            (RobustLoss's ``warmup_steps``; a term at full weight from a random start flattens
            the network into a constant classifier).
        linear_epochs, cnn_epochs: training epochs.
        train_size: train on the first ``train_size`` training images (None: all).
        convergence_points: points of the convergence subset (main models, at ``case_sigma``).
        mc_convergence, mc_convergence_linear: Monte Carlo sample counts of the subset, for the
            CNN and for the linear model (cheaper to sample, and exact p is known there).
        mmse_convergence: MMSE copy counts of the subset.
        runtime_points, runtime_mc, runtime_mmse: the runtime experiment's points and counts.
        case_seeds, case_epochs, case_k: the case study's repetitions, training epochs and
            images per class and end.
        seed: seeds training, the estimators' random streams, the noise shown and the case study.
    """

    data: str = "fashion-mnist"
    points: int = 200
    sigmas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
    mc_samples: int = 1000
    mmse_samples: int = 10
    pool_points: int = 1000
    case_sigma: float = 0.2
    lambdas: tuple[float, ...] = (0.0, 1e-3, 1e-2, 1e-1)
    robust_mus: tuple[float, ...] = (1.0,)
    robust_sigma: float = 0.4
    robust_max_points: int = 32
    robust_warmup: float = 0.3
    linear_epochs: int = 5
    cnn_epochs: int = 1
    train_size: int | None = None
    convergence_points: int = 10
    mc_convergence: tuple[int, ...] = (100, 300, 1000, 3000, 10_000)
    mc_convergence_linear: tuple[int, ...] = (100, 1000, 10_000, 100_000)
    mmse_convergence: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100)
    runtime_points: int = 5
    runtime_mc: tuple[int, ...] = (100, 1_000, 10_000)
    runtime_mmse: tuple[int, ...] = (1, 5, 10, 25, 50, 100)
    case_seeds: int = 5
    case_epochs: int = 30
    case_k: int = 25
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_for(data: str = "fashion-mnist", *, quick: bool = False, **overrides: Any) -> DemoConfig:
    """The demo's settings for a data set; ``quick`` is a tiny configuration for tests."""
    base: dict[str, Any] = {"data": data}
    if data == "digits":  # 1,438 training images, 359 test images of 8x8 pixels
        base.update(linear_epochs=30, cnn_epochs=30, points=200, pool_points=359)
    if quick:
        base.update(
            points=30,
            sigmas=(0.05, 0.2),
            mc_samples=200,
            mmse_samples=3,
            pool_points=120,
            lambdas=(0.0, 1e-1),
            robust_mus=(0.3,),  # at 16 steps a stronger term, or a shorter ramp, flattens the model
            robust_sigma=0.2,
            robust_max_points=16,
            robust_warmup=1.0,
            linear_epochs=1 if data != "digits" else 5,
            cnn_epochs=1 if data != "digits" else 5,
            train_size=2000 if data != "digits" else None,
            convergence_points=4,
            mc_convergence=(100, 400),
            mc_convergence_linear=(100, 1000),
            mmse_convergence=(1, 3),
            runtime_points=2,
            runtime_mc=(100,),
            runtime_mmse=(1, 3),
            case_seeds=2,
            case_epochs=3,
            case_k=5,
        )
    base.update({k: v for k, v in overrides.items() if v is not None})
    return DemoConfig(**base)


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


# -- the work of one model (runs in a worker process) ---------------------------------------------


def _slug(value: float) -> str:
    return "0" if value == 0 else f"{value:g}".replace("+", "")


def _model_specs(cfg: DemoConfig, out: Path) -> list[dict[str, Any]]:
    """One spec per model: what to train and what to score."""
    size = "all" if cfg.train_size is None else str(cfg.train_size)
    specs = []

    def spec(arch: str, lam: float, epochs: int, requests: list[dict[str, Any]], cost: float, robust: dict[str, Any] | None = None) -> dict[str, Any]:
        name = f"{cfg.data}-{arch}" + (f"-lambda{_slug(lam)}" if arch == "cnn" and robust is None else "")
        if robust is not None:  # the name records mu and sigma; the rest of the loss is checked on resumption
            name += f"-robust{_slug(robust['mu'])}-sigma{_slug(robust['sigma'])}"
        ckpt = out / "models" / f"{name}-e{epochs}-n{size}-s{cfg.seed}.pt"
        return {
            "name": name,
            "arch": arch,
            "grad_reg": lam,
            "robust": robust,
            "epochs": epochs,
            "checkpoint": str(ckpt),
            "results": str(out / "results" / name),
            "requests": requests,
            "cost": cost,
        }

    main = {"indices": f"0-{cfg.points - 1}", "sigmas": list(cfg.sigmas), "mc_samples": [cfg.mc_samples],
            "mmse_samples": [cfg.mmse_samples]}  # fmt: skip
    conv_idx = f"0-{cfg.convergence_points - 1}"
    conv = {"indices": conv_idx, "sigmas": [cfg.case_sigma], "methods": ["mc", "mmse"], "mmse_samples": list(cfg.mmse_convergence)}
    lambdas = sorted(set(float(v) for v in cfg.lambdas) | {0.0})
    for lam in lambdas:
        requests = [{**main, "methods": list(PAPER_METHODS if lam == 0 else FAMILY_METHODS)}]
        cost = 1.0 + (0.5 if lam else 0.0)
        if lam == 0:
            requests.append({"indices": f"0-{cfg.pool_points - 1}", "sigmas": [cfg.case_sigma], "methods": ["mmse", "softmax"],
                             "mmse_samples": [cfg.mmse_samples]})  # fmt: skip
            requests.append({**conv, "mc_samples": list(cfg.mc_convergence)})
            cost += 0.6
        specs.append(spec("cnn", lam, cfg.cnn_epochs, requests, cost))
    for mu in sorted(set(float(v) for v in cfg.robust_mus)):
        # scored like the family's regularised members (the comparison needs their mc rows)
        robust = {"mu": mu, "sigma": float(cfg.robust_sigma), "max_points": cfg.robust_max_points, "warmup": cfg.robust_warmup}
        specs.append(spec("cnn", 0.0, cfg.cnn_epochs, [{**main, "methods": list(FAMILY_METHODS)}], 2.5, robust))
    specs.append(
        spec("linear", 0.0, cfg.linear_epochs, [{**main, "methods": list(PAPER_METHODS)}, {**conv, "mc_samples": list(cfg.mc_convergence_linear)}], 0.4)
    )
    return specs


def _grid_key(cfg: DemoConfig, spec: dict[str, Any], model_sha: str, n_test: int) -> dict[str, Any]:
    requests = []
    for r in spec["requests"]:
        r = dict(r)
        first, last = (int(v) for v in r["indices"].split("-"))
        r["indices"] = f"{first}-{min(last, n_test - 1)}"
        requests.append(r)
    return {"model_sha256": model_sha, "seed": cfg.seed, "data": cfg.data, "requests": requests}


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _say(name: str, text: str) -> None:
    print(f"  [{name}] {text}", flush=True)


def _job(cfg_dict: dict[str, Any], spec: dict[str, Any], threads: int, verbose: bool) -> dict[str, Any]:
    """Train (or reuse) one model and score its requests; runs in a worker process."""
    import warnings

    import torch

    from probust import data as pdata
    from probust import models as pmodels
    from probust.run import run_estimate
    from probust.train import DEFAULTS, steps_per_epoch, train

    torch.set_num_threads(threads)
    cfg = DemoConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg_dict.items()})
    name = spec["name"]
    t0 = time.perf_counter()
    ckpt = Path(spec["checkpoint"])
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    train_ds = pdata.load(cfg.data, "train")
    test_ds = pdata.load(cfg.data, "test")
    if cfg.train_size is not None and cfg.train_size < len(train_ds):
        train_ds = train_ds.subset(list(range(cfg.train_size)))
    reused = ckpt.exists()
    kwargs = dict(epochs=spec["epochs"], grad_reg=spec["grad_reg"], seed=cfg.seed, out=ckpt, show_progress=False, test_dataset=test_ds)
    robust = spec.get("robust")
    if robust is not None:
        from probust.robust_loss import RobustLoss

        steps = spec["epochs"] * steps_per_epoch(len(train_ds), DEFAULTS[spec["arch"]]["batch_size"])
        kwargs["extra_loss"] = RobustLoss(
            robust["sigma"], robust["mu"], max_points=robust["max_points"], warmup_steps=round(robust["warmup"] * steps)
        )
    try:
        result = train(train_ds, spec["arch"], resume=True, **kwargs)
    except pmodels.CheckpointMismatchError:
        reused = False
        result = train(train_ds, spec["arch"], resume=False, **kwargs)
    reused = reused and result.meta.get("complete", False)
    t_train = time.perf_counter() - t0
    acc = result.meta.get("test_accuracy")
    if verbose:
        _say(name, f"{'reused' if reused else 'trained'} {ckpt.name}: test accuracy {acc:.1%} ({t_train:.0f} s)")

    # the results folder: recomputed from scratch when its grid or model changed
    results = Path(spec["results"])
    grid = _grid_key(cfg, spec, _file_sha(ckpt), len(test_ds))
    grid_file = results / _GRID_FILE
    same = grid_file.is_file() and json.loads(grid_file.read_text()) == grid
    if not same:  # written first, so that an interrupted demo resumes the same grid
        results.mkdir(parents=True, exist_ok=True)
        grid_file.write_text(json.dumps(grid, indent=1) + "\n")
    t1 = time.perf_counter()
    for k, req in enumerate(grid["requests"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            run_estimate(
                data=cfg.data,
                model=ckpt,
                sigmas=req["sigmas"],
                methods=req["methods"],
                out=results,
                mc_samples=req.get("mc_samples") or [1000],
                mmse_samples=req.get("mmse_samples") or [5],
                indices=req["indices"],
                device="cpu",
                seed=cfg.seed,
                show_progress=False,
                overwrite=(k == 0 and not same),
                extend=(k > 0 or same),
            )
    t_score = time.perf_counter() - t1
    if verbose:
        _say(name, f"{'reused' if same else 'scored'} {results.name}: {len(grid['requests'])} request(s) ({t_score:.0f} s)")
    return {
        "name": name,
        "arch": spec["arch"],
        "grad_reg": spec["grad_reg"],
        "robust_mu": robust["mu"] if robust is not None else None,
        "robust_sigma": robust["sigma"] if robust is not None else None,
        "checkpoint": str(ckpt),
        "results": str(results),
        "test_accuracy": acc,
        "trained": not reused,
        "train_seconds": round(t_train, 1),
        "score_seconds": round(t_score, 1),
    }


# -- the pipeline ----------------------------------------------------------------------------------


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
        say("NOTE: falling back to scikit-learn's 8x8 digits (bundled, offline); the numbers will not be the paper's Fashion-MNIST ones.")
        return "digits", reason


def _remove_stale(results_root: Path, keep: set[str], say: Callable[[str], None]) -> None:
    """Delete result folders an earlier demo with other settings left (only the demo's own)."""
    if not results_root.is_dir():
        return
    for folder in results_root.iterdir():
        if folder.is_dir() and folder.name not in keep and (folder / _GRID_FILE).is_file():
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
        verbose: print progress.
        argv: the command line, recorded in demo.json.
        on_output: called with each experiment's :class:`~probust.experiments.Output` as it
            finishes (``probust demo`` prints a line per experiment).

    Returns:
        A :class:`DemoSummary`.

    Raises:
        probust.data.ProbustDataError: ``data`` was given and is not on the machine.
        DemoConfigError: bad settings (before any work).
    """
    import torch

    from probust.experiments import load_results
    from probust.report import build_report

    say = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    t_start = time.perf_counter()
    out = Path(out)
    fell_back = None
    if config is None:
        name, fell_back = _resolve_data(data, say)
        config = config_for(name, quick=quick, points=points, seed=seed)
    _check(config)
    from probust import data as pdata

    n_test = len(pdata.load(config.data, "test"))
    if config.points > n_test or config.pool_points > n_test:
        config = dataclasses.replace(config, points=min(config.points, n_test), pool_points=min(config.pool_points, n_test))
    if jobs is None:
        jobs = 1 if quick or (os.cpu_count() or 1) < 2 else 2
    out.mkdir(parents=True, exist_ok=True)
    specs = _model_specs(config, out)
    _remove_stale(out / "results", {Path(s["results"]).name for s in specs}, say)
    robust_text = (
        f"; CNN with RobustLoss μ = {', '.join(f'{v:g}' for v in sorted(set(config.robust_mus)))} at σ = {config.robust_sigma:g}"
        if config.robust_mus else ""
    )
    say(
        f"probust demo: {config.data}, {len(specs)} models (linear; CNN at λ = {', '.join(f'{v:g}' for v in sorted(set(config.lambdas) | {0.0}))}{robust_text}), "
        f"{config.points} test points x σ = {', '.join(f'{s:g}' for s in config.sigmas)}, Monte Carlo n = {config.mc_samples:,}, "
        f"MMSE N = {config.mmse_samples}; {jobs} worker(s) x {threads} thread(s); output in {out}/"
    )

    # 1-2. train and score, longest jobs first
    say("training and scoring:")
    t0 = time.perf_counter()
    done: list[dict[str, Any]] = []
    order = sorted(specs, key=lambda s: -s["cost"])
    cfg_dict = config.to_dict()
    if jobs <= 1:
        previous = torch.get_num_threads()
        try:
            for s in order:
                done.append(_job(cfg_dict, s, threads, verbose))
        finally:
            torch.set_num_threads(previous)
    else:
        import multiprocessing

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_job, cfg_dict, s, threads, verbose) for s in order]
            for f in as_completed(futures):
                done.append(f.result())
    by_name = {d["name"]: d for d in done}
    models = [by_name[s["name"]] for s in specs]
    t_models = time.perf_counter() - t0

    # 3. experiments and report
    say("experiments:")
    t1 = time.perf_counter()
    results = load_results([Path(m["results"]) for m in models])
    results.root = out / "results"
    options = {
        "runtime": {"points": config.runtime_points, "sigma": 0.1, "mc_counts": config.runtime_mc, "mmse_counts": config.runtime_mmse},
        "case_study": {"seeds": config.case_seeds, "epochs": config.case_epochs, "k": config.case_k, "sigma": config.case_sigma},
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
    seconds = {"train_and_score": round(t_models, 1), "experiments_and_report": round(t_report, 1), "total": round(time.perf_counter() - t_start, 1)}
    (out / "demo.json").write_text(json.dumps({**extra, "seconds": seconds}, indent=2, default=str) + "\n")
    summary = DemoSummary(out=out, config=config, report=report, models=models, seconds=seconds, fell_back=fell_back)
    if verbose:
        print_summary(summary)
    return summary


def _check(cfg: DemoConfig) -> None:
    if cfg.points < 2:
        raise DemoConfigError(f"points must be at least 2, got {cfg.points}")
    if not cfg.sigmas or any(s <= 0 for s in cfg.sigmas):
        raise DemoConfigError(f"sigmas must be positive, got {cfg.sigmas}")
    if cfg.case_sigma not in cfg.sigmas:
        raise DemoConfigError(f"case_sigma {cfg.case_sigma} must be one of sigmas {cfg.sigmas}")
    if any(v < 0 for v in cfg.lambdas):
        raise DemoConfigError(f"lambdas must be >= 0, got {cfg.lambdas}")
    if any(not v > 0 for v in cfg.robust_mus):
        raise DemoConfigError(f"robust_mus must be > 0, got {cfg.robust_mus}")
    if cfg.robust_mus and cfg.robust_sigma not in cfg.sigmas:
        raise DemoConfigError(f"robust_sigma {cfg.robust_sigma} must be one of sigmas {cfg.sigmas}")
    if cfg.robust_max_points < 1:
        raise DemoConfigError(f"robust_max_points must be at least 1, got {cfg.robust_max_points}")
    if not 0 <= cfg.robust_warmup <= 1:
        raise DemoConfigError(f"robust_warmup must be a fraction in [0, 1], got {cfg.robust_warmup}")


def print_summary(summary: DemoSummary, file=None) -> None:
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
        print(f"Mean |p_hat - p_mc| over {cfg.points} test points (Monte Carlo n={cfg.mc_samples:,}, MMSE N={cfg.mmse_samples}):", file=file)
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
            print(f"Speed-up over {t['speedup_reference'].iloc[0]} (batched, this machine): " + ", ".join(parts), file=file)
    cb = report.output("class_bias")
    if cb is not None and not cb.skipped:
        t = cb.table
        t = t[(t["method"] == "mc")] if (t["method"] == "mc").any() else t
        for model, g in t.groupby("model", sort=False):
            r = g.sort_values("sigma").iloc[-1]
            print(f"{model}, σ={r['sigma']:g}: least robust class {r['least_robust_class']} (mean p {r['least_robust_mean_p']:.3f}), "
                  f"most robust {r['most_robust_class']} ({r['most_robust_mean_p']:.3f}), Kruskal-Wallis p = {r['p_value']:.2g}", file=file)  # fmt: skip
    rt11 = report.output("robust_training")
    if rt11 is not None and not rt11.skipped and rt11.reading:
        import re

        print(re.sub(r"<[^>]+>", "", rt11.reading[0].replace("<sup>", "^")), file=file)
    skipped = [o.name for o in report.outputs if o.skipped]
    if skipped:
        print(f"Experiments not run: {', '.join(skipped)} (see the report)", file=file)
    s = summary.seconds
    print(f"\nDone in {s['total']:.0f} s (models {s['train_and_score']:.0f} s, experiments and report {s['experiments_and_report']:.0f} s).", file=file)
    print(f"Report: {report.path}", file=file)
