"""The call convention every estimator shares.

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

from probust import _rng
from probust._checks import (
    check_logits,
    check_noisy_logits,
    check_positive_int,
    check_x,
    eval_mode,
    model_device,
)
from probust.estimators.estimate import Estimate
from probust.execution.budget import check_budget, resolve_budget
from probust.execution.tuning import ForwardPlan, plan_forward, to_format
from probust.noise import Noise

CLEAN_ROWS = 256  # rows per clean forward pass: a handful of passes, far from any memory limit


class PointwiseMethod:
    """What every method that runs a model over a batch of points shares: the arguments, the
    input checks, eval mode and the execution plan. Each point has its own random streams,
    derived from ``seed`` and its index in the data set. Subclasses: :class:`Estimator` (returns
    an :class:`Estimate`) and the randomized-smoothing procedures of :mod:`probust.smoothing`.

    Args:
        model: maps float inputs [B, *S] to logits [B, C] (C >= 2).
        batch_size: the most rows (clean or noisy copies) in one pass through the model.
            None (default): measured on the first call, the fastest that fits
            ``memory_budget`` (see :mod:`probust.execution.tuning`), and kept for later calls.
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

    def _prepare(self, x: Tensor, index_offset: int) -> tuple[Tensor, Tensor]:
        """Check ``x`` and ``index_offset``; move ``x`` to the model's device and dtype.

        Returns:
            (x, indices): the inputs [B, *S] and each row's index in the data set, int64 [B].
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
        return x, torch.arange(index_offset, index_offset + x.shape[0], device=x.device)

    def _evaluating(self) -> contextlib.AbstractContextManager:
        """Eval mode for the computation, every submodule's own mode given back afterwards."""
        return eval_mode(self.model) if isinstance(self.model, nn.Module) else contextlib.nullcontext()

    def _clean_logits(self, x: Tensor) -> Tensor:
        step = self.batch_size or CLEAN_ROWS
        with torch.no_grad():
            parts = [self.model(x[i : i + step]) for i in range(0, x.shape[0], step)]
        return check_logits(torch.cat(parts), x.shape[0])

    def _budget(self, x: Tensor) -> int:
        return resolve_budget(self.memory_budget, x.device)

    def _forward_plan(self, x: Tensor, total_rows: int, noise: Noise | None = None) -> ForwardPlan:
        """Rows per forward pass without autograd (noisy copies) and the memory format.

        With ``noise``, a timed pass also draws and adds the noise, as the real passes do."""
        if not isinstance(self.model, nn.Module):
            return ForwardPlan(self.batch_size or CLEAN_ROWS, False)
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


class Estimator(PointwiseMethod, ABC):
    """Common call convention: ``estimator(x, target=None, index_offset=0) -> Estimate``.

    Args:
        model, batch_size, memory_budget, channels_last, seed, show_progress: see
            :class:`PointwiseMethod`.
    """

    def __call__(self, x: Tensor, target: Tensor | None = None, *, index_offset: int = 0) -> Estimate:
        """Estimate p_robust for each row of ``x``.

        Args:
            x: float inputs [B, *S] in the units the noise is measured in.
            target: long [B], the class whose survival is measured; default the model's
                prediction on the clean x (a tie there is an error).
            index_offset: the index of row 0 in the whole data set, so that a point's random
                stream is the same however the data set is batched.
        """
        x, indices = self._prepare(x, index_offset)
        with self._evaluating():
            return self._estimate(x, target, indices)

    @abstractmethod
    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate: ...


def check_noisy_copies(noise: Noise, nonfinite: Tensor, copies: int, indices: Tensor) -> None:
    """Refuse NaN or inf logits on noisy copies (:func:`probust._checks.check_noisy_logits`),
    naming the noise in words (:func:`noise_words`)."""
    check_noisy_logits(nonfinite, copies, indices, noise_words(noise))


def noise_words(noise: Noise) -> str:
    """The noise's description in words, e.g. ``gaussian sigma=0.5``, for error messages."""
    description = noise.describe()
    kind = str(description.get("noise", type(noise).__name__))
    return " ".join([kind] + [f"{key}={value}" for key, value in description.items() if key != "noise"])


def _parameter_dtype(model) -> torch.dtype | None:
    """The floating dtype the model computes in, so inputs can be cast to it."""
    if isinstance(model, nn.Module):
        for parameter in model.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return None
