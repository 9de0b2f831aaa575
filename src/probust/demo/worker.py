"""The work of one model, run in a worker process: train (or reuse) it, then score its requests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probust._io import sha256_file
from probust.demo.settings import DemoConfig
from probust.demo.specs import GRID_FILE, CertifyRequest, ModelSpec, certify_key, grid_key

__all__ = ["run_model"]


def _written_by_this_version(results: Path) -> bool:
    """Whether only this probust version wrote into ``results`` (the runner refuses to extend a
    folder another version wrote into: the demo then recomputes it instead)."""
    from probust import __version__
    from probust.run import read_results_config

    try:
        config = read_results_config(results)
    except (OSError, ValueError):
        return False
    if config is None:
        return True  # nothing scored yet
    return all(v == __version__ for v in (config.probust_version, *(h.probust_version for h in config.history)))


def _claim(folder: Path, key: dict[str, Any]) -> bool:
    """Whether ``folder`` holds the work of ``key`` (its :data:`GRID_FILE`), written by this
    version; if not, ``key`` is written first, so that an interrupted demo resumes the same work."""
    key_file = folder / GRID_FILE
    same = key_file.is_file() and json.loads(key_file.read_text()) == key and _written_by_this_version(folder)
    if not same:
        folder.mkdir(parents=True, exist_ok=True)
        key_file.write_text(json.dumps(key, indent=1) + "\n")
    return same


def _certify(
    cfg: DemoConfig, request: CertifyRequest, checkpoint: Path, folder: Path, model_sha: str, n_test: int
) -> bool:
    """Certify the request's points into ``folder`` (resumed when its key is the same, else
    recomputed); returns whether the folder was reused as it was."""
    from probust.run.certify import CertifySettings, run_certify

    key = certify_key(cfg, request, model_sha, n_test)
    same = _claim(folder, key)
    first, last = (int(v) for v in key["certify"]["indices"].split("-"))
    summary = run_certify(
        CertifySettings(
            data=cfg.data,
            model=checkpoint,
            sigmas=(request.sigma,),
            indices=list(range(first, last + 1)),
            n0=request.n0,
            n=request.n,
            alpha=request.alpha,
            estimate=request.estimate,
            seed=cfg.seed,
            device="cpu",
            show_progress=False,
            out=folder,
            overwrite=not same,
        )
    )
    return same and summary.rows_computed == 0


def run_model(cfg: DemoConfig, spec: ModelSpec, threads: int, say: Callable[[str], None] | None) -> dict[str, Any]:
    """Train (or reuse) one model and score its requests; runs in a worker process.

    The checkpoint is reused when it exists, was trained with the same settings and is complete;
    the results folder is reused when its grid file holds the same :func:`~probust.demo.specs.grid_key`
    (otherwise it is scored from scratch).

    Args:
        cfg: the demo's settings.
        spec: the model.
        threads: torch threads of this process.
        say: called with a progress line after training and after scoring (None: silent). In a
            worker process it must be picklable, e.g. a module-level function.

    Returns:
        The model's record: name, arch, grad_reg, robust_mu, robust_sigma, checkpoint, results,
        test_accuracy, trained, train_seconds, score_seconds, certified (the certify folder or
        None) and certify_seconds (JSON-ready).
    """
    import warnings

    import torch

    from probust import data as pdata
    from probust import models as pmodels
    from probust.run import run_estimate
    from probust.training import DEFAULTS, steps_per_epoch, train

    torch.set_num_threads(threads)
    name = spec.name
    t0 = time.perf_counter()
    ckpt = spec.checkpoint
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    train_ds = pdata.load(cfg.data, "train")
    test_ds = pdata.load(cfg.data, "test")
    if cfg.train_size is not None and cfg.train_size < len(train_ds):
        train_ds = train_ds.subset(list(range(cfg.train_size)))
    reused = ckpt.exists()
    kwargs: dict[str, Any] = dict(
        epochs=spec.epochs, grad_reg=spec.grad_reg, seed=cfg.seed, out=ckpt, show_progress=False, test_dataset=test_ds
    )
    robust = spec.robust
    if robust is not None:
        from probust.training import RobustLoss

        steps = spec.epochs * steps_per_epoch(len(train_ds), DEFAULTS[spec.arch]["batch_size"])
        kwargs["extra_loss"] = RobustLoss(
            robust.sigma, robust.mu, max_points=robust.max_points, warmup_steps=round(robust.warmup * steps)
        )
    try:
        result = train(train_ds, spec.arch, resume=True, **kwargs)
    except pmodels.CheckpointMismatchError:
        reused = False
        result = train(train_ds, spec.arch, resume=False, **kwargs)
    reused = reused and result.meta.get("complete", False)
    t_train = time.perf_counter() - t0
    acc = result.meta.get("test_accuracy")
    if say is not None:
        say(f"  [{name}] {'reused' if reused else 'trained'} {ckpt.name}: test accuracy {acc:.1%} ({t_train:.0f} s)")

    # the results folder: recomputed from scratch when its grid or model changed
    results = spec.results
    model_sha = sha256_file(ckpt)
    grid = grid_key(cfg, spec, model_sha, len(test_ds))
    same = _claim(results, grid)
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
    if say is not None:
        say(
            f"  [{name}] {'reused' if same else 'scored'} {results.name}: {len(grid['requests'])} request(s) ({t_score:.0f} s)"
        )
    t2 = time.perf_counter()
    if spec.certify is not None and spec.certified is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            kept = _certify(cfg, spec.certify, ckpt, spec.certified, model_sha, len(test_ds))
        if say is not None:
            say(
                f"  [{name}] {'reused' if kept else 'certified'} {spec.certified.name}: σ = {spec.certify.sigma:g}, "
                f"N = {spec.certify.n:,} ({time.perf_counter() - t2:.0f} s)"
            )
    t_certify = time.perf_counter() - t2
    return {
        "name": name,
        "arch": spec.arch,
        "grad_reg": spec.grad_reg,
        "robust_mu": robust.mu if robust is not None else None,
        "robust_sigma": robust.sigma if robust is not None else None,
        "checkpoint": str(ckpt),
        "results": str(results),
        "test_accuracy": acc,
        "trained": not reused,
        "train_seconds": round(t_train, 1),
        "score_seconds": round(t_score, 1),
        "certified": str(spec.certified) if spec.certify is not None else None,
        "certify_seconds": round(t_certify, 1),
    }
