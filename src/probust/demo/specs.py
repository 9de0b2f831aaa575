"""What the demo trains and scores: one :class:`ModelSpec` per model, and the results folder's grid key.

A results folder holds a ``demo-grid.json`` (:data:`GRID_FILE`) with the key of the grid it was
scored on (:func:`grid_key`); a later demo with the same key reuses the folder. The key's JSON is
the one earlier versions of the demo wrote from plain dicts (same keys, same order), so a demo
folder made by them is still recognised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from probust.demo.settings import FAMILY_METHODS, PAPER_METHODS, DemoConfig

__all__ = [
    "GRID_FILE",
    "CertifyRequest",
    "ModelSpec",
    "RobustLossSpec",
    "ScoreRequest",
    "certify_key",
    "grid_key",
    "model_specs",
]

GRID_FILE = "demo-grid.json"

RequestKind = Literal["main", "pool", "convergence"]

# The keys of each kind of request in the order the grid file has always listed them.
_KEY_ORDER: dict[str, tuple[str, ...]] = {
    "main": ("indices", "sigmas", "mc_samples", "mmse_samples", "methods"),
    "pool": ("indices", "sigmas", "methods", "mmse_samples"),
    "convergence": ("indices", "sigmas", "methods", "mmse_samples", "mc_samples"),
}


@dataclass(frozen=True)
class ScoreRequest:
    """One call of :func:`probust.run.run_estimate` on a model's results folder.

    Attributes:
        kind: "main" (every sigma, every method), "pool" (many points, one sigma) or
            "convergence" (a few points, a range of sample counts).
        indices: the test points, "first-last" (both included).
        sigmas: noise levels, per pixel in [0, 1] units.
        methods: estimator names.
        mc_samples: Monte Carlo sample counts (None: the request has none).
        mmse_samples: MMSE noisy-copy counts.
    """

    kind: RequestKind
    indices: str
    sigmas: tuple[float, ...]
    methods: tuple[str, ...]
    mc_samples: tuple[int, ...] | None
    mmse_samples: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON-ready data (lists, not tuples), keys in the grid file's order."""
        values: dict[str, Any] = {
            "indices": self.indices,
            "sigmas": list(self.sigmas),
            "methods": list(self.methods),
            "mc_samples": None if self.mc_samples is None else list(self.mc_samples),
            "mmse_samples": list(self.mmse_samples),
        }
        return {k: values[k] for k in _KEY_ORDER[self.kind] if values[k] is not None}


@dataclass(frozen=True)
class CertifyRequest:
    """One call of :func:`probust.run.run_certify` on a model's certify folder.

    Attributes:
        indices: the test points, "first-last" (both included).
        sigma: the smoothing noise level, per pixel in [0, 1] units.
        n0, n, alpha: CERTIFY's selection draws, estimation draws and failure probability.
        estimate: the analytic radius estimate written beside the certificate.
    """

    indices: str
    sigma: float
    n0: int
    n: int
    alpha: float
    estimate: str = "taylor"

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON-ready data."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RobustLossSpec:
    """The settings of a model trained with :class:`probust.RobustLoss` (see :class:`DemoConfig`).

    Attributes:
        mu: the weight of the robust term.
        sigma: the noise level the term is evaluated at.
        max_points: the term is evaluated on the first this many images of each batch.
        warmup: the term's weight ramps up over this fraction of the training steps.
    """

    mu: float
    sigma: float
    max_points: int
    warmup: float


@dataclass(frozen=True)
class ModelSpec:
    """One model of the demo: what to train and what to score.

    Attributes:
        name: the model's label, also the name of its results folder.
        arch: the architecture ("linear" or "cnn").
        grad_reg: the gradient-norm regularisation weight lambda.
        robust: the robust-loss settings, or None for a model trained without it.
        epochs: training epochs.
        checkpoint: the checkpoint file; its name records the settings it was trained with.
        results: the results folder.
        requests: what to score, in order.
        cost: relative run time of training and scoring (the longest jobs start first; the
            models certified are the main CNN and the robust-loss CNNs, the longest already).
        certify: what to certify by randomized smoothing, or None.
    """

    name: str
    arch: str
    grad_reg: float
    robust: RobustLossSpec | None
    epochs: int
    checkpoint: Path
    results: Path
    requests: tuple[ScoreRequest, ...]
    cost: float
    certify: CertifyRequest | None = None

    @property
    def certified(self) -> Path | None:
        """The certify folder, a sibling of ``results`` (a folder search stops at a results
        folder), or None when nothing is certified."""
        return None if self.certify is None else self.results.with_name(f"{self.name}-certify")


def _slug(value: float) -> str:
    return "0" if value == 0 else f"{value:g}".replace("+", "")


def model_specs(cfg: DemoConfig, out: Path) -> list[ModelSpec]:
    """One spec per model, in the order of the report: the CNN family, the robust-loss CNNs, the linear model.

    Args:
        cfg: the demo's settings.
        out: the demo's folder (checkpoints go to ``out/models``, results to ``out/results``).
    """
    size = "all" if cfg.train_size is None else str(cfg.train_size)
    specs = []
    certify_request = (
        CertifyRequest(
            f"0-{cfg.certify_points - 1}", float(cfg.certify_sigma), cfg.certify_n0, cfg.certify_n, cfg.certify_alpha
        )
        if cfg.certify_points > 0
        else None
    )

    def spec(
        arch: str,
        lam: float,
        epochs: int,
        requests: list[ScoreRequest],
        cost: float,
        robust: RobustLossSpec | None = None,
        certify: bool = False,
    ) -> ModelSpec:
        name = f"{cfg.data}-{arch}" + (f"-lambda{_slug(lam)}" if arch == "cnn" and robust is None else "")
        if robust is not None:  # the name records mu and sigma; the rest of the loss is checked on resumption
            name += f"-robust{_slug(robust.mu)}-sigma{_slug(robust.sigma)}"
        ckpt = out / "models" / f"{name}-e{epochs}-n{size}-s{cfg.seed}.pt"
        return ModelSpec(
            name=name,
            arch=arch,
            grad_reg=lam,
            robust=robust,
            epochs=epochs,
            checkpoint=ckpt,
            results=out / "results" / name,
            requests=tuple(requests),
            cost=cost,
            certify=certify_request if certify else None,
        )

    def main(methods: tuple[str, ...]) -> ScoreRequest:
        return ScoreRequest(
            "main", f"0-{cfg.points - 1}", tuple(cfg.sigmas), methods, (cfg.mc_samples,), (cfg.mmse_samples,)
        )

    def convergence(mc_samples: tuple[int, ...]) -> ScoreRequest:
        conv_idx = f"0-{cfg.convergence_points - 1}"
        return ScoreRequest(
            "convergence", conv_idx, (cfg.case_sigma,), ("mc", "mmse"), tuple(mc_samples), tuple(cfg.mmse_convergence)
        )

    lambdas = sorted(set(float(v) for v in cfg.lambdas) | {0.0})
    for lam in lambdas:
        requests = [main(PAPER_METHODS if lam == 0 else FAMILY_METHODS)]
        cost = 1.0 + (0.5 if lam else 0.0)
        if lam == 0:
            requests.append(
                ScoreRequest(
                    "pool",
                    f"0-{cfg.pool_points - 1}",
                    (cfg.case_sigma,),
                    ("mmse", "softmax"),
                    None,
                    (cfg.mmse_samples,),
                )
            )
            requests.append(convergence(cfg.mc_convergence))
            cost += 0.6
        specs.append(spec("cnn", lam, cfg.cnn_epochs, requests, cost, certify=lam == 0))
    for mu in sorted(set(float(v) for v in cfg.robust_mus)):
        # scored like the family's regularised members (the comparison needs their mc rows)
        robust = RobustLossSpec(
            mu=mu, sigma=float(cfg.robust_sigma), max_points=cfg.robust_max_points, warmup=cfg.robust_warmup
        )
        specs.append(spec("cnn", 0.0, cfg.cnn_epochs, [main(FAMILY_METHODS)], 2.5, robust, certify=True))
    specs.append(
        spec("linear", 0.0, cfg.linear_epochs, [main(PAPER_METHODS), convergence(cfg.mc_convergence_linear)], 0.4)
    )
    return specs


def _clipped(indices: str, n_test: int) -> str:
    """ "first-last" with last clipped to the test set's last index."""
    first, last = (int(v) for v in indices.split("-"))
    return f"{first}-{min(last, n_test - 1)}"


def grid_key(cfg: DemoConfig, spec: ModelSpec, model_sha: str, n_test: int) -> dict[str, Any]:
    """The key of a results folder's grid, as written to its :data:`GRID_FILE` (JSON-ready).

    Args:
        cfg: the demo's settings.
        spec: the model.
        model_sha: the sha256 (hex) of the model's checkpoint file.
        n_test: the number of test points; request indices are clipped to it.
    """
    requests = []
    for r in (req.to_dict() for req in spec.requests):
        r["indices"] = _clipped(r["indices"], n_test)
        requests.append(r)
    return {"model_sha256": model_sha, "seed": cfg.seed, "data": cfg.data, "requests": requests}


def certify_key(cfg: DemoConfig, request: CertifyRequest, model_sha: str, n_test: int) -> dict[str, Any]:
    """The key of a certify folder, as written to its :data:`GRID_FILE` (JSON-ready); a later
    demo with the same key resumes the folder, any other key recomputes it."""
    r = request.to_dict() | {"indices": _clipped(request.indices, n_test)}
    return {"model_sha256": model_sha, "seed": cfg.seed, "data": cfg.data, "certify": r}
