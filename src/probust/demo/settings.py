"""The demo's settings: :class:`DemoConfig`, :func:`config_for` and their validation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from probust.errors import OptionError
from probust.estimators import PAPER_METHODS

__all__ = ["FAMILY_METHODS", "PAPER_METHODS", "DemoConfig", "DemoConfigError", "check_config", "config_for"]

#: What the main models are scored with: the paper's six methods (the method registry's).
#: The regularised family members and the robust-loss models: the four the figures compare.
FAMILY_METHODS = ("mc", "taylor", "mmse", "softmax")


class DemoConfigError(OptionError):
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
        certify_points: the first this many test points of the main CNN and of each robust-loss
            CNN are certified by randomized smoothing (:func:`probust.run.run_certify`, Cohen et
            al.'s CERTIFY with a Taylor estimate of the radius beside it; 0: none).
        certify_sigma: the smoothing noise level of the certificates (per pixel, [0, 1] units).
        certify_n0, certify_n, certify_alpha: CERTIFY's selection draws, estimation draws and
            failure probability per point (Cohen et al.: 100, 100,000 and 0.001; the demo draws
            fewer estimation samples, which only makes the certified radii smaller).
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
    certify_points: int = 100
    certify_sigma: float = 0.4
    certify_n0: int = 100
    certify_n: int = 5_000
    certify_alpha: float = 0.001
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
            certify_points=10,
            certify_sigma=0.2,
            certify_n0=50,
            certify_n=500,
        )
    base.update({k: v for k, v in overrides.items() if v is not None})
    return DemoConfig(**base)


def check_config(cfg: DemoConfig) -> None:
    """Refuse bad settings before any work starts.

    Raises:
        DemoConfigError: a setting is out of range; the message starts with the field's name.
    """
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
    if cfg.certify_points < 0:
        raise DemoConfigError(f"certify_points must be >= 0, got {cfg.certify_points}")
    if not cfg.certify_sigma > 0:
        raise DemoConfigError(f"certify_sigma must be positive, got {cfg.certify_sigma}")
    if cfg.certify_n0 < 1 or cfg.certify_n < 1:
        raise DemoConfigError(f"certify_n0 and certify_n must be at least 1, got {cfg.certify_n0}, {cfg.certify_n}")
    if not 0 < cfg.certify_alpha < 1:
        raise DemoConfigError(f"certify_alpha must be in (0, 1), got {cfg.certify_alpha}")
    if cfg.robust_max_points < 1:
        raise DemoConfigError(f"robust_max_points must be at least 1, got {cfg.robust_max_points}")
    if not 0 <= cfg.robust_warmup <= 1:
        raise DemoConfigError(f"robust_warmup must be a fraction in [0, 1], got {cfg.robust_warmup}")
