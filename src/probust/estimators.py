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
from probust.linearize import margin_jacobian, margins, plan_blocks, smoothed_margin_jacobian
from probust._budget import check_budget, resolve_budget, row_cost, rows_within
from probust._tuning import JACOBIANS, ForwardPlan, JacobianPlan, plan_forward, plan_jacobian, to_format, weights_in_format
from probust.noise import Noise, as_noise
from probust.result import Estimate

CDFS = ("mvn", "mv-sigmoid")
_MAX_POINTS_PER_CHUNK = 1024  # the mvn-cdf is batched: more points per call gain nothing beyond this
_CLEAN_ROWS = 256  # rows per clean forward pass: a handful of passes, far from any memory limit


class Estimator(ABC):
    """Common call convention: ``estimator(x, target=None, index_offset=0) -> Estimate``.

    Args:
        model: maps float inputs [B, *S] to logits [B, C] (C >= 2).
        batch_size: the most rows (clean or noisy copies) in one pass through the model.
            None (default): measured on the first call, the fastest that fits
            ``memory_budget`` (see :mod:`probust._tuning`), and kept for later calls.
        memory_budget: bytes (or a size such as ``"2GB"``) the estimator may hold at once;
            None: half the memory free on the device at each call. Work that cannot fit raises
            an error naming this argument.
        channels_last: run convolutional models with weights and inputs in channels_last
            memory format (True), or not (False); None: measured with the rest of the plan.
            The model's weights are given back in their own format after each call.
        seed: seed of every random stream the estimator uses.
        show_progress: draw a progress bar over the work.
    """

    method: str = ""

    def __init__(
        self,
        model: nn.Module,
        *,
        batch_size: int | None = None,
        memory_budget: int | str | None = None,
        channels_last: bool | None = None,
        seed: int = 0,
        show_progress: bool = False,
    ):
        if not callable(model):
            raise TypeError(f"model must be a torch.nn.Module (or callable) mapping [B, ...] to logits, got {model!r}")
        self.model = model
        self.batch_size = None if batch_size is None else check_positive_int(batch_size, "batch_size")
        self.memory_budget = check_budget(memory_budget)
        if channels_last is not None and not isinstance(channels_last, bool):
            raise ValueError(f"channels_last must be True, False or None (measured), got {channels_last!r}")
        self.channels_last = channels_last
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
        step = self.batch_size or _CLEAN_ROWS
        with torch.no_grad():
            parts = [self.model(x[i : i + step]) for i in range(0, x.shape[0], step)]
        return check_logits(torch.cat(parts), x.shape[0])

    def _budget(self, x: Tensor) -> int:
        return resolve_budget(self.memory_budget, x.device)

    def _forward_plan(self, x: Tensor, total_rows: int, noise: Noise | None = None) -> ForwardPlan:
        """Rows per forward pass without autograd (noisy copies) and the memory format.

        With ``noise``, a timed pass also draws and adds the noise, as the real passes do."""
        if not isinstance(self.model, nn.Module):
            return ForwardPlan(self.batch_size or _CLEAN_ROWS, False)
        keys = _rng.point_keys(self.seed, torch.zeros(1, dtype=torch.int64, device=x.device), _rng.STREAM_MC)

        def noisy_pass(rows: Tensor) -> object:
            # As MonteCarlo._count: draw, add the inputs in place, convert to the plan's format.
            assert noise is not None
            noisy = noise.sample(keys, 0, rows.shape[0], rows.shape[1:])[0]
            noisy += rows
            channels_last = rows.ndim == 4 and rows.is_contiguous(memory_format=torch.channels_last)
            return self.model(to_format(noisy, channels_last))

        return plan_forward(
            self.model,
            x[:8],
            budget=self._budget(x),
            total_rows=total_rows,
            rows=self.batch_size,
            channels_last=self.channels_last,
            step=None if noise is None else noisy_pass,
        )

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
        sigma: float | Tensor | Noise,
        n_samples: int = 10_000,
        *,
        confidence: float = 0.95,
        interval: str = "wilson",
        target_half_width: float | None = None,
        check_every: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
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

    def _count(self, x: Tensor, target: Tensor, keys: Tensor, start: int, n: int, bar, plan: ForwardPlan) -> Tensor:
        """Number of noisy copies (samples start..start+n-1) still predicted as target: int64 [B]."""
        shape = x.shape[1:]
        counts = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
        for points, first, count in plan_blocks(x.shape[0], n, plan.rows):
            noisy = self.noise.sample(keys[points], start + first, count, shape)
            noisy += x[points, None]
            with torch.inference_mode():
                logits = self.model(to_format(noisy.view(-1, *shape), plan.channels_last))
            kept = logits.argmax(dim=1).view(-1, count) == target[points, None]
            counts[points] += kept.sum(dim=1)
            bar.update(kept.numel())
        return counts

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        target = check_target(target, self._clean_logits(x))
        keys = _rng.point_keys(self.seed, indices, _rng.STREAM_MC)
        batch = x.shape[0]
        plan = self._forward_plan(x, batch * self.n_samples, self.noise)
        with (
            torch.no_grad(),
            weights_in_format(self.model, plan.channels_last),
            progress(batch * self.n_samples, "mc", self.show_progress) as bar,
        ):
            if self.target_half_width is None:
                successes = self._count(x, target, keys, 0, self.n_samples, bar, plan)
                trials = torch.full_like(successes, self.n_samples)
            else:
                successes = torch.zeros(batch, dtype=torch.int64, device=x.device)
                trials = torch.zeros_like(successes)
                active = torch.ones(batch, dtype=torch.bool, device=x.device)
                start = 0
                while start < self.n_samples and active.any():
                    n = min(self.check_every, self.n_samples - start)
                    rows = active.nonzero().flatten()
                    successes[rows] += self._count(x[rows], target[rows], keys[rows], start, n, bar, plan)
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
        sigma: float | Tensor | Noise,
        *,
        cdf: str = "mvn",
        tol: float = 1e-4,
        jacobian: str = "auto",
        class_chunk_size: int | None = None,
        differentiable: bool = False,
        p_fail: bool = False,
        fail_rtol: float = 1e-2,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        if jacobian not in JACOBIANS:
            raise ValueError(f"jacobian must be one of {JACOBIANS}, got {jacobian!r}")
        self.jacobian = jacobian
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
        chunk = self._points_per_chunk(x)
        with progress(x.shape[0], self.method, self.show_progress) as bar:
            for first in range(0, x.shape[0], chunk):
                rows = slice(first, min(first + chunk, x.shape[0]))
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

    #: noisy copies linearised per point (MMSE's N)
    copies = 1

    def _points_per_chunk(self, x: Tensor) -> int:
        """Points linearised together: their gradients, a float64 copy of them for the
        covariance, and their noisy copies' inputs take at most half the memory budget."""
        cost = row_cost(self.model, x)
        per_point = 4 * cost.classes * cost.input + 2 * self.copies * cost.input + 24 * cost.classes**2
        fits = rows_within(self._budget(x) // 2, per_point, what="the margin gradients of one point")
        return min(_MAX_POINTS_PER_CHUNK, fits)

    def _jacobian_plan(self, x: Tensor, rows: int) -> JacobianPlan:
        """How to differentiate ``rows`` rows like ``x`` (measured once per model; half the budget)."""
        cost = row_cost(self.model, x)
        return plan_jacobian(
            self.model,
            x[:16],
            cost.classes,
            budget=self._budget(x) // 2,
            total_rows=rows,
            strategy=self.jacobian,
            rows=self.batch_size,
            class_chunk=self.class_chunk_size,
            channels_last=self.channels_last,
            differentiable=self.differentiable,
            run=self._timed_jacobian,
        )

    def _timed_jacobian(self, plan: JacobianPlan, rows: Tensor, margins: int) -> object:
        with weights_in_format(self.model, plan.channels_last):
            return margin_jacobian(
                self.model,
                to_format(rows, plan.channels_last),
                class_chunk_size=plan.class_chunk,
                strategy=plan.strategy,
                limit=None if plan.strategy == "forward" else margins,
                fallback=False,
            )

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
        plan = self._jacobian_plan(x, x.shape[0])
        logits, targets, normals = [], [], []
        with weights_in_format(self.model, plan.channels_last):
            for first in range(0, x.shape[0], plan.rows):
                rows = slice(first, first + plan.rows)
                block_logits, block_target, u = margin_jacobian(
                    self.model,
                    to_format(x[rows], plan.channels_last),
                    None if target is None else target[rows],
                    class_chunk_size=plan.class_chunk,
                    differentiable=self.differentiable,
                    strategy=plan.strategy,
                )
                check_logits(block_logits, u.shape[0])
                logits.append(block_logits)
                targets.append(block_target)
                normals.append(u)
        target = torch.cat(targets)
        return target, margins(torch.cat(logits), target), torch.cat(normals) if len(normals) > 1 else normals[0]


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
        sigma: float | Tensor | Noise,
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

    @property
    def copies(self) -> int:  # type: ignore[override]
        return self.n_samples

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
        plan = self._jacobian_plan(x, x.shape[0] * self.n_samples)
        with weights_in_format(self.model, plan.channels_last):
            c, u = smoothed_margin_jacobian(
                self.model,
                x,
                target,
                self._draws(keys, x.shape[1:]),
                batch_size=plan.rows,
                class_chunk_size=plan.class_chunk,
                differentiable=self.differentiable,
                strategy=plan.strategy,
                to_rows=lambda rows: to_format(rows, plan.channels_last),
            )
        return target, c, u
