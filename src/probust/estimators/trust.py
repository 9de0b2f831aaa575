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
(:data:`probust._rng.STREAM_TRUST`), so no other number changes, in two stages
(:func:`check_stages`): :data:`FIRST_CHECK_DRAWS` on every point, then the rest of its
``check_draws`` (:data:`TAYLOR_CHECK_DRAWS` by default) only where the first leave the verdict
open (:func:`undecided`). A point whose first draws all agree cannot be flagged whatever the
rest show (zero disagreements never flag), and most points are such; one whose first draws
already flag it is flagged on a test of its own. The other draws go to the points in between.
Pruned boundaries (``prune``) are not checked: the probability that any of them is crossed is
bounded by their part of ``cdf_error``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from probust._checks import finite_rows
from probust._stats import upper_rate
from probust.estimators.base import plan_blocks
from probust.estimators.result import Estimate

__all__ = [
    "FIRST_CHECK_DRAWS",
    "TAYLOR_CHECK_DRAWS",
    "TRUST_CONFIDENCE",
    "TRUST_LEVEL",
    "LinearisationWarning",
    "check_stages",
    "disagreement_lower",
    "linear_survives",
    "model_survives",
    "undecided",
    "untrusted",
    "warn_untrusted",
]

#: Fresh noise draws every checked point gets first (fewer where ``check_draws`` is smaller).
FIRST_CHECK_DRAWS = 8
#: The most fresh noise draws Taylor checks per point by default (``check_draws``): the first
#: :data:`FIRST_CHECK_DRAWS` on every point, the rest only where those leave the verdict open
#: (:func:`undecided`; benchmarks/bench_trust.py, docs/estimators.md: more recall than 16 fixed
#: draws at about the cost of 8; one forward pass without autograd per draw against Taylor's
#: one forward and up to C - 1 backward passes per point).
TAYLOR_CHECK_DRAWS = 32
#: A point is flagged when its verdicts differ on more than this fraction of draws: the bound
#: |p_true - p| <= P(verdicts differ) then no longer vouches for an error below 0.05, half the
#: 0.1 the benchmark counts as large. (Testing against 0.1 itself cannot tell, from 16 draws,
#: a rate of 0.1 from one of 0.25: it missed half the errors above 0.1, against a quarter.)
TRUST_LEVEL = 0.05
#: ... at this confidence (a one-sided Clopper-Pearson bound): a point whose verdicts differ on
#: at most ``TRUST_LEVEL`` of draws is flagged with probability <= 5%, one at 1% (8 draws: 3 or
#: more disagreements flag; 32 draws: 5 or more) with probability below 1e-3.
TRUST_CONFIDENCE = 0.95


class LinearisationWarning(UserWarning):
    """A Taylor or MMSE linearisation disagrees with the model on many noise draws at some points
    (:func:`untrusted`): their p may be far from the model's p_robust."""


def linear_survives(margin: Tensor, normal: Tensor, eps: Tensor, active: Tensor) -> Tensor:
    """The linearisation's verdict on each draw: every active boundary has c_i + u_i . eps > 0.

    Args:
        margin: [B, K], the boundaries' c_i.
        normal: [B, K, *S], their u_i.
        eps: [B, m, *S], the draws (units of x).
        active: bool [B, K], the boundaries that count (False at the target and on padding).

    Returns:
        bool [B, m].
    """
    dtype = torch.promote_types(normal.dtype, torch.float32)  # a bf16 dot product would round verdicts
    out = torch.empty(eps.shape[:2], dtype=torch.bool, device=eps.device)
    # One product per point: its shape, and so its rounding, depends on the point alone.
    for b in range(eps.shape[0]):
        u = normal[b].detach().flatten(1).to(dtype)  # [K, D]
        values = margin[b].detach().to(dtype)[:, None] + u @ eps[b].flatten(1).to(dtype).T  # [K, m]
        out[b] = ((values > 0) | ~active[b, :, None]).all(dim=0)
    return out


def check_stages(check_draws: int | None) -> tuple[int, int]:
    """(first, rest): the fresh draws every point gets, and those added where the first leave the
    verdict open (:func:`undecided`), for Taylor's (or MMSE's) ``check_draws`` (None:
    :data:`TAYLOR_CHECK_DRAWS`; 0: (0, 0), no check)."""
    most = TAYLOR_CHECK_DRAWS if check_draws is None else check_draws
    first = min(most, FIRST_CHECK_DRAWS)
    return first, most - first


def undecided(agreeing: Tensor, draws: int) -> Tensor:
    """bool [B]: the points whose first ``draws`` checked draws, ``agreeing`` (int64 [B]) of
    which agree, neither clear them (every draw agrees: no number of further draws could flag
    them) nor flag them (:func:`untrusted`'s test on those draws alone)."""
    return (agreeing < draws) & ~_flags(agreeing.double() / draws, torch.full_like(agreeing, draws))


def _flags(
    agreement: Tensor, draws: Tensor, level: float = TRUST_LEVEL, confidence: float = TRUST_CONFIDENCE
) -> Tensor:
    """bool [B]: the disagreement rate is above ``level`` at ``confidence`` (draws >= 1)."""
    return disagreement_lower(agreement, draws, confidence) > level


def model_survives(
    model: nn.Module,
    x: Tensor,
    eps: Tensor,
    target: Tensor,
    rows: int,
    to_rows: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The model's verdict on each draw: argmax f(x + eps) = t with finite logits (as Monte Carlo).

    Args:
        model: in eval mode.
        x: [B, *S].
        eps: [B, m, *S].
        target: int64 [B].
        rows: rows per forward pass.
        to_rows: puts a pass's rows in the model's memory format (None: as they are).

    Returns:
        bool [B, m].
    """
    points, draws = eps.shape[:2]
    shape = x.shape[1:]
    out = torch.zeros(points, draws, dtype=torch.bool, device=x.device)
    for block, first, count in plan_blocks(points, draws, rows):
        noisy = (x[block, None] + eps[block, first : first + count].to(x.dtype)).reshape(-1, *shape)
        if to_rows is not None:
            noisy = to_rows(noisy)
        with torch.no_grad():
            logits = model(noisy)
        out[block, first : first + count] = verdicts(logits.view(-1, count, logits.shape[1]), target[block])
    return out


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


def warn_untrusted(estimate: Estimate, noise: str, suggestion: str, stacklevel: int = 2) -> None:
    """One :class:`LinearisationWarning` for the whole estimate, naming how many of its points
    :func:`untrusted` flags; nothing where it flags none.

    Args:
        estimate: the call's estimate.
        noise: the noise in words (e.g. ``gaussian sigma=2.0``).
        suggestion: what to do instead, in words.
        stacklevel: as :func:`warnings.warn`'s, counted from the caller.
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
        stacklevel=stacklevel + 1,
    )
