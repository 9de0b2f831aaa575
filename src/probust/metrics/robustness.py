"""``AverageCaseRobustness``: p_robust of the points seen in a validation loop, as a torchmetrics metric.

metric = probust.metrics.AverageCaseRobustness(model, sigma=0.1)
for x, y in val_loader:
    metric.update(x, labels=y)
values = metric.compute()   # {"mean": ..., "quantiles": [Q], "below_threshold": ..., ...}
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from probust._inputs import check_labels
from probust.errors import OptionError, user_stacklevel
from probust.estimators import Estimator, LinearisationWarning, make_estimator, untrusted
from probust.metrics.points import PointwiseMetric, usable_inputs
from probust.mvn import add_rows
from probust.noise import Noise

#: The default quantiles of p reported by :class:`AverageCaseRobustness`.
DEFAULT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def quantile_name(q: float) -> str:
    """The key of quantile ``q`` in :meth:`AverageCaseRobustness.loggable`: 0.05 -> "q05", 0.5 ->
    "q50", 0.025 -> "q2.5" (percent, two digits at least)."""
    return f"q{100 * q:02g}"


def _check_quantiles(quantiles: Sequence[float]) -> tuple[float, ...]:
    try:
        values = tuple(float(q) for q in quantiles)
    except (TypeError, ValueError):
        raise OptionError(f"must be a sequence of numbers in [0, 1], got {quantiles!r}", field="quantiles") from None
    if not all(0.0 <= q <= 1.0 for q in values):
        raise OptionError(f"must be numbers in [0, 1], got {list(values)}", field="quantiles")
    return values


class AverageCaseRobustness(PointwiseMetric):
    """p_robust of every point seen, summarised: mean, quantiles, per class, share below a threshold.

    Each :meth:`update` runs one probust estimator call on the batch (``make_estimator(method,
    model, sigma, n_samples=..., seed=..., **estimator_options)``, built once) and keeps each
    point's p and classes; :meth:`compute` summarises every point since the last reset. The
    point count gives each point its index (its random stream, see
    :mod:`probust.metrics.points`): the values equal those of one probust call on all the
    points concatenated, however they were batched. Under DDP the states are gathered by
    torchmetrics (``dist_reduce_fx="cat"``); ranks use disjoint streams.

    The model is put in eval mode for the estimate and given back in its own mode; no gradient
    reaches its parameters, and ``update`` works under ``torch.no_grad()`` and
    ``torch.inference_mode()`` (Lightning's validation loop).

    Args:
        model: maps float inputs [B, *S] to logits [B, C]. Kept by reference, not registered as
            a submodule: the metric's ``state_dict`` and ``.to()`` leave the model alone.
        sigma: noise standard deviation per input coordinate, in the units of x (or a Noise).
        method: one of :data:`probust.METHODS` ("mmse", "taylor", "mc", ...).
        n_samples: MMSE copies or Monte Carlo draws (the method's default if None).
        seed: seed of every point's random streams.
        quantiles: the quantiles of p to report, in [0, 1].
        threshold: report the share of points with p strictly below it (the points whose
            prediction more likely than not changes under the noise at 0.5).
        num_classes: the length C of the per-class means; None: 1 + the largest class seen.
        max_points: measure at most this many points per process between resets; None: all.
        metric_options: keyword arguments of :class:`torchmetrics.Metric` (``sync_on_compute``,
            ``process_group``, ...).
        **estimator_options: passed to the estimator (``tol``, ``execution``, ...).

    Example:
        >>> metric = AverageCaseRobustness(model, sigma=0.1, n_samples=5)
        >>> metric.update(x, labels=y)            # x [B, *S]; the prediction's survival is measured
        >>> metric.compute()["mean"]              # float64 scalar tensor
    """

    higher_is_better = True
    full_state_update = False
    # The states (add_state), per point: lists of float64 [b] before a DDP sync, one tensor after.
    p: list[Tensor]
    target: list[Tensor]
    label: list[Tensor]
    untrusted: list[Tensor]

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise | None,
        method: str = "mmse",
        *,
        n_samples: int | None = None,
        seed: int = 0,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
        threshold: float = 0.5,
        num_classes: int | None = None,
        max_points: int | None = None,
        metric_options: dict[str, Any] | None = None,
        **estimator_options: Any,
    ) -> None:
        super().__init__(max_points=max_points, **(metric_options or {}))
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise OptionError(f"must be a number in [0, 1], got {threshold!r}", field="threshold")
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
        ):
            raise OptionError(f"must be None or an integer >= 1, got {num_classes!r}", field="num_classes")
        self.method = method
        self.sigma = sigma
        self.quantiles = _check_quantiles(quantiles)
        self.threshold = float(threshold)
        self.num_classes = num_classes
        # A plain attribute, not a submodule: the estimator holds the model by reference.
        self.estimator: Estimator = make_estimator(
            method, model, sigma, n_samples=n_samples, seed=seed, **estimator_options
        )
        # Every state is float64 (classes too, exact below 2**53): a rank without points is
        # gathered as an empty tensor of the metric's dtype, which must match the others'.
        self.add_state("p", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self.add_state("label", default=[], dist_reduce_fx="cat")
        # Per point: 1 where the trust check flags the linearisation, 0 where it passes, NaN
        # where there was none (Monte Carlo, softmax, check_draws=0).
        self.add_state("untrusted", default=[], dist_reduce_fx="cat")
        self.set_dtype(torch.float64)

    @property
    def model(self) -> nn.Module:
        """The model measured."""
        return self.estimator.model

    def update(self, x: Tensor, target: Tensor | None = None, *, labels: Tensor | None = None) -> None:
        """Estimate p_robust on the batch and keep each point's p and classes.

        Args:
            x: float inputs [B, *S], in the units sigma is measured in.
            target: int [B], the class whose survival is measured (probust's ``target``, not
                torchmetrics' label); default the model's prediction on the clean x.
            labels: int [B], the true classes, for :meth:`compute`'s ``class_mean_by_label``
                (-1 for a point without one). Optional.
        """
        target = None if target is None else check_labels(target, x.shape[0], field="target")
        labels = None if labels is None else check_labels(labels, x.shape[0], field="labels", missing=True)
        rows, first = self._take(x)
        if rows == 0:
            return
        # The estimator warns once per call, which is once per validation batch here: the
        # flags are kept instead, and compute() reports their share (one warning per epoch).
        with torch.inference_mode(False), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", LinearisationWarning)
            result = self.estimator(
                usable_inputs(x[:rows]),
                None if target is None else usable_inputs(target[:rows]),
                index_offset=first,
            )
        device = self.device
        flags = untrusted(result).double()
        if result.agreement is None:
            flags = torch.full_like(flags, math.nan)
        self.untrusted.append(flags.to(device))
        self.p.append(result.p.detach().to(device, torch.float64))
        self.target.append(result.target.detach().to(device, torch.float64))
        label = torch.full((rows,), -1.0) if labels is None else labels[:rows].double()
        self.label.append(label.to(device))

    def compute(self) -> dict[str, Tensor]:
        """The summary of every point since the last reset (all ranks' under DDP).

        Returns:
            A dict of float64 tensors:
            ``mean`` (scalar), the mean p;
            ``quantiles`` [Q], p's quantiles at :attr:`quantiles` (linear interpolation, as
            ``numpy.quantile``);
            ``below_threshold`` (scalar), the share of points with p < :attr:`threshold`;
            ``count`` (scalar), the number of points;
            ``untrusted`` (scalar), the share of checked points whose linearisation the trust
            check flags (:func:`probust.estimators.untrusted`: their p may be far from the
            model's; Taylor and MMSE only, NaN for other methods); one
            :class:`~probust.LinearisationWarning` per compute where it is above 0;
            ``class_mean_by_target`` [C], the mean p of the points whose measured class (the
            prediction unless ``target`` was given) is c, NaN for a class without points;
            ``class_mean_by_label`` [C], the mean p of the points whose true label is c (the
            grouping of the class-bias experiment), NaN for a class without labelled points.
            Without any point, every value is NaN and ``count`` 0.
        """
        p = _cat(self.p, self.device)
        target = _cat(self.target, self.device).long()
        label = _cat(self.label, self.device).long()
        seen = torch.cat([target, label])
        classes = self.num_classes or (int(seen.max().item()) + 1 if seen.numel() else 0)
        nan = torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        if p.numel() == 0:
            return {
                "mean": nan,
                "quantiles": nan.repeat(len(self.quantiles)),
                "below_threshold": nan,
                "count": torch.zeros((), dtype=torch.float64, device=self.device),
                "untrusted": nan,
                "class_mean_by_target": nan.repeat(classes),
                "class_mean_by_label": nan.repeat(classes),
            }
        levels = torch.tensor(self.quantiles, dtype=torch.float64, device=p.device)
        flags = _cat(self.untrusted, self.device)
        checked = flags[~flags.isnan()]
        share = checked.mean() if checked.numel() else nan
        if checked.numel() and bool(checked.any()):
            warnings.warn(
                f"{self.estimator.method}: the linearisation disagrees with the model on many noise draws at "
                f"{int(checked.sum())} of {checked.numel()} points (the metric's 'untrusted' share): their p may be "
                "far from the model's; use method 'mc', a smaller sigma or more MMSE copies",
                LinearisationWarning,
                stacklevel=user_stacklevel(),
            )
        return {
            "mean": p.mean(),
            "quantiles": torch.quantile(p, levels) if levels.numel() else levels,
            "below_threshold": (p < self.threshold).double().mean(),
            "count": torch.tensor(float(p.numel()), dtype=torch.float64, device=p.device),
            "untrusted": share,
            "class_mean_by_target": _class_means(p, target, classes),
            "class_mean_by_label": _class_means(p, label, classes),
        }

    def loggable(self, values: dict[str, Tensor] | None = None, prefix: str = "p_robust/") -> dict[str, Tensor]:
        """:meth:`compute`'s values as scalars, named for a logger.

        Keys: ``mean``, ``q05`` ... (:func:`quantile_name`), ``below_<threshold>`` (e.g.
        ``below_0.5``), ``count`` and, for Taylor and MMSE, ``untrusted``, each after ``prefix``. The per-class means are left out
        (C values each epoch); log them from ``values`` where wanted.

        Args:
            values: the result of :meth:`compute` (default: computed now).
            prefix: put before every key.
        """
        values = self.compute() if values is None else values
        out = {f"{prefix}mean": values["mean"]}
        out.update(
            {
                f"{prefix}{quantile_name(q)}": v
                for q, v in zip(self.quantiles, values["quantiles"].reshape(-1), strict=True)
            }
        )
        out[f"{prefix}below_{self.threshold:g}"] = values["below_threshold"]
        out[f"{prefix}count"] = values["count"]
        if not bool(values["untrusted"].isnan()):
            out[f"{prefix}untrusted"] = values["untrusted"]
        return out


def _cat(parts: list[Tensor] | Tensor, device: torch.device) -> Tensor:
    """A list state as one tensor (after a DDP sync torchmetrics leaves a tensor already)."""
    if isinstance(parts, Tensor):
        return parts.reshape(-1).to(torch.float64)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device)


def _class_means(p: Tensor, classes: Tensor, num_classes: int) -> Tensor:
    """The mean of ``p`` over the points of each class in [0, num_classes), NaN where a class has
    none; points with class -1 (no label) or >= num_classes are left out."""
    keep = (classes >= 0) & (classes < num_classes)
    sums = add_rows(torch.zeros(num_classes, dtype=torch.float64, device=p.device), classes[keep], p[keep])
    counts = torch.bincount(classes[keep], minlength=num_classes).to(torch.float64)
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, math.nan))
