"""Can a Taylor or MMSE estimate be trusted? The model's verdict against the linearisation's.

Taylor and MMSE replace the margins g_i(x + eps) by a linearisation c_i + u_i . eps and report
p_lin = P[all_i c_i + u_i . eps > 0] (the mvn-cdf, up to ``cdf_error``). On a noise draw eps the
*model* survives when argmax f(x + eps) = t and the *linearisation* survives when every kept
boundary has c_i + u_i . eps > 0. Whatever the model,

    |p_true - p_lin| = |P(model survives) - P(linearisation survives)| <= P(verdicts differ),

so the fraction of draws on which the two verdicts differ, ``1 - agreement``, estimates a bound
on the linearisation's error at that point: near 0, p is what the model does; large, the
linearisation does not describe the model at this noise level (the mvn-cdf's value may still be
right by luck, when the disagreements cancel).

The draws: MMSE checks its own N noisy copies, which cost nothing more: their linearised margins
are known, and the model's verdict is read off the logits of the linearisation's own pass on them
(:func:`verdicts`). Taylor checks fresh draws of its own stream
(:data:`probust.noise.STREAM_TRUST`), so no other number changes, in stages (:func:`check_stages`):
draws 0-1 on every point, then draws 2-7, then the rest of its ``check_draws``
(:data:`TAYLOR_CHECK_DRAWS` by default), each stage only on the points the draws so far leave
open (:func:`undecided`). A point stops when its verdicts so far flag it (:func:`untrusted`'s
test on them), or when they all agree and the residuals of the model's margins against the
linearisation's on those draws are too small to make the verdicts differ on more than
:data:`CLEAR_RATE` of the noise (:func:`flip_rate`). Each forward pass gives every margin of the
model, not one bit: that is what lets most points stop after two draws. Pruned boundaries
(``prune``) are not checked: the probability that any of them is crossed is bounded by their part
of ``cdf_error``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from scipy import stats
from torch import Tensor, nn

from probust._user_model import finite_rows
from probust.errors import user_stacklevel
from probust.estimators.base import plan_blocks
from probust.estimators.result import Estimate


class Checked(NamedTuple):
    """What the trust check reads of a group of points' linearisation.

    Attributes:
        points: int64 [n], the group's positions in the chunk.
        classes: int64 [n, K], each kept boundary's class (the target's column, and padding, hold the target).
        margin: [n, C], the margins of every class.
        normal: [n, K, *S], the kept boundaries' u_i.
        z: float64 [n, K], their z-scores.
        scale: float64 [n, K], the standard deviation of u_i . eps.
    """

    points: Tensor
    classes: Tensor
    margin: Tensor
    normal: Tensor
    z: Tensor
    scale: Tensor


__all__ = [
    "Checked",
    "upper_rate",
    "CLEAR_RATE",
    "FIRST_CHECK_DRAWS",
    "RESIDUAL_SLACK",
    "RESIDUAL_SPREAD",
    "STAGE_DRAWS",
    "TAYLOR_CHECK_DRAWS",
    "TRUST_CONFIDENCE",
    "TRUST_LEVEL",
    "LinearisationWarning",
    "check_stages",
    "disagreement_lower",
    "flip_rate",
    "linear_margins",
    "linear_survives",
    "model_logits",
    "model_survives",
    "undecided",
    "untrusted",
    "warn_untrusted",
]

#: The cumulative draw counts at which a point's check may stop before ``check_draws``: draws
#: 0-1 on every point, 2-7 on the points those leave open, the rest up to ``check_draws`` on
#: the points still open (:func:`check_stages`).
STAGE_DRAWS = (2, 8)
#: Fresh noise draws every checked point gets (fewer where ``check_draws`` is smaller).
FIRST_CHECK_DRAWS = STAGE_DRAWS[0]
#: The most fresh noise draws Taylor checks per point by default (``check_draws``); one forward
#: pass without autograd per draw against Taylor's one forward and up to C - 1 backward passes
#: per point, so most points stop after :data:`FIRST_CHECK_DRAWS` (:func:`undecided`).
TAYLOR_CHECK_DRAWS = 32
#: A point whose first draws all agree stops there where :func:`flip_rate` predicts that the
#: verdicts differ on at most this fraction of the noise: a fifth of :data:`TRUST_LEVEL`.
CLEAR_RATE = 0.01
#: :func:`flip_rate` widens the residuals seen by this many times their range ...
RESIDUAL_SPREAD = 2.0
#: ... and by this fraction of their size (two draws may agree by chance).
RESIDUAL_SLACK = 0.5
#: A point is flagged when its verdicts differ on more than this fraction of draws: the bound
#: |p_true - p| <= P(verdicts differ) then no longer vouches for an error below 0.05, half of
#: 0.1, the error docs/estimators.md counts as large. (A test against 0.1 itself cannot tell, from
#: 16 draws, a rate of 0.1 from one of 0.25, so it would miss more of the large errors.)
TRUST_LEVEL = 0.05
#: ... at this confidence (a one-sided Clopper-Pearson bound): a point whose verdicts differ on
#: at most ``TRUST_LEVEL`` of draws is flagged with probability <= 5%, one at 1% (8 draws: 3 or
#: more disagreements flag; 32 draws: 5 or more) with probability below 1e-3.
TRUST_CONFIDENCE = 0.95


class LinearisationWarning(UserWarning):
    """A Taylor or MMSE linearisation disagrees with the model on many noise draws at some points
    (:func:`untrusted`): their p may be far from the model's p_robust."""


def linear_margins(margin: Tensor, normal: Tensor, eps: Tensor) -> Tensor:
    """The linearised margins c_i + u_i . eps on each draw.

    Args:
        margin: [B, K], the boundaries' c_i.
        normal: [B, K, *S], their u_i.
        eps: [B, m, *S], the draws (units of x).

    Returns:
        [B, K, m], at least float32 (a bf16 dot product would round verdicts).
    """
    dtype = torch.promote_types(normal.dtype, torch.float32)
    out = torch.empty(*margin.shape, eps.shape[1], dtype=dtype, device=eps.device)
    # One product per point: its shape, and so its rounding, depends on the point alone.
    for b in range(eps.shape[0]):
        u = normal[b].detach().flatten(1).to(dtype)  # [K, D]
        out[b] = margin[b].detach().to(dtype)[:, None] + u @ eps[b].flatten(1).to(dtype).T
    return out


def linear_survives(margin: Tensor, normal: Tensor, eps: Tensor, active: Tensor) -> Tensor:
    """The linearisation's verdict on each draw: every active boundary has c_i + u_i . eps > 0.

    Args:
        margin, normal, eps: as :func:`linear_margins`'s.
        active: bool [B, K], the boundaries that count (False at the target and on padding).

    Returns:
        bool [B, m].
    """
    return ((linear_margins(margin, normal, eps) > 0) | ~active[:, :, None]).all(dim=1)


def flip_rate(z: Tensor, scale: Tensor, margin: Tensor, low: Tensor, high: Tensor, active: Tensor) -> Tensor:
    """How often residuals like those seen could make the verdicts differ: float64 [B] in [0, 1].

    On a draw eps the model's margin is g_i(x + eps) = L_i + r_i, with L_i = c_i + u_i . eps the
    linearisation's (L_i ~ N(c_i, scale_i^2), z_i = c_i / scale_i) and r_i its residual. Where
    the residual lies in [lo_i, hi_i], the model survives a boundary the linearisation fails
    only for L_i in (-max(hi_i, 0), 0], and fails one it survives only for L_i in
    (0, max(-lo_i, 0)]. The residuals seen on a few draws, ``low`` to ``high``, are widened by
    :data:`RESIDUAL_SPREAD` times their range plus :data:`RESIDUAL_SLACK` times their size (a
    few draws may miss the residual's spread); the rate is the union bound
    sum_i P(L_i in those intervals). A screening statistic, not a bound: it decides where the
    check's next draws go (:func:`undecided`), never what is flagged.

    Args:
        z: float64 [B, K], the boundaries' z-scores (+inf where never crossed).
        scale: float64 [B, K], the standard deviation of L_i (0 where the noise cannot move it).
        margin: [B, K], c_i.
        low, high: [B, K], the least and the largest residual r_i on the checked draws (NaN where
            the model's logits were not finite: the rate is then 1).
        active: bool [B, K], the boundaries that count.
    """
    low, high = low.to(torch.float64), high.to(torch.float64)
    c = margin.to(torch.float64)
    widen = RESIDUAL_SPREAD * (high - low) + RESIDUAL_SLACK * torch.maximum(low.abs(), high.abs())
    rises = (high + widen).clamp(min=0)  # the model survives where L_i in (-rises, 0]
    falls = (widen - low).clamp(min=0)  # the model fails where L_i in (0, falls]
    moving = scale > 0
    unit = torch.where(moving, scale, 1.0)
    band = torch.special.ndtr((falls - c) / unit) - torch.special.ndtr((-rises - c) / unit)
    frozen = ((c <= 0) & (-rises < c)) | ((c > 0) & (c <= falls))
    each = torch.where(moving, band, frozen.double())
    each = torch.where(torch.isnan(low) | torch.isnan(high), 1.0, each)
    return (each * active).sum(dim=1).clamp(max=1.0)


def check_stages(check_draws: int | None) -> tuple[int, ...]:
    """The cumulative draw counts after each stage of the check for Taylor's (or MMSE's)
    ``check_draws`` (None: :data:`TAYLOR_CHECK_DRAWS`): :data:`STAGE_DRAWS` below it, then
    ``check_draws`` itself; () for 0 (no check). E.g. 32: (2, 8, 32); 8: (2, 8); 5: (2, 5); 1: (1,)."""
    most = TAYLOR_CHECK_DRAWS if check_draws is None else check_draws
    return tuple(s for s in STAGE_DRAWS if s < most) + ((most,) if most else ())


def undecided(agreeing: Tensor, draws: Tensor, rate: Tensor | None = None) -> Tensor:
    """bool [B]: the points that get the next stage's draws.

    A point stops where its verdicts so far flag it (:func:`untrusted`'s test on its ``draws``
    checked draws, int64 [B], ``agreeing`` of which agree), or where they all agree and, after
    the first stage, :func:`flip_rate` (``rate``, float64 [B]) is at most :data:`CLEAR_RATE`;
    after a later stage (``rate`` None) all agreeing is enough, since no number of further draws
    would flag the point."""
    cleared = agreeing == draws
    if rate is not None:
        cleared &= rate <= CLEAR_RATE
    return ~cleared & ~_flags(agreeing.double() / draws, draws)


def _flags(
    agreement: Tensor, draws: Tensor, level: float = TRUST_LEVEL, confidence: float = TRUST_CONFIDENCE
) -> Tensor:
    """bool [B]: the disagreement rate is above ``level`` at ``confidence`` (draws >= 1)."""
    return disagreement_lower(agreement, draws, confidence) > level


def model_logits(
    model: nn.Module,
    x: Tensor,
    eps: Tensor,
    rows: int,
    to_rows: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The model's logits on each draw, f(x + eps), without autograd.

    Args:
        model: in eval mode.
        x: [B, *S].
        eps: [B, m, *S].
        rows: rows per forward pass.
        to_rows: puts a pass's rows in the model's memory format (None: as they are).

    Returns:
        [B, m, C].
    """
    points, draws = eps.shape[:2]
    shape = x.shape[1:]
    out: Tensor | None = None
    for block, first, count in plan_blocks(points, draws, rows):
        noisy = (x[block, None] + eps[block, first : first + count].to(x.dtype)).reshape(-1, *shape)
        if to_rows is not None:
            noisy = to_rows(noisy)
        with torch.no_grad():
            logits = model(noisy)
        if out is None:
            out = logits.new_empty(points, draws, logits.shape[1])
        out[block, first : first + count] = logits.view(-1, count, logits.shape[1])
    assert out is not None, "no draw to check"
    return out


def model_survives(
    model: nn.Module,
    x: Tensor,
    eps: Tensor,
    target: Tensor,
    rows: int,
    to_rows: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The model's verdict on each draw: argmax f(x + eps) = t with finite logits (as Monte
    Carlo), bool [B, m]; ``target`` int64 [B], the rest as :func:`model_logits`'s."""
    return verdicts(model_logits(model, x, eps, rows, to_rows), target)


def verdicts(logits: Tensor, target: Tensor) -> Tensor:
    """The model's verdict on draws whose logits [B, m, C] are known: bool [B, m], argmax = t
    (int64 [B]) with finite logits, as :func:`model_survives` (and Monte Carlo) decide it."""
    points, draws, classes = logits.shape
    flat = logits.reshape(points * draws, classes)
    return (flat.argmax(dim=1).view(points, draws) == target[:, None]) & finite_rows(flat, draws)


def disagreement_lower(agreement: Tensor, draws: Tensor, confidence: float = TRUST_CONFIDENCE) -> Tensor:
    """A one-sided lower confidence bound on each point's disagreement rate P(verdicts differ).

    Args:
        agreement: float64 [B], the fraction of agreeing draws.
        draws: int64 [B], the draws checked (>= 1).
        confidence: e.g. 0.95: the rate is at least the bound with this probability.

    Returns:
        float64 [B] in [0, 1].
    """
    agreeing = torch.round(agreement * draws)
    return 1.0 - upper_rate(agreeing, draws, confidence)


def untrusted(estimate: Estimate, level: float = TRUST_LEVEL, confidence: float = TRUST_CONFIDENCE) -> Tensor:
    """The points whose linearisation disagrees with the model on more than ``level`` of the
    noise draws, at ``confidence`` (their p may be off by up to that rate): bool [B]; all False
    where the estimate was not checked (``check_draws=0``, or a method without a linearisation)."""
    if estimate.agreement is None or estimate.agreement_draws is None:
        return torch.zeros(len(estimate), dtype=torch.bool, device=estimate.p.device)
    checked = estimate.agreement_draws > 0
    return checked & _flags(estimate.agreement, estimate.agreement_draws.clamp(min=1), level, confidence)


def warn_untrusted(estimate: Estimate, noise: str, suggestion: str) -> None:
    """One :class:`LinearisationWarning` for the whole estimate, naming how many of its points
    :func:`untrusted` flags; nothing where it flags none.

    Args:
        estimate: the call's estimate.
        noise: the noise in words (e.g. ``gaussian sigma=2.0``).
        suggestion: what to do instead, in words.

    The warning points at the user's line: the first frame outside probust
    (:func:`probust.errors.user_stacklevel`), whether the estimator was called directly or by
    ``probust.score``, the runner or a metric.
    """
    flagged = untrusted(estimate)
    count = int(flagged.sum())
    if count == 0:
        return
    lowest = float(estimate.agreement[flagged].min()) if estimate.agreement is not None else float("nan")
    warnings.warn(
        f"{estimate.method}: at {count} of {len(estimate)} points the linearisation disagrees with the model "
        f"on more than {TRUST_LEVEL:.0%} of the checked noise draws ({TRUST_CONFIDENCE:.0%} confidence; "
        f"lowest agreement {lowest:.2f}) under noise {noise}: their p may be off by up to 1 - agreement "
        f"(r.agreement, and probust.estimators.trust.untrusted(r) names them); {suggestion}",
        LinearisationWarning,
        stacklevel=user_stacklevel(),
    )


def upper_rate(k: Tensor, n: Tensor | float, level: float) -> Tensor:
    """One-sided Clopper-Pearson upper bound of a binomial rate from k successes in n trials.

    Args:
        k: counts [B] (any numeric dtype).
        n: trials, [B] or a scalar (>= 1).
        level: e.g. 0.975: P(rate <= bound) >= level.

    Returns:
        float64 [B] on k's device; 1 where k == n.
    """
    kk = k.double().cpu().numpy()
    nn_ = torch.as_tensor(n, dtype=torch.float64).cpu().numpy() + 0 * kk
    bound = torch.from_numpy(stats.beta.ppf(level, kk + 1, (nn_ - kk).clip(min=1e-300))).to(k.device)
    return torch.where(torch.from_numpy(kk >= nn_).to(k.device), 1.0, bound)
