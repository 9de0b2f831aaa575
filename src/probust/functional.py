"""``probust.estimate``: the functional form of every estimator."""

from __future__ import annotations

from torch import Tensor, nn

from probust.control_variate import MonteCarloCV
from probust.estimators import MMSE, Estimator, MonteCarlo, Softmax, Taylor
from probust.importance import MonteCarloIS
from probust.noise import Noise

#: The paper's six methods, then those beyond it: Monte Carlo with the linearised model as a
#: control variate ("mc_cv") and importance-sampled Monte Carlo for small p_fail ("mc_is").
METHODS = ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is")


def make_estimator(
    method: str,
    model: nn.Module,
    sigma: float | Tensor | Noise | None,
    *,
    n_samples: int | None = None,
    **kwargs,
) -> Estimator:
    """Build the estimator that ``method`` names, with the same arguments as :func:`estimate`.

    ``sigma`` is required; it may be None only for "softmax", which uses no noise.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if method == "softmax":
        return Softmax(model, **kwargs)
    samples = {} if n_samples is None else {"n_samples": n_samples}
    if method == "mc":
        return MonteCarlo(model, sigma, **samples, **kwargs)
    if method == "mc_cv":
        return MonteCarloCV(model, sigma, **samples, **kwargs)
    if method == "mc_is":
        return MonteCarloIS(model, sigma, **samples, **kwargs)
    cdf = "mv-sigmoid" if method.endswith("_mvs") else "mvn"
    if method.startswith("taylor"):
        if n_samples is not None:
            raise ValueError(f"n_samples does not apply to method {method!r} (it uses no noise samples)")
        return Taylor(model, sigma, cdf=cdf, **kwargs)
    return MMSE(model, sigma, **({} if n_samples is None else {"n_samples": n_samples}), cdf=cdf, **kwargs)


def estimate(
    model: nn.Module,
    x: Tensor,
    sigma: float | Tensor | Noise | None,
    method: str = "mmse",
    *,
    n_samples: int | None = None,
    target: Tensor | None = None,
    index_offset: int = 0,
    **kwargs,
) -> Tensor:
    """p_robust for each row of x: the probability that the prediction survives the noise.

    Args:
        model: maps [B, *S] to logits [B, C].
        x: float inputs [B, *S].
        sigma: noise standard deviation per input coordinate (units of x), or a Noise.
            Required; it may be None only for "softmax", which ignores it (pass
            temperature= instead): ``estimate(model, x, None, "softmax")``.
        method: one of :data:`METHODS`: "mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs",
            "softmax", "mc_cv", "mc_is".
        n_samples: Monte Carlo draws (mc, mc_cv, mc_is: default 10,000) or MMSE copies (mmse,
            default 5).
        target: long [B] classes to measure; default the clean prediction.
        index_offset: index of row 0 in the data set (per-point random streams).
        **kwargs: passed to the estimator (seed, batch_size, tol, temperature, ...).

    Returns:
        float64 [B], the probability of keeping the prediction.
    """
    return make_estimator(method, model, sigma, n_samples=n_samples, **kwargs)(x, target, index_offset=index_offset).p
