"""Monte Carlo: the fraction of noisy copies whose prediction is unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from scipy import special, stats
from torch import Tensor, nn

from probust._checks import check_choice, check_fraction, check_positive_float, check_positive_int
from probust._inputs import check_target
from probust._progress import drop, progress, shown
from probust._user_model import finite_rows, weights_in_format
from probust.errors import OptionError
from probust.estimators.affine import AffineLogits
from probust.estimators.base import Estimator, check_noisy_copies, noisy_logits, plan_blocks
from probust.estimators.result import Estimate
from probust.execution import ForwardPlan
from probust.noise import STREAM_MC, Noise, as_noise, point_keys

#: The binomial intervals ``interval`` may name.
INTERVALS = ("wilson", "clopper-pearson")


def binomial_interval(successes: Tensor, trials: Tensor, confidence: float, method: str) -> tuple[Tensor, Tensor]:
    """Two-sided interval for a binomial proportion.

    Args:
        successes, trials: int [B] counts (trials >= 1).
        confidence: e.g. 0.95.
        method: "wilson" (score interval) or "clopper-pearson" (exact, conservative).

    Returns:
        (low, high) float64 [B] on the counts' device; low is exactly 0 where k = 0 and high
        exactly 1 where k = n (both methods), so the interval always holds k / n.
    """
    k = successes.double().cpu()
    n = trials.double().cpu()
    alpha = 1.0 - confidence
    if method == "wilson":
        zq = float(special.ndtri(1.0 - alpha / 2))
        p = k / n
        denom = 1 + zq**2 / n
        centre = (p + zq**2 / (2 * n)) / denom
        half = zq * torch.sqrt(p * (1 - p) / n + zq**2 / (4 * n**2)) / denom
        low, high = (centre - half).clamp(0, 1), (centre + half).clamp(0, 1)
        # The score interval's ends at k = 0 and k = n are exactly 0 and 1; in floats centre - half
        # is ~1e-18 and centre + half 1 - 1.1e-16, which would exclude the estimate p = 0 or 1.
        low = torch.where(k == 0, 0.0, low)
        high = torch.where(k == n, 1.0, high)
    elif method == "clopper-pearson":
        kn, tn = k.numpy(), n.numpy()
        low = torch.from_numpy(stats.beta.ppf(alpha / 2, kn, tn - kn + 1))
        high = torch.from_numpy(stats.beta.ppf(1 - alpha / 2, kn + 1, tn - kn))
        low = torch.where(k == 0, 0.0, low)
        high = torch.where(k == n, 1.0, high)
    else:
        raise OptionError(f"must be one of {INTERVALS}, got {method!r}", field="interval")
    return low.to(successes.device), high.to(successes.device)


#: Monte Carlo draws per point by default (the paper's M = 10,000): mc, mc_cv and mc_is's
#: ``n_samples``, their registry entries and ``probust estimate``'s ``--mc-samples``.
DEFAULT_DRAWS = 10_000
#: The Monte Carlo confidence interval's level by default: mc, mc_cv and mc_is's ``confidence``
#: and ``probust estimate``'s ``--confidence``.
DEFAULT_CONFIDENCE = 0.95


def noisy_predictions(
    model: nn.Module,
    noise: Noise,
    x: Tensor,
    keys: Tensor,
    start: int,
    n: int,
    plan: ForwardPlan,
    affine: AffineLogits | None = None,
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """The model's predicted class on noisy copies x + eps, one forward pass at a time.

    Copy j of point b is ``x[b] + noise.sample(keys[b], start + j)``: samples start..start+n-1
    of each point's stream, so a point's copies do not depend on how the points or the samples
    are split into passes. Call it with the model in eval mode, without autograd, with the
    weights in the plan's memory format (:func:`probust._user_model.weights_in_format`).

    Args:
        model: maps [R, *S] to logits [R, C].
        noise: the noise added to each copy (in the units of x).
        x: clean inputs [B, *S].
        keys: int64 [B], each point's key for the stream (:func:`probust.noise.point_keys`).
        start: the first sample of each point's stream.
        n: copies per point.
        plan: rows per pass and memory format.
        affine: where the model is affine (:mod:`probust.estimators.affine`), its logits at the
            points of ``x``: the copies' logits are drawn in the logits' space (copy j of point b
            from samples start + j of its stream, C normals each) instead of through the model.

    Yields:
        (points, predicted, finite) per pass: the slice of points it covers, their predicted
        classes int64 [P, count] and whether those logits were finite, bool [P, count] (a
        non-finite copy has no prediction: ``predicted`` is meaningless there).
    """
    for points, first, count in plan_blocks(x.shape[0], n, plan.rows):
        if affine is not None:
            logits = affine.logits(points, keys[points], start + first, count)
        else:
            logits = noisy_logits(model, noise, x[points], keys[points], start + first, count, plan.channels_last)
        yield points, logits.argmax(dim=1).view(-1, count), finite_rows(logits, count)


class MonteCarlo(Estimator):
    """The fraction of noisy copies x + eps still predicted as the target.

    Args:
        model, seed, execution: see :class:`Estimator`; the execution's ``batch_size`` bounds
            the noisy copies per forward pass (memory), not the number of samples.
        sigma: noise standard deviation per input coordinate, in the units of x; or a
            :class:`probust.noise.Noise` (Gaussian with any covariance, Uniform, Laplace).
        n_samples: M, noisy copies per point (the most, in adaptive mode).
        confidence: level of the returned interval (``ci_low``, ``ci_high``).
        interval: "wilson" or "clopper-pearson".
        target_half_width: adaptive mode: stop a point once its interval's half-width is
            at most this (checked every ``check_every`` samples). None: always M samples.
        check_every: samples between adaptive checks; fixed so results do not depend on batching.
    """

    method = "mc"

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        n_samples: int = DEFAULT_DRAWS,
        *,
        confidence: float = DEFAULT_CONFIDENCE,
        interval: str = "wilson",
        target_half_width: float | None = None,
        check_every: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        self.noise = as_noise(sigma)
        self.n_samples = check_positive_int(n_samples, "n_samples")
        self.confidence = check_fraction(confidence, "confidence")
        check_choice(interval, INTERVALS, "interval")
        self.interval = interval
        self.target_half_width = (
            None if target_half_width is None else check_positive_float(target_half_width, "target_half_width")
        )
        self.check_every = check_positive_int(check_every, "check_every")

    def _count(
        self,
        x: Tensor,
        target: Tensor,
        keys: Tensor,
        indices: Tensor,
        start: int,
        n: int,
        bar,
        plan: ForwardPlan,
        affine: AffineLogits | None,
    ) -> Tensor:
        """Number of noisy copies (samples start..start+n-1) still predicted as target: int64 [B].

        Raises ValueError (naming the points) if any copy gave NaN or inf logits."""
        counts = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
        nonfinite = torch.zeros_like(counts)
        for points, predicted, finite in noisy_predictions(self.model, self.noise, x, keys, start, n, plan, affine):
            kept = (predicted == target[points, None]) & finite
            counts[points] += kept.sum(dim=1)
            nonfinite[points] += predicted.shape[1] - finite.sum(dim=1)
            bar.update(kept.numel())
        check_noisy_copies(self.noise, nonfinite, n, indices)
        return counts

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        clean = self._clean_logits(x)
        target = check_target(target, clean)
        keys = point_keys(self.seed, indices, STREAM_MC)
        batch = x.shape[0]
        plan, affine = self._noisy_plan(x, self.noise, clean)
        with (
            torch.no_grad(),
            weights_in_format(self.model, plan.channels_last),
            progress(batch * self.n_samples, "mc", self.show_progress, unit="draw") as bar,
        ):
            if self.target_half_width is None:
                successes = self._count(x, target, keys, indices, 0, self.n_samples, bar, plan, affine)
                trials = torch.full_like(successes, self.n_samples)
            else:
                successes = torch.zeros(batch, dtype=torch.int64, device=x.device)
                trials = torch.zeros_like(successes)
                active = torch.ones(batch, dtype=torch.bool, device=x.device)
                start = 0
                while start < self.n_samples and active.any():
                    n = min(self.check_every, self.n_samples - start)
                    rows = active.nonzero().flatten()
                    successes[rows] += self._count(
                        x[rows],
                        target[rows],
                        keys[rows],
                        indices[rows],
                        start,
                        n,
                        bar,
                        plan,
                        None if affine is None else affine.subset(rows),
                    )
                    trials[rows] += n
                    start += n
                    low, high = binomial_interval(successes, trials, self.confidence, self.interval)
                    stopped = active & ~((high - low) / 2 > self.target_half_width)
                    active &= ~stopped
                    if shown(bar):  # the bar was opened over n_samples draws a point: the stopped take the rest off
                        drop(bar, int((self.n_samples - trials[stopped]).sum()))
        p = successes.double() / trials.double()
        low, high = binomial_interval(successes, trials, self.confidence, self.interval)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            stderr=torch.sqrt(p * (1 - p) / trials.double()),
            ci_low=low,
            ci_high=high,
            confidence=self.confidence,
            n_samples=trials,
        )
