"""probust in the validation loop: torchmetrics metrics and a Lightning callback.

    metric = probust.metrics.AverageCaseRobustness(model, sigma=0.1)   # a torchmetrics.Metric
    metric.update(x, labels=y); metric.compute()["mean"]
    acc = probust.metrics.CertifiedAccuracy(model, sigma=0.25, radii=(0.25, 0.5))
    cb = probust.metrics.RobustnessCallback(sigma=0.1, certify_radii=(0.25,))   # lightning.pytorch

- :mod:`~probust.metrics.points`: what the metrics share (each point's index: its random stream).
- :mod:`~probust.metrics.robustness`: :class:`AverageCaseRobustness`.
- :mod:`~probust.metrics.certified`: :class:`CertifiedAccuracy`.
- :mod:`~probust.metrics.callback`: :class:`RobustnessCallback` (the ``lightning`` extra; imported
  on first use, so that the metrics need torchmetrics only).

Needs the ``metrics`` extra (torchmetrics); the callback the ``lightning`` extra. Docs: ``docs/metrics.md``.
"""

from __future__ import annotations

from typing import Any

from probust.metrics.certified import CertifiedAccuracy, radius_name
from probust.metrics.points import RANK_STRIDE, PointwiseMetric
from probust.metrics.robustness import DEFAULT_QUANTILES, AverageCaseRobustness, quantile_name

__all__ = [
    "DEFAULT_QUANTILES",
    "RANK_STRIDE",
    "AverageCaseRobustness",
    "CertifiedAccuracy",
    "PointwiseMetric",
    "RobustnessCallback",
    "quantile_name",
    "radius_name",
]


def __getattr__(name: str) -> Any:
    # The callback needs Lightning, the metrics only torchmetrics: import it on first use.
    if name == "RobustnessCallback":
        from probust.metrics.callback import RobustnessCallback

        return RobustnessCallback
    raise AttributeError(f"module 'probust.metrics' has no attribute {name!r}")
