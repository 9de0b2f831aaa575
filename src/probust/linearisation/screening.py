"""Which decision boundaries can matter to the mvn-cdf: lower bounds on z, then the drop.

Taylor and MMSE need u_i = grad g_i for every boundary i != t: C - 1 backward passes per point
(per noisy copy for MMSE). At large C almost every boundary is far: a boundary at z_i noise
standard deviations can change p by at most Phi(-z_i) (the union bound: P(all kept hold) -
P(all hold) <= sum over the dropped of P(Y_i > z_i)). This module holds the maths; which bound
runs for which point is decided from counts by :mod:`probust.linearisation.routes`:

- :func:`spectral_z_lower`: m reverse-mode probes w_k ~ N(0, I) on the features give the Gram
  matrix G = W^T M W of their noise covariance M; lambda_max(G) >= lambda_max(M) X with
  X ~ chi-square(m), so every boundary's variance is at most |a_i|^2 lambda_max(G) / q for all
  boundaries at once, except with probability delta = P(X < q).
- :func:`sketch_z_lower`: m forward-mode products against probes v_k ~ N(0, S) give
  d_ik = u_i . v_k for every class at once, d_ik ~ N(0, s_i^2), so with q the chi-square(m)
  quantile at delta / (C - 1), s_i^2 <= sum_k d_ik^2 / q for all boundaries at once, except with
  probability at most delta (union over the C - 1 boundaries). The sketch runs in
  :data:`SKETCH_STAGES` of more probes each, each stage at its part of delta
  (:func:`stage_failure`; a union over the stages), so that a point whose far boundaries are
  far beyond the threshold stops after a few probes.
- :func:`drop`: the boundaries with the smallest tails Phi(-z_lower_i) are dropped while their
  sum stays within a budget; only the rest get exact gradients.

The estimate's error grows by at most (sum of the dropped Phi(-z_lower)) + delta: the first term
bounds the change of p when the bounds hold, the second the probability that they do not (p is
in [0, 1]). Both are fixed shares of ``tol`` (see :func:`shares`), and the mvn-cdf samples to the
rest of ``tol``, so p keeps its stated tolerance. Where every exact z is known (the linear head's
route, :mod:`probust.linearisation.head`), :func:`exact_z` gives them and :func:`drop` drops by the exact
tails (delta = 0).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

import torch
from scipy.stats import chi2
from torch import Tensor

from probust._user_model import to_format
from probust.linearisation import head as linear_head
from probust.linearisation.margins import margin_sketch
from probust.linearisation.pullback import forward_mode_runs
from probust.mvn import ndtr
from probust.noise import STREAM_PRUNE, STREAM_SCREEN, normal_draws, point_keys

if TYPE_CHECKING:
    from probust.linearisation.exact import Rows
    from probust.linearisation.routes import Context

#: The ``prune`` setting of Taylor and MMSE: "auto" drops the boundaries that cannot matter and
#: screens where the counts say it pays (:mod:`probust.linearisation.routes`); "off" keeps every
#: boundary; "spectral" and "sketch" run that screening on every point, then compute the exact
#: gradients of only the boundaries it leaves within reach.
#: The screenings ``prune`` can force.
SCREENINGS = ("spectral", "sketch")
PRUNE_CHOICES = ("auto", "off", *SCREENINGS)
#: The sketch's stages: the forward-mode probes a point's bound uses after each stage (each stage
#: draws the new ones). More probes tighten the bound (the chi-square's lower quantile over m
#: grows towards 1) at a linear cost; where a few already drop every far boundary (their z is
#: far above the threshold), the later stages do not run.
SKETCH_STAGES = (8, 16, 32)
#: The most probes per point: the last stage's.
PROBES = SKETCH_STAGES[-1]
#: The shares of ``tol`` spent on the dropped boundaries' tails and on the sketch's failure.
DROP_SHARE = 0.05
FAILURE_SHARE = 0.01


def shares(tol: float) -> tuple[float, float]:
    """(drop budget, sketch failure probability delta) per point for an mvn-cdf tolerance ``tol``."""
    return DROP_SHARE * tol, FAILURE_SHARE * tol


#: Each sketch stage's part of the sketch's failure probability. Most goes to the first stage,
#: where most points stop and where the bound is the most sensitive to it: the chi-square(m)
#: quantile at a small probability f grows as f^(2/m), so a tenth of the share loosens the
#: 32-probe bound's variance by 10^(1/16) = 1.15x, the 8-probe one's by 10^(1/4) = 1.78x.
STAGE_SHARES = (0.8, 0.1, 0.1)


def stage_failure(failure: float, stage: int) -> float:
    """The failure probability of the bounds of sketch stage ``stage`` (an index into
    :data:`SKETCH_STAGES`): its part of the sketch's ``failure``, so that the bounds of every
    stage hold together except with probability at most ``failure`` (a union bound)."""
    return failure * STAGE_SHARES[stage]


#: The spectral screening's stages' parts of its failure probability, by the number of stages
#: (:data:`probust.linearisation.counting.SPECTRAL_STAGES`): most to the first, where a point whose
#: far boundaries lie far stops.
SPECTRAL_STAGE_SHARES = {1: (1.0,), 2: (0.8, 0.2)}


def spectral_stage_failure(failure: float, stage: int, stages: int) -> float:
    """The failure probability of the bounds of spectral stage ``stage`` of ``stages``: its part
    of the screening's ``failure`` (a union bound over the stages, as :func:`stage_failure`)."""
    return failure * SPECTRAL_STAGE_SHARES[stages][stage]


def spectral_z_best(z_lower: Tensor, probes: int, failure: float, more: int, more_failure: float) -> Tensor:
    """float64, the shape of ``z_lower``: the most that :func:`spectral_z_lower` could give each
    boundary from ``more`` probes failing with ``more_failure``, given its bound ``z_lower`` from
    the first ``probes`` of them failing with ``failure``.

    The first probes' Gram matrix is a principal submatrix of all of theirs, so its top
    eigenvalue is at most theirs (interlacing) and z' <= z sqrt(q' / q), q and q' the
    chi-square quantiles (:func:`variance_factor`)."""
    return z_lower * math.sqrt(variance_factor(more, more_failure) / variance_factor(probes, failure))


@functools.lru_cache(maxsize=64)
def variance_factor(probes: int, per_boundary_failure: float) -> float:
    """q: P(chi-square(probes) <= q) = per_boundary_failure, so that s^2 <= sum d^2 / q but for it."""
    return float(chi2.ppf(per_boundary_failure, probes))


class Pruned(NamedTuple):
    """Which boundaries of a chunk of points are kept.

    Attributes:
        classes: int64 [B, K], the kept boundaries of each point, padded with its target (a
            zero gradient, so z = +inf there: no constraint).
        kept: int64 [B], how many boundaries each point keeps (<= C - 1).
        z_lower: float64 [B, C], the lower bounds on z (+inf at the target; exact ones from :func:`exact_z`).
        bound: float64 [B], what pruning may cost p: the dropped tails plus the failure probability.
        reserved: the share of ``tol`` set aside for ``bound``: the mvn-cdf samples to the rest.
    """

    classes: Tensor
    kept: Tensor
    z_lower: Tensor
    bound: Tensor
    reserved: float


def sketch_z_lower(margin: Tensor, derivatives: Tensor, failure: float) -> Tensor:
    """float64 [B, C]: lower bounds on every boundary's z from forward-mode probe derivatives
    d_ik = u_i . v_k, v_k ~ N(0, S), that hold together except with probability ``failure``
    (each boundary's sum_k d_ik^2 / s_i^2 is chi-square(m); a union over the C - 1 boundaries)."""
    points, probes, classes = derivatives.shape
    q = variance_factor(probes, failure / max(classes - 1, 1))
    return _z_lower(margin, derivatives.to(torch.float64).square().sum(dim=1) / q)


def spectral_z_lower(margin: Tensor, scale: Tensor, gram: Tensor, failure: float) -> Tensor:
    """float64 [B, C]: lower bounds on every boundary's z from reverse-mode probes, that hold
    together except with probability ``failure``.

    A boundary's variance is s_i^2 = a_i^T M a_i, with a_i its cotangent on the model's
    features (W_t - W_i through a linear head W; e_t - e_i on the logits) and M = J S J^T the
    features' covariance under the linearised noise. Pulling back m probes w_k ~ N(0, I) (the
    columns of W) gives their Gram matrix G = W^T M W. With M = sum_j lambda_j v_j v_j^T,
    G = sum_j lambda_j z_j z_j^T where z_j = W^T v_j ~ N(0, I_m), so
    G >= lambda_max(M) z_1 z_1^T and lambda_max(G) >= lambda_max(M) X, X = |z_1|^2 ~ chi-square(m).
    Hence lambda_max(M) <= lambda_max(G) / q except with probability P(X < q) = ``failure``,
    and then s_i^2 <= ||a_i||^2 lambda_max(G) / q for every boundary at once.

    lambda_max(G) is at most the probes' energy tr(G) = sum_k w_k^T M w_k, and about tr(G) / m
    where M's spectrum is spread over many more than m directions (a backbone's features), so
    this bound is never looser than the energy's and up to m times tighter in variance. It is
    still loose by the spread of M's spectrum (it pays where most boundaries are far).

    Args:
        margin: [B, C], c_i (any value at the target).
        scale: [B, C], ||a_i||^2.
        gram: [B, m, m], G (symmetric positive semi-definite).
        failure: the probability that the bounds fail.
    """
    probes = gram.shape[-1]
    top = torch.linalg.eigvalsh(gram.to(torch.float64))[:, -1].clamp_min(0.0)
    return _z_lower(margin, scale.to(torch.float64) * (top / variance_factor(probes, failure))[:, None])


def _z_lower(margin: Tensor, var_upper: Tensor) -> Tensor:
    c = margin.to(torch.float64)
    # c > 0 with no variance: the noise cannot reach the boundary. c <= 0: always kept.
    return torch.where(c > 0, torch.where(var_upper > 0, c / var_upper.clamp_min(1e-300).sqrt(), torch.inf), -torch.inf)


def exact_z(margin: Tensor, variance: Tensor) -> Tensor:
    """float64 z_i = c_i / s_i from margins and exact variances u_i S u_i^T (same shapes)."""
    c = margin.to(torch.float64)
    var = variance.to(torch.float64)
    # As maps.standardise: a boundary without variance is never crossed (c > 0) or always (c <= 0).
    return torch.where(var > 0, c / var.clamp_min(1e-300).sqrt(), torch.where(c > 0, torch.inf, -torch.inf))


def drop(
    z_lower: Tensor,
    target: Tensor,
    *,
    budget: float,
    delta: float | Tensor,
    forced: Tensor | None = None,
    reserved: float | None = None,
) -> Pruned:
    """Drop the boundaries with the smallest tails Phi(-z_lower) while their sum fits ``budget``.

    ``forced`` (bool [B, C]): boundaries dropped whatever their tail (no gradient was computed
    for them: a screening already fitted their tails within the budget); their tails are
    spent first. ``delta``: the failure probability of the bounds (per point or one float).
    """
    z_lower = z_lower.scatter(1, target[:, None], torch.inf)
    tail, dropped = _dropped(z_lower, target, budget, forced)
    bound = torch.where(dropped, tail, 0.0).sum(1) + delta
    kept = (~dropped).sum(1)
    width = max(int(kept.max()), 1)
    # Kept classes first in class order, then the target as padding.
    rank = torch.argsort(dropped.to(torch.int8), dim=1, stable=True)[:, :width]
    pad = torch.arange(width, device=z_lower.device) >= kept[:, None]
    chosen = torch.where(pad, target[:, None], rank)
    spent = budget + (delta if isinstance(delta, float) else float(delta.max())) if reserved is None else reserved
    return Pruned(classes=chosen, kept=kept, z_lower=z_lower, bound=bound, reserved=spent)


def _dropped(z_lower: Tensor, target: Tensor, budget: float, forced: Tensor | None) -> tuple[Tensor, Tensor]:
    """(tails Phi(-z_lower) [B, C], bool [B, C] the boundaries :func:`drop` drops); ``z_lower``
    is +inf at the target."""
    tail = ndtr(-z_lower)  # 0 at the target
    # Drop the smallest tails while their running sum fits the budget (the target first: 0),
    # the forced ones before any other.
    key = tail if forced is None else torch.where(forced, -1.0, tail)
    order = torch.argsort(key, dim=1, stable=True)
    dropped = torch.zeros_like(tail, dtype=torch.bool).scatter(1, order, tail.gather(1, order).cumsum(1) <= budget)
    dropped = dropped.scatter(1, target[:, None], True)
    if forced is not None:
        dropped |= forced
    return tail, dropped


def kept_count(z_lower: Tensor, target: Tensor, budget: float) -> Tensor:
    """int64 [B]: how many boundaries :func:`drop` would keep from these bounds (its ``kept``)."""
    _, dropped = _dropped(z_lower.scatter(1, target[:, None], torch.inf), target, budget, None)
    return (~dropped).sum(1)


def by_width(kept: Pruned, target: Tensor) -> list[tuple[Tensor, Pruned]]:
    """The points of a chunk grouped by their kept count rounded up to a power of two (at least 1):
    (indices [n], their :class:`Pruned` with ``classes`` at that common width, padded with the target).

    A point's kept boundaries then enter backward passes and matrix products of a shape that
    depends on the point alone: BLAS rounding depends on a product's shape, and a chunk-wide
    width would make a point's last bits depend on the other points of its chunk.
    """
    counts = kept.kept.clamp_min(1).double()
    width = (2 ** torch.ceil(torch.log2(counts))).long()
    groups = []
    for w in sorted(set(width.tolist())):
        index = (width == w).nonzero().flatten()
        classes = kept.classes[index, :w]
        if classes.shape[1] < w:
            classes = torch.cat([classes, target[index, None].expand(-1, w - classes.shape[1])], dim=1)
        groups.append((index, Pruned(classes, kept.kept[index], kept.z_lower[index], kept.bound[index], kept.reserved)))
    return groups


def spectral(ctx: Context, rows: Rows, c: Tensor, target: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """The spectral screening in ``ctx.spectral_stages``: (lower bounds on z [P, C]
    (:func:`spectral_z_lower`), the probes each point pulled, float64 [P]).

    Stage s bounds every z from the point's first ``spectral_stages[s]`` probes (a function of
    the seed, the point and its index, whichever stage pulls them) at its part of the
    screening's failure share (:func:`spectral_stage_failure`; the caller counts the
    whole share). A later stage runs on a point only where the most its probes could give
    (:func:`spectral_z_best`) would drop more boundaries than it pulls probes: the far
    boundaries of a point already dropped, or out of any such bound's reach, cost no more probes.
    The decision reads the point's own bounds alone, so it does not depend on its batch.
    """
    features = rows.features
    stages = ctx.spectral_stages
    keys = point_keys(ctx.seed, indices, STREAM_SCREEN)
    probes = normal_draws(keys, 0, stages[-1], features.shape[1], dtype=features.dtype)  # [P, m, F]
    if ctx.head is not None:
        scale = linear_head.boundary_norms_squared(ctx.head, target)
    else:
        scale = torch.full_like(c, 2.0, dtype=torch.float64)
    budget, share = shares(ctx.tol)
    z = torch.full_like(c, -math.inf, dtype=torch.float64)
    run = torch.ones(len(target), dtype=torch.bool, device=c.device)
    pulled = torch.zeros(len(target), 0, *rows.rows.shape[1:], dtype=rows.rows.dtype, device=c.device)
    used = torch.zeros(len(target), dtype=torch.float64, device=c.device)
    done, failure = 0, 0.0
    for stage, count in enumerate(stages):
        stage_failure = spectral_stage_failure(share, stage, len(stages))
        if stage:
            best = spectral_z_best(z, done, failure, count, stage_failure)
            gain = kept_count(z, target, budget) - kept_count(best, target, budget)
            run = run & ((count - done) < gain)
            if not bool(run.any()):
                break
        new = rows.average(rows.pull(probes[rows.row_point, done:count].transpose(0, 1)))  # [P, k, *S]
        pulled = torch.cat([pulled, new], dim=1)
        z_stage = spectral_z_lower(c, scale, ctx.noise.quadratic_form(pulled), stage_failure)
        z = torch.where(run[:, None], torch.maximum(z, z_stage), z)
        used = torch.where(run, float(count), used)
        done, failure = count, stage_failure
    return z, used


def staged_sketch(
    ctx: Context,
    copies: Tensor,
    target: Tensor,
    indices: Tensor,
    c: Tensor,
    z_screen: Tensor,
    delta: Tensor,
    *,
    spent: Tensor | float,
    exact_cost: Tensor,
    candidates_cost: Tensor,
    screened: Pruned | None,
) -> tuple[Pruned | None, Tensor]:
    """The forward-mode sketch in :data:`SKETCH_STAGES`, each stage on the points whose
    counts say it pays: (the screening's selection, each point's candidates cost in pulls).

    Stage s bounds every z from the point's first SKETCH_STAGES[s] probes (the earlier stages'
    and its new ones, :func:`sketch_z_lower`), failing with its part of the sketch's
    failure share (:func:`stage_failure`): the bounds of all stages hold together but
    for that share, which each sketched point's ``delta`` [P] gets whatever stage it stops at.
    ``z_screen`` and ``delta`` are updated in place.

    The sketch runs on the points where its worst case, every stage's probes, and the spectral
    screening's ``spent`` pulls cost at most ``ctx.share`` of the best route so far (every point
    where it is forced: ``prune="sketch"``). There each stage runs where its new probes cost
    fewer pulls than the candidates the stages before left (the most it could save), so a point
    whose far boundaries all drop after 8 probes pays 8.
    """
    points = len(target)
    forced = ctx.screening == "sketch"
    budget, failure = shares(ctx.tol)
    # The points whose whole sketch, every stage, fits the share: its worst case.
    ran = torch.ones(points, dtype=torch.bool, device=c.device)
    if not forced:
        ran = spent + PROBES * ctx.jvp <= ctx.share * torch.minimum(exact_cost, candidates_cost)
        if bool(ran.any()) and not forward_mode_runs(ctx.model, copies[:, 0]):
            return screened, candidates_cost  # a fact about the model (untimed), the same for every point
    done = 0
    before: Tensor | None = None  # the last stage's points
    derivatives = c.new_zeros(0)  # their derivatives along its probes, [W, done, C]
    for stage, probes in enumerate(SKETCH_STAGES):
        run = ran & ((probes - done) * ctx.jvp < candidates_cost)
        if not bool(run.any()):
            break
        which = run.nonzero().flatten()
        new = _sketch(ctx, copies[which], target[which], indices[which], done, probes)
        if before is not None:  # a stage's points all ran the one before
            new = torch.cat([derivatives[torch.searchsorted(before, which)], new], dim=1)
        before, derivatives = which, new
        z_stage = sketch_z_lower(c[which], derivatives, stage_failure(failure, stage))
        z_screen[which] = torch.maximum(z_screen[which], z_stage)
        if stage == 0:
            # The whole sketch's share, whichever later stages run: whether they run depends on
            # the first stage's bounds, so only the union over every stage is a probability
            # that holds whatever the point stops at.
            delta[which] += failure
        screened = drop(z_screen, target, budget=budget, delta=delta)
        candidates_cost = torch.where(run, screened.kept.double(), candidates_cost)
        ran, done = run, probes
    return screened, candidates_cost


def _sketch(ctx: Context, copies: Tensor, target: Tensor, indices: Tensor, first: int, stop: int) -> Tensor:
    """float64 [P', stop - first, C]: the margins' derivatives along the points' forward-mode probes
    ``first``..``stop - 1`` (:func:`probust.linearisation.margins.margin_sketch`; each probe a function of
    the seed, the point and its index, whichever stage draws it)."""
    keys = point_keys(ctx.seed, indices, STREAM_PRUNE)
    count = stop - first
    probes = ctx.noise.sample(keys, first, count, copies.shape[2:]).to(copies.device)
    rows = ctx.probe_rows
    _, derivatives = margin_sketch(
        ctx.model,
        copies,
        target,
        probes,
        batch_size=max(1, rows // count),
        probe_chunk_size=min(count, rows),
        to_rows=lambda block: to_format(block, ctx.plan.channels_last),
    )
    return derivatives.to(torch.float64)
