"""``CertifiedAccuracy``: randomized smoothing's certified accuracy at given radii, as a torchmetrics metric.

metric = probust.metrics.CertifiedAccuracy(model, sigma=0.25, radii=(0.25, 0.5), n=1000)
for x, y in val_loader:
    metric.update(x, y)
metric.compute()["certified_accuracy"]   # float64 [R]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from probust._inputs import check_labels
from probust.errors import OptionError
from probust.execution import Execution
from probust.metrics.points import PointwiseMetric, usable_inputs
from probust.noise import Noise
from probust.smoothing import Certify


def radius_name(radius: float) -> str:
    """The key of ``radius`` in :meth:`CertifiedAccuracy.loggable`: 0.25 -> "r0.25", 1.0 -> "r1"."""
    return f"r{radius:g}"


class CertifiedAccuracy(PointwiseMetric):
    """The share of points that randomized smoothing classifies correctly with a certified radius.

    Each :meth:`update` runs Cohen et al.'s CERTIFY (:class:`probust.smoothing.Certify`, built
    once, sequential over ``radii``) on the batch. A point counts at radius r when its smoothed
    prediction equals its label and r is certified (``CertifyResult.certified``): with
    probability at least 1 - ``alpha`` per point, every such count is right. Point indices,
    random streams and DDP as :class:`~probust.metrics.AverageCaseRobustness` (states summed by
    torchmetrics).

    Args:
        model: maps float inputs [B, *S] to logits [B, C]; kept by reference, not a submodule.
        sigma: the isotropic Gaussian noise's standard deviation per input coordinate (units of x).
        radii: the L2 radii r (units of x) at which to report certified accuracy.
        n0: selection draws per point (Cohen et al.: 100).
        n: estimation draws per point, at most (Cohen et al.: 100,000; a validation loop wants
            fewer: with n = 1,000 and alpha = 0.001 the largest certifiable radius is about 2.4 sigma).
        alpha: the probability that a point's certificate is wrong.
        seed: seed of every point's random streams.
        max_points: certify at most this many points per process between resets; None: all.
        metric_options: keyword arguments of :class:`torchmetrics.Metric`.
        **certify_options: passed to :class:`probust.smoothing.Certify` (``futility``,
            ``execution``).
    """

    higher_is_better = True
    full_state_update = False
    # The states (add_state, summed over ranks): float64 [R], scalars.
    certified_correct: Tensor
    abstained: Tensor
    count: Tensor

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        radii: Sequence[float],
        *,
        n0: int = 100,
        n: int = 1000,
        alpha: float = 0.001,
        seed: int = 0,
        max_points: int | None = None,
        metric_options: dict[str, Any] | None = None,
        **certify_options: Any,
    ) -> None:
        super().__init__(max_points=max_points, **(metric_options or {}))
        if radii is None:
            raise OptionError("is required: the radii (units of x) to report certified accuracy at", field="radii")
        # A metric inside a validation loop draws no bar of its own unless its execution says so.
        if certify_options.get("execution") is None:
            certify_options["execution"] = Execution()
        # The metric keeps the uniform-mixture sequential test (its documented figures, and its
        # "abstained" = no class at all rather than no listed radius); pass procedure="prior" for
        # the analytic-prior test (docs/certify.md).
        certify_options.setdefault("procedure", "sequential")
        self.certifier = Certify(model, sigma, n0=n0, n=n, alpha=alpha, radii=radii, seed=seed, **certify_options)
        self.radii: tuple[float, ...] = self.certifier.radii or ()
        zeros = torch.zeros(len(self.radii), dtype=torch.float64)
        self.add_state("certified_correct", default=zeros, dist_reduce_fx="sum")
        self.add_state("abstained", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.set_dtype(torch.float64)

    @property
    def model(self) -> nn.Module:
        """The model certified."""
        return self.certifier.model

    def update(self, x: Tensor, labels: Tensor) -> None:
        """Certify the batch and count, per radius, the points certified correct.

        Args:
            x: float inputs [B, *S], in the units sigma is measured in.
            labels: int [B], the true classes.
        """
        labels = check_labels(labels, x.shape[0], field="labels")
        rows, first = self._take(x)
        if rows == 0:
            return
        with torch.inference_mode(False):
            result = self.certifier(usable_inputs(x[:rows]), index_offset=first)
        assert result.certified is not None  # radii were given
        correct = result.correct(labels[:rows].to(result.prediction.device))
        device = self.device
        self.certified_correct += (result.certified & correct[:, None]).sum(0).to(device, torch.float64)
        self.abstained += result.abstained.sum().to(device, torch.float64)
        self.count += float(rows)

    def compute(self) -> dict[str, Tensor]:
        """The summary of every point since the last reset (all ranks' under DDP).

        Returns:
            A dict of float64 tensors: ``certified_accuracy`` [R], the share of points certified
            correct at each radius of :attr:`radii`; ``abstained`` (scalar), the share where
            CERTIFY abstains; ``count`` (scalar), the number of points. NaN shares without points.
        """
        count = self.count
        return {
            "certified_accuracy": self.certified_correct / count,
            "abstained": self.abstained / count,
            "count": count.clone(),
        }

    def loggable(
        self, values: dict[str, Tensor] | None = None, prefix: str = "certified_accuracy/"
    ) -> dict[str, Tensor]:
        """:meth:`compute`'s values as scalars named for a logger: ``<prefix>r0.25`` ... per radius
        (:func:`radius_name`), ``<prefix>abstained``."""
        values = self.compute() if values is None else values
        # torchmetrics squeezes a one-element result to a scalar: one radius gives a 0-d tensor.
        shares = values["certified_accuracy"].reshape(-1)
        out = {f"{prefix}{radius_name(r)}": v for r, v in zip(self.radii, shares, strict=True)}
        out[f"{prefix}abstained"] = values["abstained"]
        return out
