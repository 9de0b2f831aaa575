"""The estimators of average-case robustness, all called the same way.

    est = probust.Taylor(model, sigma=0.1)
    r = est(x)                  # x [B, *S] -> Estimate; r.p float64 [B]
    r = est(x, target=y, index_offset=1000)

Each estimator puts the model in eval mode for the computation and restores every
submodule's mode afterwards. Inputs are moved to the model's device; results stay there.
Randomness (noise copies, QMC points) depends only on ``seed`` and each point's index
``index_offset + row``, so splitting a data set into batches differently, or resuming,
gives identical numbers.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from probust import _maps, _rng
from probust._checks import (
    check_logits,
    check_positive_float,
    check_positive_int,
    check_target,
    check_x,
    eval_mode,
    model_device,
)
from probust._progress import progress
from probust._stats import INTERVALS, binomial_interval
from probust.linearize import logit_jacobian, margin_gradients, margins, plan_blocks, smoothed_margin_jacobian
from probust.noise import Noise, as_noise
from probust.result import Estimate

CDFS = ("mvn", "mv-sigmoid")


class Estimator(ABC):
    """Common call convention: ``estimator(x, target=None, index_offset=0) -> Estimate``.

    Args:
        model: maps float inputs [B, *S] to logits [B, C] (C >= 2).
        batch_size: the most rows (clean or noisy copies) in one forward pass.
        seed: seed of every random stream the estimator uses.
        show_progress: draw a progress bar over the work.
    """

    method: str = ""

    def __init__(self, model: nn.Module, *, batch_size: int = 1024, seed: int = 0, show_progress: bool = False):
        if not callable(model):
            raise TypeError(f"model must be a torch.nn.Module (or callable) mapping [B, ...] to logits, got {model!r}")
        self.model = model
        self.batch_size = check_positive_int(batch_size, "batch_size")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.show_progress = show_progress

    def __call__(self, x: Tensor, target: Tensor | None = None, *, index_offset: int = 0) -> Estimate:
        """Estimate p_robust for each row of ``x``.

        Args:
            x: float inputs [B, *S] in the units the noise is measured in.
            target: long [B], the class whose survival is measured; default the model's
                prediction on the clean x (a tie there is an error).
            index_offset: the index of row 0 in the whole data set, so that a point's random
                stream is the same however the data set is batched.
        """
        x = check_x(x)
        if isinstance(index_offset, bool) or not isinstance(index_offset, int) or index_offset < 0:
            raise ValueError(f"index_offset must be an int >= 0, got {index_offset!r}")
        device = model_device(self.model) if isinstance(self.model, nn.Module) else None
        if device is not None and x.device != device:
            x = x.to(device)
        dtype = _parameter_dtype(self.model)
        if dtype is not None and x.dtype != dtype:
            x = x.to(dtype)
        indices = torch.arange(index_offset, index_offset + x.shape[0], device=x.device)
        with eval_mode(self.model) if isinstance(self.model, nn.Module) else contextlib.nullcontext():
            return self._estimate(x, target, indices)

    @abstractmethod
    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate: ...

    def _clean_logits(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            parts = [self.model(x[i : i + self.batch_size]) for i in range(0, x.shape[0], self.batch_size)]
        return check_logits(torch.cat(parts), x.shape[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.method!r}, seed={self.seed})"


def _parameter_dtype(model) -> torch.dtype | None:
    """The floating dtype the model computes in, so inputs can be cast to it."""
    if isinstance(model, nn.Module):
        for parameter in model.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return None


class Softmax(Estimator):
    """The softmax baseline: p = softmax(f(x) / T)_t. Independent of any noise.

    Args:
        model, batch_size, seed, show_progress: see :class:`Estimator`.
        temperature: T > 0.
    """

    method = "softmax"

    def __init__(self, model: nn.Module, temperature: float = 1.0, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.temperature = check_positive_float(temperature, "temperature")

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        logits = self._clean_logits(x)
        target = check_target(target, logits)
        probs = torch.softmax(logits.to(torch.float64) / self.temperature, dim=1)
        return Estimate(p=probs.gather(1, target[:, None]).squeeze(1), target=target, method=self.method)


class MonteCarlo(Estimator):
    """The fraction of noisy copies x + eps still predicted as the target.

    Args:
        model, batch_size, seed, show_progress: see :class:`Estimator`; ``batch_size`` bounds
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
        sigma: float | Tensor | Noise = None,
        n_samples: int = 10_000,
        *,
        confidence: float = 0.95,
        interval: str = "wilson",
        target_half_width: float | None = None,
        check_every: int = 1000,
        batch_size: int = 4096,
        **kwargs,
    ) -> None:
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.noise = as_noise(sigma)
        self.n_samples = check_positive_int(n_samples, "n_samples")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if interval not in INTERVALS:
            raise ValueError(f"interval must be one of {INTERVALS}, got {interval!r}")
        self.confidence = confidence
        self.interval = interval
        self.target_half_width = (
            None if target_half_width is None else check_positive_float(target_half_width, "target_half_width")
        )
        self.check_every = check_positive_int(check_every, "check_every")

    def _count(self, x: Tensor, target: Tensor, keys: Tensor, start: int, n: int, bar) -> Tensor:
        """Number of noisy copies (samples start..start+n-1) still predicted as target: int64 [B]."""
        shape = x.shape[1:]
        counts = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
        for points, first, count in plan_blocks(x.shape[0], n, self.batch_size):
            noisy = x[points, None] + self.noise.sample(keys[points], start + first, count, shape)
            logits = self.model(noisy.view(-1, *shape))
            kept = logits.argmax(dim=1).view(-1, count) == target[points, None]
            counts[points] += kept.sum(dim=1)
            bar.update(kept.numel())
        return counts

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        target = check_target(target, self._clean_logits(x))
        keys = _rng.point_keys(self.seed, indices, _rng.STREAM_MC)
        batch = x.shape[0]
        with torch.no_grad(), progress(batch * self.n_samples, "mc", self.show_progress) as bar:
            if self.target_half_width is None:
                successes = self._count(x, target, keys, 0, self.n_samples, bar)
                trials = torch.full_like(successes, self.n_samples)
            else:
                successes = torch.zeros(batch, dtype=torch.int64, device=x.device)
                trials = torch.zeros_like(successes)
                active = torch.ones(batch, dtype=torch.bool, device=x.device)
                start = 0
                while start < self.n_samples and active.any():
                    n = min(self.check_every, self.n_samples - start)
                    rows = active.nonzero().flatten()
                    successes[rows] += self._count(x[rows], target[rows], keys[rows], start, n, bar)
                    trials[rows] += n
                    start += n
                    low, high = binomial_interval(successes, trials, self.confidence, self.interval)
                    active &= (high - low) / 2 > self.target_half_width
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


class _Linearised(Estimator):
    """Shared by Taylor and MMSE: linearise the margins, then map z to a probability."""

    base_method = ""

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise = None,
        *,
        cdf: str = "mvn",
        tol: float = 1e-4,
        class_chunk_size: int | None = None,
        batch_size: int = 256,
        differentiable: bool = False,
        p_fail: bool = False,
        fail_rtol: float = 1e-2,
        **kwargs,
    ) -> None:
        super().__init__(model, batch_size=batch_size, **kwargs)
        self.noise = as_noise(sigma)
        if cdf not in CDFS:
            raise ValueError(f"cdf must be one of {CDFS}, got {cdf!r}")
        self.cdf = cdf
        self.tol = check_positive_float(tol, "tol")
        self.class_chunk_size = None if class_chunk_size is None else check_positive_int(class_chunk_size, "class_chunk_size")
        if not isinstance(differentiable, bool) or not isinstance(p_fail, bool):
            raise ValueError(f"differentiable and p_fail must be bools, got {differentiable!r} and {p_fail!r}")
        self.differentiable = differentiable
        self.p_fail = p_fail
        self.fail_rtol = check_positive_float(fail_rtol, "fail_rtol")
        if self.fail_rtol >= 1:
            raise ValueError(f"fail_rtol must be in (0, 1), got {fail_rtol!r}")

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.base_method if self.cdf == "mvn" else f"{self.base_method}_mvs"

    @abstractmethod
    def _linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(target [B], margins c [B, C], normals u [B, C, *S]) for a chunk of points."""

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        parts = []
        with progress(x.shape[0], self.method, self.show_progress) as bar:
            for first in range(0, x.shape[0], self._points_per_chunk()):
                rows = slice(first, min(first + self._points_per_chunk(), x.shape[0]))
                chunk_target = None if target is None else torch.as_tensor(target, device=x.device)[rows]
                parts.append(self._from_linearisation(*self._linearise(x[rows], chunk_target, indices[rows])))
                bar.update(rows.stop - rows.start)
        return Estimate(
            **{
                name: torch.cat([getattr(part, name) for part in parts])
                if getattr(parts[0], name) is not None
                else None
                for name in ("p", "target", "margin", "grad_norm", "z", "cdf_error", "p_fail", "p_fail_error")
            },
            method=self.method,
        )

    def _points_per_chunk(self) -> int:
        return self.batch_size

    def _from_linearisation(self, target: Tensor, c: Tensor, u: Tensor) -> Estimate:
        std = _maps.standardise(c, u, target, self.noise)
        p_fail = fail_error = None
        if self.cdf == "mvn":
            p, err = _maps.mvn_probability(std, tol=self.tol, seed=self.seed)
            if self.p_fail:
                p_fail, fail_error = _maps.mvn_fail_probability(std, rtol=self.fail_rtol, seed=self.seed)
        else:
            p, err = _maps.mv_sigmoid(std.z_others), None
            if self.p_fail:  # a closed form: exact up to rounding
                p_fail = _maps.mv_sigmoid_fail(std.z_others)
                fail_error = torch.zeros_like(p_fail)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            margin=c,
            grad_norm=u.detach().flatten(2).norm(dim=2),  # a diagnostic: no graph (norm'(0) is NaN)
            z=std.z,
            cdf_error=err,
            p_fail=p_fail,
            p_fail_error=fail_error,
        )


class Taylor(_Linearised):
    """p_robust from the first-order Taylor linearisation of the margins at x.

    c_i = g_i(x), u_i = grad g_i(x); exact for linear models under Gaussian noise.

    Args:
        model, batch_size, seed, show_progress: see :class:`Estimator`.
        sigma: noise standard deviation per input coordinate, in the units of x; or a
            :class:`probust.noise.Noise` (its covariance S enters as u S u^T).
        cdf: "mvn" (multivariate normal CDF) or "mv-sigmoid" (the paper's closed form).
        tol: absolute error tolerance of the mvn-cdf.
        class_chunk_size: classes per vmapped backward pass (bounds memory for large C).
        differentiable: keep the autograd graph, so that ``r.p`` (and ``r.z``, ``r.margin``)
            can be differentiated with respect to the model's parameters and, when it requires
            grad, the input x (double backpropagation through the margins' Jacobian, then
            through the mvn-cdf or the mv-sigmoid). Off by default: the graph costs memory and
            time. The mvn-cdf's gradient holds its QMC points fixed (see :mod:`probust.mvn`).
        p_fail: also compute ``r.p_fail`` = 1 - p directly, with relative accuracy, and its
            relative error ``r.p_fail_error`` (:func:`probust.tails.mvn_sf`; the mv-sigmoid's
            is a closed form). Costs up to C - 1 extra QMC integrals per point for the mvn-cdf.
        fail_rtol: target relative error of ``r.p_fail``.
    """

    base_method = "taylor"

    def _linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, jacobian = logit_jacobian(
            self.model, x, class_chunk_size=self.class_chunk_size, differentiable=self.differentiable
        )
        target = check_target(target, check_logits(logits, x.shape[0]))
        return target, margins(logits, target), margin_gradients(jacobian, target)


class MMSE(_Linearised):
    """p_robust from the MMSE (SmoothGrad) linearisation: margins and gradients averaged
    over N noisy copies x + eps_j, eps_j drawn from the same noise.

    Args:
        model, sigma, cdf, tol, class_chunk_size, batch_size, seed, show_progress, differentiable,
            p_fail, fail_rtol: see :class:`Taylor`. Differentiable MMSE differentiates through the
            N noisy copies with the noise held fixed (a pathwise gradient of the smoothed margins).
        n_samples: N, noisy copies per point (the paper uses 5 to 500).
        sampling: "centred" (default): for Gaussian noise the N draws are centred to sum to
            zero and rescaled by sqrt(N / (N - 1)), so each copy is still exactly N(0, S)
            (the average stays unbiased) while the linear part of the model cancels exactly:
            MMSE is exact for linear models at any N >= 2. "iid": independent draws, as in
            the paper. Non-Gaussian noise always uses independent draws.
    """

    base_method = "mmse"
    SAMPLINGS = ("centred", "iid")

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise = None,
        n_samples: int = 5,
        *,
        sampling: str = "centred",
        **kwargs,
    ) -> None:
        super().__init__(model, sigma, **kwargs)
        self.n_samples = check_positive_int(n_samples, "n_samples")
        if sampling not in self.SAMPLINGS:
            raise ValueError(f"sampling must be one of {self.SAMPLINGS}, got {sampling!r}")
        self.sampling = sampling

    def _points_per_chunk(self) -> int:
        return max(1, self.batch_size // self.n_samples)

    def _draws(self, keys: Tensor, shape: torch.Size) -> Tensor:
        """Noise [B, N, *S] for the N copies of each point."""
        eps = self.noise.sample(keys, 0, self.n_samples, shape)
        if self.sampling == "centred" and self.noise.is_gaussian and self.n_samples >= 2:
            # A linear map of Gaussians: each centred, rescaled draw is again exactly N(0, S).
            eps = (eps - eps.mean(dim=1, keepdim=True)) * (self.n_samples / (self.n_samples - 1)) ** 0.5
        return eps

    def _linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        target = check_target(target, self._clean_logits(x))
        keys = _rng.point_keys(self.seed, indices, _rng.STREAM_MMSE)
        c, u = smoothed_margin_jacobian(
            self.model,
            x,
            target,
            self._draws(keys, x.shape[1:]),
            batch_size=self.batch_size,
            class_chunk_size=self.class_chunk_size,
            differentiable=self.differentiable,
        )
        return target, c, u
