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
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from probust._inputs import call_error, check_labels, check_x, warn_pixels
from probust._user_model import (
    CONTRACT,
    LogitsOf,
    check_logits,
    check_noisy_logits,
    eval_mode,
    is_low_precision,
    logits_model,
    logits_reading,
    model_device,
    parameter_dtype,
    structure_token,
    to_format,
)
from probust.errors import OptionError, in_probust
from probust.estimators.affine import AffineLogits, affine_logits
from probust.estimators.result import Estimate
from probust.execution import EXECUTION_SETTINGS, Execution, ForwardPlan
from probust.noise import Noise, noise_words


class PointwiseMethod:
    """What every method that runs a model over a batch of points shares: the arguments, the
    input checks, eval mode and its :class:`~probust.execution.Execution` (how the work runs:
    rows per pass, memory budget, memory format, declared plans). Each point has its own random
    streams, derived from ``seed`` and its index in the data set. Subclasses: :class:`Estimator`
    (returns an :class:`Estimate`) and the randomized-smoothing procedures of :mod:`probust.smoothing`.

    Args:
        model: an ``nn.Module`` (or callable) mapping float inputs [B, *S] to logits [B, C]
            (C >= 2), to a Hugging Face ``ModelOutput`` (or any Mapping) with ``"logits"``, whose
            ``.logits`` are used, or to a tuple or list whose first item is the logits [B, C]
            (e.g. ``(logits, features)``). Anything else is refused before any work, with one
            :class:`~probust._user_model.ModelOutputError` (a ValueError, ``field="model"``)
            saying what to do: another dict or tuple, a tensor of another shape, a single logit,
            or probabilities (rows of non-negative values summing to 1: remove the final softmax).
            The same contract holds for ``probust estimate`` and ``probust certify``. A model
            whose weights are bfloat16 or float16 runs in its own dtype: inputs and noise are
            added in float32 and cast to the model's dtype at its input, its logits come back as
            float32, and the CDF arithmetic stays in float64. A model that raises on the first
            rows of ``x`` gives a :class:`~probust._user_model.ModelCallError` (``field="x"``)
            naming how x's shape was read and what the model's first layer does not take in it
            (other channels, with both counts and the layer; where x has one dimension fewer than
            that layer takes, the one missing, with the advice ``x.unsqueeze(0)`` for a single
            image without its batch dimension, ``x.unsqueeze(1)`` for single-channel images
            without their channel dimension, and no advice where the shape does not say which).
        seed: seed of every random stream the estimator uses.
        execution: how the work runs, as one :class:`~probust.execution.Execution` (which may be
            shared by several estimators): rows per pass, memory budget, memory format, the
            Jacobian strategy and class chunks of a linearisation, the progress bar. None: the
            defaults (declared plans, half the free memory, no progress bar). The numbers depend
            on what an estimator computes, not on its execution, except for float rounding.

    Attributes:
        execution: the :class:`~probust.execution.Execution` the work runs by. ``batch_size``,
            ``memory_budget``, ``channels_last`` and ``show_progress`` read (and, assigned,
            replace) its fields.
    """

    method: str = ""
    model: nn.Module

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # The settings of how the work runs are one argument: name where a keyword went.
        moved = sorted(set(kwargs) & EXECUTION_SETTINGS)
        if moved:
            settings = ", ".join(f"{name}=..." for name in moved)
            raise TypeError(
                f"{cls.__name__}() takes {', '.join(moved)} through execution=: "
                f"{cls.__name__}(..., execution=probust.Execution({settings}))"
            )
        return super().__new__(cls)

    def __init__(self, model: nn.Module, *, seed: int = 0, execution: Execution | None = None):
        if not callable(model):
            raise TypeError(f"model must be a torch.nn.Module (or callable) returning {CONTRACT}, got {model!r}")
        self.model = model
        if execution is not None and not isinstance(execution, Execution):
            raise OptionError(f"must be a probust.Execution or None, got {execution!r}", field="execution")
        self.execution = Execution() if execution is None else execution
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise OptionError(f"must be an int, got {seed!r}", field="seed")
        self.seed = seed
        # (model, (input shape, dtype, device), what the computation runs): decided by a probe
        # on the first call for each model and input shape (:meth:`_logits_model`).
        self._logits_model_for: tuple[nn.Module, tuple, nn.Module] | None = None
        self._units_seen = False

    @property
    def batch_size(self) -> int | None:
        """Rows per pass (:attr:`Execution.batch_size`); None: declared."""
        return self.execution.batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.execution = self.execution.replace(batch_size=value)

    @property
    def memory_budget(self) -> int | str | None:
        """The memory budget as given (:attr:`Execution.memory_budget`); None: half the free memory."""
        return self.execution.memory_budget

    @memory_budget.setter
    def memory_budget(self, value: int | str | None) -> None:
        self.execution = self.execution.replace(memory_budget=value)

    @property
    def channels_last(self) -> bool | None:
        """The memory format as given (:attr:`Execution.channels_last`); None: declared."""
        return self.execution.channels_last

    @channels_last.setter
    def channels_last(self, value: bool | None) -> None:
        self.execution = self.execution.replace(channels_last=value)

    @property
    def show_progress(self) -> bool:
        """Whether a progress bar is drawn over the work (:attr:`Execution.show_progress`)."""
        return self.execution.show_progress

    @show_progress.setter
    def show_progress(self, value: bool) -> None:
        self.execution = self.execution.replace(show_progress=value)

    def _prepare(self, x: Tensor, index_offset: int) -> tuple[Tensor, Tensor]:
        """Check ``x`` and ``index_offset``; move ``x`` to the model's device and dtype.

        Returns:
            (x, indices): the inputs [B, *S] and each row's index in the data set, int64 [B].
        """
        x = check_x(x, first=index_offset if isinstance(index_offset, int) else 0)
        # Called by the user, the first call warns of images not in [0, 1]; probust's own entry
        # points (score, find_issues, the tracker, certify()) warn once for the whole data set.
        if not self._units_seen and not in_probust(sys._getframe(2).f_globals.get("__name__", "")):
            warn_pixels(x)
        self._units_seen = True
        if isinstance(index_offset, bool) or not isinstance(index_offset, int) or index_offset < 0:
            raise OptionError(f"must be an int >= 0, got {index_offset!r}", field="index_offset")
        device = model_device(self.model) if isinstance(self.model, nn.Module) else None
        if device is not None and x.device != device:
            x = x.to(device)
        dtype = parameter_dtype(self.model)
        # A bfloat16 / float16 model gets float32 inputs (and noise), cast at its input by LogitsOf.
        working = torch.float32 if is_low_precision(dtype) else dtype
        if working is not None and x.dtype != working:
            x = x.to(working)
        self._logits_model(x, dtype)
        return x, torch.arange(index_offset, index_offset + x.shape[0], device=x.device)

    def _logits_model(self, x: Tensor, dtype: torch.dtype | None) -> nn.Module:
        """What the computation runs: :attr:`model` itself when it returns logits [B, C] and
        computes in float32 or float64 (run as it is), else :class:`LogitsOf` it.

        Decided once per model, its structure (:func:`probust._user_model.structure_token`: a new
        head, ``model.half()``) and the input shape by a probe: one forward pass without
        autograd, in eval mode, on the first (at most) 2 rows of ``x``.

        Raises:
            ModelCallError: the model raised on those rows: the message names x's shape, what its
                first layer does not take (the channels, both counts and the layer; a dimension
                missing, with the advice to add it only where x has one dimension fewer than that
                layer takes and its shape says which) and the model's own error on those rows.
            ModelOutputError: its output is not one the contract reads as logits.
        """
        model = self.model
        key = (tuple(x.shape[1:]), x.dtype, x.device, structure_token(model))
        found = self._logits_model_for
        if found is not None and found[0] is model and found[1] == key:
            return found[2]
        runner: nn.Module = model
        if not isinstance(model, LogitsOf):  # already read (the runner's model, an inner estimator's)
            input_dtype = dtype if is_low_precision(dtype) else None
            rows = x[:2] if input_dtype is None else x[:2].to(input_dtype)
            try:
                with self._eval_mode(model), torch.no_grad():
                    out = model(rows)
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:
                raise call_error(model, x, rows.shape[0], exc) from exc
            runner = logits_model(model, logits_reading(out, rows.shape[0]), dtype)
        self._logits_model_for = (model, key, runner)
        return runner

    @staticmethod
    def _eval_mode(model: object) -> contextlib.AbstractContextManager:
        return eval_mode(model) if isinstance(model, nn.Module) else contextlib.nullcontext()

    @contextlib.contextmanager
    def _evaluating(self) -> Iterator[None]:
        """Eval mode for the computation, every submodule's own mode given back afterwards; where
        :meth:`_logits_model` chose a :class:`LogitsOf`, :attr:`model` is that wrapper meanwhile
        (so every method reads logits the same way), and the user's model again afterwards."""
        model = self.model
        found = self._logits_model_for
        runner = found[2] if found is not None and found[0] is model else model
        with self._eval_mode(runner):
            if runner is model:
                yield
                return
            # The methods this one is built on and runs directly (mc_cv's linearisation) too.
            methods = [self, *(v for v in vars(self).values() if isinstance(v, PointwiseMethod) and v.model is model)]
            for method in methods:
                method.model = runner
            try:
                yield
            finally:
                for method in methods:
                    method.model = model

    def _clean_logits(self, x: Tensor, step: int | None = None) -> Tensor:
        """Logits [B, C] of the clean ``x``, ``step`` rows per pass (default: the execution's)."""
        step = step or self.execution.clean_rows
        with torch.no_grad():
            parts = [self.model(x[i : i + step]) for i in range(0, x.shape[0], step)]
        return check_logits(torch.cat(parts), x.shape[0])

    def _forward_plan(self, x: Tensor) -> ForwardPlan:
        """Rows per forward pass without autograd (noisy copies) and the memory format, declared
        (:meth:`probust.execution.Execution.forward_plan`)."""
        return self.execution.forward_plan(self.model, x)

    def _noisy_plan(
        self, x: Tensor, noise: Noise, clean: Tensor | None = None
    ) -> tuple[ForwardPlan, AffineLogits | None]:
        """How the noisy copies of ``x`` run: where the model is affine and the noise Gaussian,
        their logits are drawn in the logits' space (:mod:`probust.estimators.affine`: no forward
        pass, a fixed number of rows per pass); elsewhere through the model by the declared
        forward plan (:meth:`_forward_plan`). ``clean``: the logits at ``x``, where known."""
        affine = affine_logits(self.model, noise, x, lambda: self._clean_logits(x) if clean is None else clean)
        if affine is not None:
            return self.execution.drawn_plan(x, affine.row_bytes, affine.rows), affine
        return self._forward_plan(x), None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.method!r}, seed={self.seed})"


class Estimator(PointwiseMethod, ABC):
    """Common call convention: ``estimator(x, target=None, index_offset=0) -> Estimate``.

    Args:
        model, seed, execution: see
            :class:`PointwiseMethod`.
    """

    def __call__(
        self, x: Tensor, target: Tensor | None = None, *, index_offset: int = 0, indices: Tensor | None = None
    ) -> Estimate:
        """Estimate p_robust for each row of ``x``.

        Args:
            x: float inputs [B, *S] in the units the noise is measured in.
            target: long [B], the class whose survival is measured; default the model's
                prediction on the clean x (a tie there is an error).
            index_offset: the index of row 0 in the whole data set, so that a point's random
                stream is the same however the data set is batched.
            indices: int64 [B], each row's index in the data set, for rows that are not
                consecutive points (a fold, a selection); instead of ``index_offset``.
        """
        x, rows = self._prepare(x, index_offset)
        if target is not None:
            target = check_labels(target, x.shape[0], field="target").to(x.device)
        if indices is not None:
            if index_offset:
                raise OptionError("give index_offset or indices, not both", field="indices")
            rows = _row_indices(indices, x)
        with self._evaluating():
            return self._estimate(x, target, rows)

    @abstractmethod
    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate: ...


def _row_indices(indices: Tensor, x: Tensor) -> Tensor:
    """``indices`` checked: int64 [B] of distinct indices >= 0, on x's device."""
    indices = torch.as_tensor(indices)
    if indices.shape != (x.shape[0],) or indices.is_floating_point() or indices.dtype == torch.bool:
        raise OptionError(
            f"expected integer indices [{x.shape[0]}], one per row of x, got {indices.dtype} {list(indices.shape)}",
            field="indices",
        )
    if len(indices) and (int(indices.min()) < 0 or len(torch.unique(indices)) != len(indices)):
        raise OptionError(
            "must be distinct indices >= 0 (each point's random stream derives from its own)", field="indices"
        )
    return indices.to(device=x.device, dtype=torch.int64)


def noisy_logits(
    model: nn.Module, noise: Noise, x: Tensor, keys: Tensor, start: int, count: int, channels_last: bool
) -> Tensor:
    """Logits [P * count, C] of copies start..start+count-1 of each point x [P, *S] (copy j of
    point p is ``x[p] + noise.sample(keys[p], start + j)``): one forward pass without autograd, the
    rows in the plan's memory format. What every Monte Carlo pass runs, and what a forward plan
    times (:meth:`Estimator._forward_plan`)."""
    shape = x.shape[1:]
    # in x's dtype: a float64 model gets float64 copies (a no-op for float32)
    noisy = noise.sample(keys, start, count, shape).to(x.dtype)
    noisy += x[:, None]
    with torch.inference_mode():
        return model(to_format(noisy.view(-1, *shape), channels_last))


def plan_blocks(points: int, samples: int, rows: int) -> Iterator[tuple[slice, int, int]]:
    """Split (points x samples) noisy copies into forward passes of at most ``rows`` rows.

    Yields (point slice, first sample, number of samples). Points are grouped when a whole
    point's samples fit in one pass; otherwise one point's samples are split into blocks.
    """
    per_point = min(samples, rows)
    group = max(1, rows // per_point)
    for first in range(0, points, group):
        for start in range(0, samples, per_point):
            yield slice(first, min(first + group, points)), start, min(per_point, samples - start)


def check_noisy_copies(noise: Noise, nonfinite: Tensor, copies: int, indices: Tensor) -> None:
    """Refuse NaN or inf logits on noisy copies (:func:`probust._checks.check_noisy_logits`),
    naming the noise in words (:func:`noise_words`)."""
    check_noisy_logits(nonfinite, copies, indices, noise_words(noise))
