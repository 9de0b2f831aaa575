"""``probust.estimate``: the functional form of every estimator, built from the method registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from torch import Tensor, nn

from probust._inputs import warn_pixels
from probust.errors import OptionError
from probust.estimators.base import Estimator
from probust.estimators.registry import method_spec
from probust.noise import Noise


def make_estimator(
    method: str,
    model: nn.Module,
    sigma: float | Tensor | Noise | None,
    *,
    n_samples: int | None = None,
    **kwargs: Any,
) -> Estimator:
    """Build the estimator that ``method`` names, with the same arguments as :func:`estimate`.

    ``sigma`` is required; it may be None only for methods that use no noise ("softmax").
    """
    spec = method_spec(method)
    if n_samples is not None and spec.samples is None:
        raise OptionError(f"does not apply to method {method!r} (it uses no noise samples)", field="n_samples")
    samples = {} if n_samples is None else {"n_samples": n_samples}
    build = cast(Callable[..., Estimator], spec.estimator)  # each class has its own signature
    noise = () if not spec.uses_noise else (sigma,)
    return build(model, *noise, **spec.options, **samples, **kwargs)


def estimate(
    model: nn.Module,
    x: Tensor,
    sigma: float | Tensor | Noise | None,
    method: str = "mmse",
    *,
    n_samples: int | None = None,
    target: Tensor | None = None,
    index_offset: int = 0,
    **kwargs: Any,
) -> Tensor:
    """p_robust for each row of x: the probability that the prediction survives the noise.

    Args:
        model: maps [B, *S] to logits [B, C].
        x: float inputs [B, *S].
        sigma: noise standard deviation per input coordinate (units of x), or a Noise.
            Required; it may be None only for "softmax", which ignores it (pass
            temperature= instead): ``estimate(model, x, None, "softmax")``.
        method: one of :data:`probust.METHODS` (see :data:`probust.estimators.REGISTRY`): "mc",
            "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is".
        n_samples: Monte Carlo draws (mc, mc_cv, mc_is: default 10,000) or MMSE copies (mmse,
            default 5).
        target: long [B] classes to measure; default the clean prediction.
        index_offset: index of row 0 in the data set (per-point random streams).
        **kwargs: passed to the estimator (seed, execution, tol, temperature, ...).

    Returns:
        float64 [B], the probability of keeping the prediction.
    """
    warn_pixels(x)  # the estimator, called from here, leaves it to its caller
    return make_estimator(method, model, sigma, n_samples=n_samples, **kwargs)(x, target, index_offset=index_offset).p
