"""Which margin gradients Taylor and MMSE compute for each point, chosen from counts.

Every boundary's gradient u_i = grad (f_t - f_i) costs one backward pass per point (and per
noisy copy for MMSE): C - 1 of them. At many classes most boundaries cannot matter to p (a
boundary at z noise standard deviations changes p by at most Phi(-z)), and where the logits
come from a linear head of d < C - 1 features, d passes give every gradient. Each point takes
the cheapest of these routes, costs counted in backward passes of one row, from counts and the
declared cost of a forward-mode probe (:mod:`probust.linearisation.counting`), never from a clock:

- **direct**: every boundary's gradient, one pullback each (C - 1).
- **head**: the rows of the features' Jacobian J that are not held at exactly 0 (plus one
  check pass), through the linear head (:mod:`probust.linearisation.head`): every u_i = (W_t - W_i) J.
- **forward**: forward mode, one Jacobian-vector product per input coordinate (D < C - 1).
- **candidates**: a screening bounds every boundary's z from below; only the boundaries whose
  tails do not fit the pruning budget get an exact gradient.

Two screenings, run only where they cost together at most the declared share of the cheapest
route (:data:`probust.linearisation.counting.SCREENING_SHARE`, per device kind; so that unlucky
screenings cost at most that much more than not screening), the first at most
:data:`~probust.linearisation.counting.RHO` of it alone:

1. **spectral**: up to :data:`~probust.linearisation.counting.SPECTRAL_PROBES` random cotangents
   on the features, pulled back on the same forward pass, bound the top eigenvalue of the
   features' covariance (by their Gram matrix's top eigenvalue) and with it every boundary's
   variance (:func:`probust.linearisation.screening.spectral_z_lower`). Whether it runs is decided
   per model and class count when the call is planned (``Context.spectral``,
   :func:`probust.linearisation.counting.route_counts`), so all points of a pass share it; its probes come in the device kind's
   stages (:data:`probust.linearisation.counting.SPECTRAL_STAGES`: 4, then 8 on a CPU), the second
   only on the points where the most 8 probes could give would drop more boundaries than the
   4 more probes cost.
2. **sketch**: forward-mode probes bound each boundary's variance separately
   (:func:`probust.linearisation.screening.sketch_z_lower`), in the stages of
   :data:`probust.linearisation.screening.SKETCH_STAGES` (8, 16, then 32 probes); decided per point,
   where its probes (every stage's) and the first screening's together cost at most that share
   of the best route after the first screening, and then per stage, where the stage's new
   probes cost fewer pulls than the candidates the stages before left.

The dropped boundaries' tails and the screenings' failure probabilities are added to
``cdf_error`` (:mod:`probust.linearisation.screening`). A point's route depends only on the point
(its margins, features and the model), and its gradients come from passes whose rows do not
interact, so its numbers do not depend on the other points of its batch.

Two settings of Taylor and MMSE can force a route on every point, each checked once
(:func:`check_settings`): ``gradients`` an exact source (:data:`GRADIENTS`), ``prune`` a
screening whose candidates get exact gradients, or no pruning ("off"). :data:`FORCING` maps a
route's name to them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from probust._checks import check_choice
from probust._inputs import check_target
from probust._user_model import check_logits
from probust.errors import OptionError, Part, Setting
from probust.linearisation.counting import ROUTE_NAMES as ROUTE_NAMES  # re-exported: the routes' names
from probust.linearisation.counting import SPECTRAL_PROBES
from probust.linearisation.exact import Exact, Rows, pad_to, per_point_max
from probust.linearisation.pullback import JacobianPlan, Strategy, margins
from probust.linearisation.screening import (
    PRUNE_CHOICES,
    SCREENINGS,
    Pruned,
    drop,
    exact_z,
    shares,
    spectral,
    staged_sketch,
)
from probust.noise import Noise, noise_words

#: The ``gradients`` setting of Taylor and MMSE, where the exact margin gradients come from: "auto"
#: chooses per point by counted cost; the others are routes of :data:`ROUTE_NAMES`, forced on
#: every point (with no screening: they give every boundary's gradient). The screenings are the
#: ``prune`` setting's (:data:`probust.linearisation.screening.PRUNE_CHOICES`).
GRADIENTS = ("auto", "direct", "head", "forward")
#: The Taylor/MMSE settings that force each route on every point (to compare them): an exact
#: source (``gradients``), or a screening then its candidates (``prune``); "auto": neither.
FORCING: dict[str, dict[str, str]] = {
    "auto": {},
    **{source: {"gradients": source} for source in GRADIENTS[1:]},
    **{screening: {"prune": screening} for screening in SCREENINGS},
}


def check_settings(
    prune: str,
    gradients: str,
    *,
    cdf: str = "mvn",
    differentiable: bool = False,
    p_fail: bool = False,
    gaussian: bool = True,
    jacobian: str = "auto",
) -> None:
    """Check Taylor's and MMSE's ``prune`` (:data:`probust.linearisation.screening.PRUNE_CHOICES`) and
    ``gradients`` (:data:`GRADIENTS`) and what they are combined with; the one check, run by the
    estimators and by the runner before any work (which names its settings the same).

    Raises:
        OptionError: a value not offered, or a forced screening or source that cannot apply
            (``field`` "prune" or "gradients"; the message names the setting in the way).
    """
    check_choice(prune, PRUNE_CHOICES, "prune")
    check_choice(gradients, GRADIENTS, "gradients")
    if prune in SCREENINGS:
        unsupported: dict[Part, bool] = {
            Setting("cdf", "mv-sigmoid"): cdf != "mvn",
            Setting("differentiable", True): differentiable,
            Setting("p_fail", True): p_fail,
            "non-Gaussian noise": not gaussian,
            Setting("gradients", gradients): gradients != "auto",
        }
        reasons = [name for name, bad in unsupported.items() if bad]
        if reasons:
            listed = [part for i, reason in enumerate(reasons) for part in ((", ",) if i else ()) + (reason,)]
            raise OptionError(
                f"{prune!r} screens the boundaries, which cannot be combined with ",
                *listed,
                "; use 'auto' or 'off'",
                field="prune",
            )
    if differentiable and gradients == "head":
        raise OptionError(
            "'head' does not keep the autograd graph that ",
            Setting("differentiable", True),
            " needs; use 'auto', 'direct' or 'forward'",
            field="gradients",
        )
    if gradients == "forward" and jacobian != "auto":
        raise OptionError(
            "'forward' takes no backward passes for ",
            Setting("jacobian"),
            " to batch; leave it 'auto'",
            field="gradients",
        )


@dataclass(frozen=True)
class Context:
    """What the routes need to know of the estimator and its execution plan.

    Attributes:
        model: in eval mode (weights already in the plan's memory format).
        head: the model's linear head, or None.
        plan: rows per pass, strategy (:class:`probust.linearisation.pullback.Strategy`), format.
        noise: Gaussian or not (the covariance S of the variances).
        tol: the mvn-cdf's tolerance (pruning shares of it).
        seed: the estimator's seed (probes' random streams).
        prune: whether boundaries may be dropped (mvn-cdf under Gaussian noise); otherwise every
            boundary's gradient is computed, by the cheapest exact route.
        jvp: a forward-mode probe in pulls (:func:`probust.linearisation.counting.jvp_in_pulls`);
            inf where forward mode was found not to run through the model. Where it was not
            probed yet, a point whose route wants the sketch probes it first
            (:func:`probust.linearisation.pullback.forward_mode_runs`).
        share: the screenings' share of the best route
            (:func:`probust.linearisation.counting.screening_share`).
        probe_rows: rows per forward-mode pass of the sketch
            (:meth:`probust.execution.Execution.forward_mode_rows`).
        pull_rows: rows per pass of pullbacks, and so the points linearised together
            (:meth:`probust.execution.Execution.pull_rows`).
        graph_rows: rows whose forward graph fits the budget: a group of points (at least one
            point's copies) within it runs one forward pass for all its pulls
            (:meth:`probust.execution.Execution.graph_rows`).
        gradients: one of :data:`GRADIENTS`: "auto", or the exact route forced on every point
            (no screening runs).
        screening: "auto" (where it pays, by counts), or "spectral" / "sketch": that screening
            on every point, then the exact gradients of its candidates (``prune`` only).
        differentiable: keep the autograd graph of the margins and their gradients (double
            backpropagation, to the parameters and to the copies where they require grad);
            only without pruning, by the direct or forward route.
        spectral_stages: the spectral screening's probes after each stage
            (:func:`probust.linearisation.counting.spectral_stages` of the device kind).
        every_boundary: every pull is every boundary's (C - 1 cotangents, no head, no
            screening), so its width never depends on the other rows: vmap takes them in the
            plan's class chunks, unpadded.
            Otherwise pulls are padded to :data:`probust.linearisation.pullback.VMAP_STEP` cotangents, so
            that a pull's shape, and its rounding, does not depend on what the other points of
            its pass need.
        spectral: the spectral screening runs on every point (forced, or paying by the counts:
            :func:`probust.linearisation.counting.route_counts`).
    """

    model: nn.Module
    head: nn.Linear | None
    plan: JacobianPlan
    noise: Noise
    tol: float
    seed: int
    prune: bool
    jvp: float
    share: float
    probe_rows: int
    pull_rows: int
    graph_rows: int
    gradients: str = "auto"
    screening: str = "auto"
    differentiable: bool = False
    every_boundary: bool = False
    spectral_stages: tuple[int, ...] = (SPECTRAL_PROBES,)
    spectral: bool = False

    @property
    def pull(self) -> Strategy:
        """How the pulls run: by the plan's loop or vmap (speed and rounding only); a
        forward-mode plan pulls by the loop."""
        return Strategy.LOOP if self.plan.strategy.whole_jacobian else self.plan.strategy


class Routed(NamedTuple):
    """The linearisation of a chunk of points by :func:`linearise`.

    Attributes:
        target: int64 [P].
        margin: [P, C], c_i averaged over the copies (0 at the target).
        kept: with ``prune``: which boundaries the mvn-cdf sees (:class:`probust.linearisation.screening.Pruned`), else None.
        normal: with ``prune``: [P, K, *S], the kept boundaries' u in the order of
            ``kept.classes`` (0 on padding); else [P, C, *S], every u_i (0 at the target).
        route: int64 [P], each point's route (index into :data:`ROUTE_NAMES`).
        logits: [P, N, C], the model's logits on each point's copies (detached): the model's
            verdict on MMSE's own copies, which its trust check needs, without another pass.
    """

    target: Tensor
    margin: Tensor
    kept: Pruned | None
    normal: Tensor
    route: Tensor
    logits: Tensor


def linearise(ctx: Context, copies: Tensor, target: Tensor | None, indices: Tensor) -> Routed:
    """The linearisation of points from their copies, each point by its cheapest route.

    Args:
        ctx: the estimator's settings and plan.
        copies: [P, N, *S], N inputs per point whose linearisations are averaged (Taylor: the
            point itself; MMSE: its noisy copies).
        target: long [P]; None: the prediction on the copies (Taylor, N = 1; a tie is an error).
        indices: int64 [P], the points' data-set indices (probes' random streams).
    """
    points, n = copies.shape[:2]
    per_pass = max(1, ctx.pull_rows // n)
    parts = [
        _linearise_group(
            ctx,
            copies[first : first + per_pass],
            None if target is None else target[first : first + per_pass],
            indices[first : first + per_pass],
        )
        for first in range(0, points, per_pass)
    ]
    if len(parts) == 1:
        return parts[0]
    kept = None
    if ctx.prune:
        width = max(p.normal.shape[1] for p in parts)
        normal = torch.cat([_pad_width(p.normal, width) for p in parts])
        kept = _cat_pruned(parts, width)
    else:
        normal = torch.cat([p.normal for p in parts])
    return Routed(
        target=torch.cat([p.target for p in parts]),
        margin=torch.cat([p.margin for p in parts]),
        kept=kept,
        normal=normal,
        route=torch.cat([p.route for p in parts]),
        logits=torch.cat([p.logits for p in parts]),
    )


def non_finite_copies(noise: Noise, points: Tensor, copies: int) -> ValueError:
    """The error for NaN or inf logits on noisy copies of MMSE's linearisation at ``points``
    (data-set indices)."""
    shown = points.tolist()
    return ValueError(
        f"the model returned NaN or inf logits on noisy copies x + eps of MMSE's linearisation under noise "
        f"{noise_words(noise)} (points {shown[:5]}{'...' if len(shown) > 5 else ''}: data-set "
        f"indices, index_offset + row; {copies} copies each): p_robust is undefined there; make "
        "the model finite on noisy inputs (e.g. clamp before a log or an exp) or use a smaller noise"
    )


def _linearise_group(ctx: Context, copies: Tensor, target: Tensor | None, indices: Tensor) -> Routed:
    points, n = copies.shape[:2]
    rows = Rows(ctx, copies)
    if n > 1:
        finite = torch.isfinite(rows.logits.detach()).all(1).view(points, n).all(1)
        if not bool(finite.all()):
            raise non_finite_copies(ctx.noise, indices[~finite], n)
    check_logits(rows.logits, rows.rows.shape[0])
    if n == 1:  # Taylor: one copy, the point itself (a given target checked, a tie refused)
        target = check_target(target, rows.logits)
    assert target is not None  # MMSE's copies: its clean prediction, checked before the copies
    row_target = target.repeat_interleave(n)
    c = rows.average(margins(rows.logits, row_target))
    copy_logits = rows.logits.detach().view(points, n, -1)
    classes = c.shape[1]
    inputs = copies[0, 0].numel()

    forced, jvp = ctx.gradients, ctx.jvp
    direct_cost, head_cost, forward_cost, alive = _exact_costs(ctx, rows, classes, inputs)
    exact_cost = torch.minimum(torch.minimum(direct_cost, head_cost), forward_cost)

    # Screenings: lower bounds on every boundary's z, failing with probability delta per point.
    budget, share = shares(ctx.tol)
    z_screen = torch.full((points, classes), -math.inf, dtype=torch.float64, device=c.device)
    delta = torch.zeros(points, dtype=torch.float64, device=c.device)
    candidates_cost = torch.full_like(direct_cost, math.inf)
    screened: Pruned | None = None
    spent: Tensor | float = 0.0
    if ctx.spectral:
        z_screen, spent = spectral(ctx, rows, c, target, indices)
        delta += share
        screened = drop(z_screen, target, budget=budget, delta=delta)
        candidates_cost = screened.kept.double()
    screening = ctx.screening
    if screening == "sketch" or (forced == screening == "auto" and ctx.prune and math.isfinite(jvp)):
        screened, candidates_cost = staged_sketch(
            ctx,
            copies,
            target,
            indices,
            c,
            z_screen,
            delta,
            spent=spent,
            exact_cost=exact_cost,
            candidates_cost=candidates_cost,
            screened=screened,
        )
    if screening != "auto":
        exact_cost = torch.full_like(exact_cost, math.inf)
        direct_cost = head_cost = forward_cost = exact_cost
    route = torch.stack([direct_cost, head_cost, forward_cost, candidates_cost]).argmin(0)

    grads = Exact(ctx, rows, c, target, route, screened, alive, copies)
    if not ctx.prune:
        return Routed(target, c, None, grads.all_normals(), route, copy_logits)
    exact = grads.exact.clone()
    exact.scatter_(1, target[:, None], False)
    z = torch.where(exact, exact_z(c, grads.variance), z_screen)
    # What no gradient was computed for must be dropped: the screening fitted its tails in the budget.
    unknown = ~exact
    unknown.scatter_(1, target[:, None], False)
    kept = drop(z, target, budget=budget, delta=delta, forced=unknown, reserved=budget + 2 * share)
    return Routed(target, c, kept, grads.kept_normals(kept.classes), route, copy_logits)


def _exact_costs(ctx: Context, rows: Rows, classes: int, inputs: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The exact routes' costs per point in pullbacks per copy, float64 [P] each (inf where a route
    does not apply, or another is forced): direct, head, forward; and the features each row
    holds alive (bool [R, d]) where the head route applies, else None."""
    forced = ctx.gradients
    direct_cost = torch.full((rows.points,), float(classes - 1), dtype=torch.float64, device=rows.logits.device)
    head_cost = torch.full_like(direct_cost, math.inf)
    alive = None
    if ctx.head is not None and (ctx.head.in_features + 1 < classes - 1 or forced == "head"):
        alive = rows.features != 0  # [R, d]: features held at exactly 0 have zero Jacobian rows (checked)
        head_cost = per_point_max(rows, alive.sum(1).double()) + 1
    forward_cost = torch.full_like(direct_cost, math.inf)
    if (inputs < classes - 1 and math.isfinite(ctx.jvp)) or forced == "forward":
        forward_cost.fill_(inputs * ctx.jvp)
    if forced in ("direct", "head", "forward"):
        keep = {"direct": direct_cost, "head": head_cost, "forward": forward_cost}[forced]
        if forced == "head" and ctx.head is None:
            raise OptionError(
                "'head' needs a model whose logits come from an nn.Linear head; none was found", field="gradients"
            )
        for cost in (direct_cost, head_cost, forward_cost):
            if cost is not keep:
                cost.fill_(math.inf)
    return direct_cost, head_cost, forward_cost, alive


def _pad_width(normal: Tensor, width: int) -> Tensor:
    if normal.shape[1] == width:
        return normal
    return torch.cat([normal, normal.new_zeros(normal.shape[0], width - normal.shape[1], *normal.shape[2:])], dim=1)


def _cat_pruned(parts: list[Routed], width: int) -> Pruned:
    """The groups' selections as one, their classes padded (with each point's target) to ``width``."""
    kept = [p.kept for p in parts]
    assert all(k is not None for k in kept)
    return Pruned(
        classes=torch.cat([pad_to(k.classes, p.target, width) for p, k in zip(parts, kept) if k is not None]),
        kept=torch.cat([k.kept for k in kept if k is not None]),
        z_lower=torch.cat([k.z_lower for k in kept if k is not None]),
        bound=torch.cat([k.bound for k in kept if k is not None]),
        reserved=max(k.reserved for k in kept if k is not None),
    )
