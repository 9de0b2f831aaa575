"""The statistics of randomized smoothing: bounds and tests on a binomial proportion.

Algorithms only (no models, no I/O). Every function takes counts as integer tensors (any shapes
that broadcast together), computes in float64 with scipy on the CPU, and returns float64 on the
counts' device. A bad argument raises ValueError naming it.

- :func:`clopper_pearson_lower`: the one-sided exact lower bound that Cohen et al.'s CERTIFY
  uses after a fixed number of draws.
- :func:`binomial_test_half`: the two-sided binomial test of p = 1/2 of their PREDICT.
- :func:`log_evidence_above`, :func:`log_evidence_below`, :func:`cs_lower`, :func:`cs_upper`: a
  confidence sequence for the proportion, valid at every number of draws at once, so that a
  caller may look after every draw and stop whenever it likes (anytime-valid).

The confidence sequence. For a threshold p0 and draws X_1, X_2, ... in {0, 1}, let S_t and
F_t = t - S_t count the ones and zeros among the first t, and

    M_t(p0) = integral over q uniform on [p0, 1] of  prod_s (q / p0)^X_s ((1 - q) / (1 - p0))^(1 - X_s)
            = integral_0^1 (1 + u (1 - p0) / p0)^S_t (1 - u)^F_t du.

Each factor has expectation p q / p0 + (1 - p)(1 - q) / (1 - p0) <= 1 whenever the true
proportion p is at most p0 (and q >= p0), so under "p <= p0" M_t(p0) is a non-negative
supermartingale starting at 1, and by Ville's inequality P(M_t(p0) >= 1 / alpha for some t) <= alpha:
the test "reject p <= p0 once M_t(p0) >= 1 / alpha" has level alpha whatever the stopping time.
The second form shows that M_t(p0) decreases in p0, so the rejected thresholds form an
interval [0, L_t): L_t, the largest p0 with M_t(p0) >= 1 / alpha, is a lower confidence
sequence, P(L_t > p for some t) <= alpha, simultaneously over every threshold. Mixing over
[p0, 1] only (a one-sided mixture) spends no prior mass on proportions below the threshold: for a
point whose draws all succeed, certifying p > Phi(3) at alpha = 0.001 takes about 6,700 draws,
against about 12,000 with a uniform mixture over [0, 1] and 5,100 for a Clopper-Pearson bound
after a fixed number chosen in advance (which is valid only at that number). In closed form,

    M_t(p0) = B(S + 1, F + 1) * P[Beta(S + 1, F + 1) > p0] / ((1 - p0) p0^S (1 - p0)^F),

evaluated in logarithms. The upper sequence mirrors it (ones and zeros swapped, p0 by 1 - p0).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy import signal, special
from scipy import stats as scipy_stats
from torch import Tensor

from probust.errors import OptionError

__all__ = [
    "PRIOR_SCALE",
    "PRIOR_WEIGHT",
    "binomial_test_half",
    "clopper_pearson_lower",
    "cs_lower",
    "cs_upper",
    "log_evidence_above",
    "log_evidence_below",
    "log_evidence_prior",
    "prior_allowances",
    "prior_allowances_table",
]

# The bisection of cs_lower / cs_upper runs on z = Phi^-1(p0) in [-_Z_MAX, _Z_MAX]: Phi(-37) is
# 5.7e-300, the smallest threshold whose logarithm is still a normal float.
_Z_MAX = 37.0
_BISECTIONS = 56  # bracket width 74 * 2**-56 = 1e-15 in z


def check_level(value: float, name: str) -> float:
    """A significance level in (0, 1) (e.g. ``alpha``), as a float; an
    :class:`~probust.errors.OptionError` naming ``name``."""
    if isinstance(value, bool):
        raise OptionError(f"must be a number in (0, 1), got {value!r}", field=name)
    try:
        level = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"must be a number in (0, 1), got {value!r}", field=name) from None
    if not 0.0 < level < 1.0:
        raise OptionError(f"must be in (0, 1), got {value!r}", field=name)
    return level


def _counts(successes: Tensor, trials: Tensor) -> tuple[np.ndarray, np.ndarray, torch.device]:
    """(successes, trials) as float64 arrays broadcast together, checked; and the device."""
    for name, value in (("successes", successes), ("trials", trials)):
        if not isinstance(value, Tensor):
            raise ValueError(f"{name} must be an integer tensor, got {type(value).__name__}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor (counts), got dtype {value.dtype}")
    try:
        k, n = torch.broadcast_tensors(successes.cpu(), trials.cpu())
    except RuntimeError:
        raise ValueError(
            f"successes {tuple(successes.shape)} and trials {tuple(trials.shape)} must have shapes that broadcast"
        ) from None
    if (k < 0).any():
        raise ValueError("successes must be >= 0")
    if (k > n).any():
        raise ValueError("successes must be at most trials")
    return k.numpy().astype(np.float64), n.numpy().astype(np.float64), successes.device


def _threshold(p0: float | Tensor, shape: tuple[int, ...]) -> np.ndarray:
    p = torch.as_tensor(p0, dtype=torch.float64).cpu()
    if not torch.isfinite(p).all() or (p <= 0).any() or (p >= 1).any():
        raise ValueError("p0 must lie strictly between 0 and 1")
    try:
        return np.broadcast_to(p.numpy(), np.broadcast_shapes(p.shape, shape))
    except ValueError:
        raise ValueError(f"p0 of shape {tuple(p.shape)} does not broadcast with the counts {shape}") from None


def clopper_pearson_lower(successes: Tensor, trials: Tensor, alpha: float) -> Tensor:
    """One-sided Clopper-Pearson lower confidence bound of a binomial proportion.

    The alpha quantile of Beta(k, n - k + 1): P(bound > p) <= alpha for the true proportion p,
    after a number of trials fixed in advance. It is what Cohen et al.'s CERTIFY computes
    (``proportion_confint(k, n, alpha=2 * alpha, method="beta")[0]``) and equals
    ``scipy.stats.beta.ppf(alpha, k, n - k + 1)``.

    Args:
        successes: int [...], k, the draws that came out as the class (0 <= k <= n).
        trials: int [...], n (broadcasts with ``successes``; n >= 1).
        alpha: the bound's level, in (0, 1).

    Returns:
        float64 [...] in [0, 1); exactly 0 where k = 0.
    """
    alpha = check_level(alpha, "alpha")
    k, n, device = _counts(successes, trials)
    if (n < 1).any():
        raise ValueError("trials must be >= 1")
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = special.betaincinv(np.maximum(k, 1.0), n - k + 1.0, alpha)
    return torch.from_numpy(np.where(k == 0, 0.0, bound)).to(device)


def binomial_test_half(successes: Tensor, trials: Tensor) -> Tensor:
    """Two-sided p-value of the binomial test of p = 1/2 (Cohen et al.'s PREDICT).

    The probability, under Binomial(n, 1/2), of an outcome at most as likely as k: for this
    symmetric distribution ``min(1, 2 P[X <= min(k, n - k)])``, which is scipy's
    ``binomtest(k, n, 0.5).pvalue`` (and the ``binom_test`` the authors call).

    Args:
        successes: int [...], k (0 <= k <= n).
        trials: int [...], n (>= 1), broadcasting with ``successes``.

    Returns:
        float64 [...] in (0, 1]; exactly 1 where k = n / 2.
    """
    k, n, device = _counts(successes, trials)
    if (n < 1).any():
        raise ValueError("trials must be >= 1")
    tail = special.bdtr(np.minimum(k, n - k).astype(np.int64), n.astype(np.int64), 0.5)
    return torch.from_numpy(np.where(2 * k == n, 1.0, np.minimum(1.0, 2.0 * tail))).to(device)


def _log_evidence(s: np.ndarray, f: np.ndarray, p0: np.ndarray, q0: np.ndarray) -> np.ndarray:
    """log M for s ones, f zeros against "p <= p0"; q0 = 1 - p0 given separately (accurate near 1).

    P[Beta(s + 1, f + 1) > p0] = I_{q0}(f + 1, s + 1). Above the observed proportion (p0 >= s / t)
    M <= 1, since the likelihood ratio of every q >= p0 >= s / t to p0 is at most 1: no test at
    any level rejects there, and there the far tail of I is only accurate to about 1e-4 relative,
    or underflows to 0 (log M = -inf). Below it, where decisions are made, I >= about 1/2."""
    with np.errstate(divide="ignore"):
        tail = np.log(special.betainc(f + 1.0, s + 1.0, q0))
        return special.betaln(s + 1.0, f + 1.0) + tail - np.log(q0) - s * np.log(p0) - f * np.log(q0)


def log_evidence_above(successes: Tensor, trials: Tensor, p0: float | Tensor) -> Tensor:
    """log M_t(p0): the evidence, against "p <= p0", of ``successes`` out of ``trials`` draws.

    The logarithm of the one-sided uniform-mixture likelihood ratio of the module docstring, a
    test supermartingale under every p <= p0: rejecting "p <= p0" (concluding p > p0) once it
    reaches log(1 / alpha) has level alpha however the number of draws was chosen, including
    by looking at this value after every draw. It decreases in p0.

    Args:
        successes: int [...], the ones among the draws so far.
        trials: int [...], the draws so far (>= 0; 0 gives log M = 0).
        p0: the threshold, in (0, 1): a float or a float tensor broadcasting with the counts.

    Returns:
        float64 [...]. Where p0 is above the observed proportion the value is below 0 (no level
        rejects there), only accurate to about 1e-4 relative, or -inf where it underflows.
    """
    k, n, device = _counts(successes, trials)
    p = _threshold(p0, k.shape)
    return torch.from_numpy(np.broadcast_to(_log_evidence(k, n - k, p, 1.0 - p), p.shape).copy()).to(device)


def log_evidence_below(successes: Tensor, trials: Tensor, p0: float | Tensor) -> Tensor:
    """log of the mirror test martingale, against "p >= p0" (evidence that p < p0).

    :func:`log_evidence_above` with ones and zeros swapped and p0 replaced by 1 - p0: rejecting
    "p >= p0" once it reaches log(1 / alpha) has level alpha at any stopping time.

    Args:
        successes, trials: as :func:`log_evidence_above`.
        p0: the threshold, in (0, 1).

    Returns:
        float64 [...]; it increases in p0.
    """
    k, n, device = _counts(successes, trials)
    p = _threshold(p0, k.shape)
    return torch.from_numpy(np.broadcast_to(_log_evidence(n - k, k, 1.0 - p, p), p.shape).copy()).to(device)


def _bisect_z(s: np.ndarray, f: np.ndarray, level: float) -> np.ndarray:
    """The largest z with log M(Phi(z)) >= log(1 / level) for s ones and f zeros, where M is the
    evidence against "p <= Phi(z)"; -inf where no z >= -_Z_MAX qualifies. Bisection on z, all
    points at once (M decreases in z); the returned z always satisfies the inequality."""
    target = math.log(1.0 / level)

    def passes(z: np.ndarray) -> np.ndarray:
        return _log_evidence(s, f, special.ndtr(z), special.ndtr(-z)) >= target

    lo = np.full(s.shape, -_Z_MAX)
    hi = np.full(s.shape, _Z_MAX)
    ok_lo = passes(lo)
    ok_hi = passes(hi)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        ok = passes(mid)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(ok_hi, _Z_MAX, np.where(ok_lo, lo, -np.inf))


def cs_lower(successes: Tensor, trials: Tensor, alpha: float) -> Tensor:
    """The lower confidence sequence: the largest p0 that :func:`log_evidence_above` rejects.

    P(cs_lower(S_t, t) > p for some t) <= alpha, for the true proportion p, at every number of
    draws simultaneously: a bound read at a data-dependent stopping time is still valid, and so
    is the largest of the bounds read at several times.

    Args:
        successes: int [...], the ones among the draws so far.
        trials: int [...], the draws so far (>= 0).
        alpha: the level, in (0, 1).

    Returns:
        float64 [...] in [0, 1): 0 where nothing is rejected (e.g. no draws, or no ones). It is
        never above the exact bound (bisection keeps the side that rejects).
    """
    alpha = check_level(alpha, "alpha")
    k, n, device = _counts(successes, trials)
    z = _bisect_z(k, n - k, alpha)
    return torch.from_numpy(np.where(np.isneginf(z), 0.0, special.ndtr(z))).to(device)


def cs_upper(successes: Tensor, trials: Tensor, alpha: float) -> Tensor:
    """The upper confidence sequence, mirror of :func:`cs_lower`: P(cs_upper(S_t, t) < p for some t) <= alpha.

    Args:
        successes, trials, alpha: as :func:`cs_lower`.

    Returns:
        float64 [...] in (0, 1]: 1 where nothing is rejected.
    """
    alpha = check_level(alpha, "alpha")
    k, n, device = _counts(successes, trials)
    z = _bisect_z(n - k, k, alpha)  # the lower bound of 1 - p, read on the zeros
    return torch.from_numpy(np.where(np.isneginf(z), 1.0, special.ndtr(-z))).to(device)


# ------------------------------------------------------------------ the analytic-prior test

#: The grid of the point alternatives of :func:`log_evidence_prior`: z0 + PRIOR_STEP * k, k = 1..PRIOR_POINTS.
PRIOR_STEP = 0.1
PRIOR_POINTS = 100
#: Its defaults: the normal weights' standard deviation on z, and the share of the centred part.
PRIOR_SCALE = 1.0
PRIOR_WEIGHT = 0.5


def _log_evidence_prior(
    s: np.ndarray, f: np.ndarray, z0: np.ndarray | float, center: np.ndarray | float, scale: float, weight: float
) -> np.ndarray:
    """log(weight * sum_k pi_k LR(q_k) + (1 - weight) * M_uniform), broadcasting s, f, z0, center."""
    s, f, z0, center = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (s, f, z0, center)))
    grid = z0[..., None] + PRIOR_STEP * np.arange(1, PRIOR_POINTS + 1)
    log_pi = -0.5 * ((grid - center[..., None]) / scale) ** 2
    log_pi -= special.logsumexp(log_pi, axis=-1, keepdims=True)
    up = special.log_ndtr(grid) - special.log_ndtr(z0)[..., None]  # log(q / p0) >= 0
    down = special.log_ndtr(-grid) - special.log_ndtr(-z0)[..., None]  # log((1 - q) / (1 - p0)) <= 0
    centred = special.logsumexp(log_pi + s[..., None] * up + f[..., None] * down, axis=-1)
    if weight >= 1.0:
        return centred
    uniform = _log_evidence(s, f, special.ndtr(z0), special.ndtr(-z0))
    return np.logaddexp(math.log(weight) + centred, math.log1p(-weight) + uniform)


def log_evidence_prior(
    successes: Tensor,
    trials: Tensor,
    p0: float | Tensor,
    center: float | Tensor,
    scale: float = PRIOR_SCALE,
    weight: float = PRIOR_WEIGHT,
) -> Tensor:
    """log M of the analytic-prior mixture against "p <= p0": a test supermartingale like
    :func:`log_evidence_above`, with a mixing distribution centred on an estimate of p.

    With z0 = Phi^-1(p0), the mixing distribution over the alternatives q >= p0 is

        weight * sum_k pi_k delta(q_k) + (1 - weight) * uniform on [p0, 1],
        q_k = Phi(z0 + 0.1 k), k = 1..100,  pi_k proportional to exp(-(z0 + 0.1 k - center)^2 / (2 scale^2)),

    so M = weight * sum_k pi_k (q_k / p0)^S ((1 - q_k) / (1 - p0))^F + (1 - weight) * M_uniform.
    Every q_k is >= p0, so each likelihood ratio, and any fixed mixture of them, is a
    non-negative supermartingale under "p <= p0" (the argument of :func:`log_evidence_above`):
    Ville's inequality holds whatever ``center`` is, provided it is fixed before the draws it
    is applied to. A center near the true Phi^-1(p) puts weight on the alternative that grows
    fastest (the likelihood ratio's growth rate is largest at q = p); the uniform part keeps
    the test within log(1 / (1 - weight)) of :func:`log_evidence_above` where the center is wrong.
    M increases with S at fixed trials.

    Args:
        successes, trials: as :func:`log_evidence_above`.
        p0: the threshold, in (0, 1).
        center: float or tensor broadcasting with the counts: the estimate of Phi^-1(p) (z units).
        scale: the standard deviation of the normal weights, in z units (> 0).
        weight: the share of the centred part, in (0, 1].

    Returns:
        float64 [...], on the counts' device.
    """
    k, n, device = _counts(successes, trials)
    p = _threshold(p0, k.shape)
    c = torch.as_tensor(center, dtype=torch.float64).cpu().numpy()
    if not np.isfinite(c).all():
        raise ValueError("center must be finite")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"weight must be in (0, 1], got {weight!r}")
    return torch.from_numpy(np.array(_log_evidence_prior(k, n - k, special.ndtri(p), c, scale, weight))).to(device)


def prior_allowances(
    looks: Sequence[int],
    p0: float,
    alpha: float,
    center: float,
    scale: float = PRIOR_SCALE,
    weight: float = PRIOR_WEIGHT,
) -> tuple[np.ndarray, float]:
    """The failures each look of the analytic-prior test allows, and its exact level.

    At every look but the last, the test certifies "p > p0" where :func:`log_evidence_prior`
    reaches log(1 / alpha) (Ville: level alpha at any stopping time); since M increases with the
    successes, that is "failures <= c_l". The last look (the most draws, n) allows the largest
    c such that the exact probability, under p = p0, of certifying at any look,

        P_{p0}(F_{t_l} <= c_l for some interim look l, or F_n <= c),

    is at most alpha. It is computed by carrying the distribution of the failures of the paths
    not yet certified from look to look (binomial increments of failure probability 1 - p0,
    convolved), so it spends what Ville's inequality leaves unspent. The rule is monotone (more
    successes never stop a certificate), so the probability is largest at p = p0 among all
    p <= p0: the test has level alpha, whatever the stopping of the draws by other rules (a
    point that stops early is certified on a subset of these events). c <= the fixed-n
    Clopper-Pearson allowance at n.

    Args:
        looks: increasing draw counts at which the test looks, the last being n (fixed before the draws).
        p0: the threshold in (0, 1).
        alpha: the level.
        center, scale, weight: the prior (:func:`log_evidence_prior`).

    Returns:
        (allowed int64 [L]: the most failures certified at each look, -1 where none;
        level: the exact probability of certifying under p = p0, <= alpha).
    """
    alpha = check_level(alpha, "alpha")
    t = _looks_array(looks)
    allowed = _interim(t, np.asarray(special.ndtri(p0)), np.asarray(center, dtype=np.float64), alpha, scale, weight)
    last, level = _last_allowance(tuple(t.tolist()), float(p0), alpha, tuple(allowed[:-1].tolist()))
    allowed[-1] = last
    return allowed, level


def prior_allowances_table(
    looks: Sequence[int],
    p0: Sequence[float] | np.ndarray,
    alpha: float,
    center: Sequence[float] | np.ndarray,
    scale: float = PRIOR_SCALE,
    weight: float = PRIOR_WEIGHT,
) -> np.ndarray:
    """:func:`prior_allowances` for every (center, threshold) pair at once: int64 [B, R, L] for
    B centers and R thresholds (the interim allowances computed together; the last look's
    computed once per distinct interim allowances and threshold)."""
    alpha = check_level(alpha, "alpha")
    t = _looks_array(looks)
    z0 = special.ndtri(np.asarray(p0, dtype=np.float64))[None, :]
    c = np.asarray(center, dtype=np.float64)[:, None]
    allowed = _interim(t, z0, c, alpha, scale, weight)
    steps = tuple(t.tolist())
    for b in range(allowed.shape[0]):
        for r in range(allowed.shape[1]):
            p = float(special.ndtr(z0[0, r]))
            allowed[b, r, -1] = _last_allowance(steps, p, alpha, tuple(allowed[b, r, :-1].tolist()))[0]
    return allowed


def _looks_array(looks: Sequence[int]) -> np.ndarray:
    t = np.asarray(looks, dtype=np.int64)
    if t.ndim != 1 or len(t) == 0 or (np.diff(t) <= 0).any() or t[0] < 1:
        raise ValueError("looks must be increasing positive draw counts")
    return t


def _interim(
    t: np.ndarray, z0: np.ndarray, center: np.ndarray, alpha: float, scale: float, weight: float
) -> np.ndarray:
    """The largest f in [-1, t] with log M(t - f, f) >= log(1 / alpha), per look (last axis) and
    per broadcast (z0, center), by bisection (M decreases in f): int64 [*shape, L]."""
    target = math.log(1.0 / alpha)
    shape = (*np.broadcast_shapes(np.shape(z0), np.shape(center)), len(t))
    z = np.broadcast_to(np.asarray(z0)[..., None], shape)
    c = np.broadcast_to(np.asarray(center)[..., None], shape)
    below = np.full(shape, -1, dtype=np.int64)  # always "passes" (no certificate)
    above = np.broadcast_to(t + 1, shape).copy()  # never passes
    while (above - below > 1).any():
        mid = (below + above) // 2
        f = np.maximum(mid, 0)
        ok = (_log_evidence_prior(t - f, f, z, c, scale, weight) >= target) & (mid >= 0)
        open_ = above - below > 1
        below = np.where(open_ & ok, mid, below)
        above = np.where(open_ & ~ok, mid, above)
    return below


@functools.lru_cache(maxsize=4096)
def _last_allowance(t: tuple[int, ...], p0: float, alpha: float, interim: tuple[int, ...]) -> tuple[int, float]:
    """(the last look's allowance, the exact level): the computation of :func:`prior_allowances`."""
    q0 = float(special.ndtr(-special.ndtri(p0)))
    n = t[-1]
    # The fixed-n Clopper-Pearson allowance at n bounds the last one (P(F_n <= c) <= alpha).
    cap = int(scipy_stats.binom.ppf(alpha, n, q0))
    while cap >= 0 and scipy_stats.binom.cdf(cap, n, q0) > alpha:
        cap -= 1
    top = max(cap, max(interim, default=-1))
    if top < 0:
        return -1, 0.0
    cap = min(cap, top)
    # mass[i]: P(F = base + i, not yet certified); states above top can no longer certify (dropped),
    # and leading states whose mass is below alpha * 1e-16 in all are trimmed (windows of the
    # binomial increments likewise, 14 standard deviations wide), so each look costs the width of
    # the distribution, not n.
    mass, base = np.ones(1), 0
    spent, before = 0.0, 0
    negligible = alpha * 1e-16
    for look, stop in enumerate(t):
        draws = stop - before
        mean, sd = draws * q0, math.sqrt(draws * q0 * (1 - q0))
        least, most = max(0, int(mean - 14 * sd) - 20), min(draws, int(mean + 14 * sd) + 20)
        step = scipy_stats.binom.pmf(np.arange(least, most + 1), draws, q0)
        mass = np.clip(signal.fftconvolve(mass, step), 0.0, None)
        base += least
        mass = mass[: max(0, top - base + 1)]
        before = stop
        if look < len(t) - 1:
            c = interim[look]
            if c >= base:
                spent += mass[: c - base + 1].sum()
                mass[: c - base + 1] = 0.0
        cut = int(np.searchsorted(np.cumsum(mass), negligible, side="right"))
        if 0 < cut < len(mass):
            mass, base = mass[cut:], base + cut
        if len(mass) == 0:
            break
    # total[c]: the exact level with the last allowance c, for c = 0..cap.
    below = np.zeros(cap + 1)
    if cap >= base and len(mass):
        part = np.cumsum(mass[: cap - base + 1])
        below[base : base + len(part)] = part
        below[base + len(part) :] = part[-1] if len(part) else 0.0
    total = spent + below
    # 1e-9 relative: room for the convolutions' rounding.
    fits = np.nonzero(total <= alpha * (1 - 1e-9))[0]
    last = int(fits[-1]) if len(fits) else -1
    return last, float(total[last]) if last >= 0 else float(spent)
