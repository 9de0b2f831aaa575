"""Which margin gradients Taylor and MMSE compute for each point, chosen from counts.

Every boundary's gradient u_i = grad (f_t - f_i) costs one backward pass per point (and per
noisy copy for MMSE): C - 1 of them. At many classes most boundaries cannot matter to p (a
boundary at z noise standard deviations changes p by at most Phi(-z)), and where the logits
come from a linear head of d < C - 1 features, d passes give every gradient. Each point takes
the cheapest of these routes, costs counted in backward passes of one row, from counts and the
declared cost of a forward-mode probe (:mod:`probust.execution.cost_model`), never from a clock:

- **direct**: every boundary's gradient, one pullback each (C - 1).
- **head**: the rows of the features' Jacobian J that are not held at exactly 0 (plus one
  check pass), through the linear head (:mod:`probust.linear_head`): every u_i = (W_t - W_i) J.
- **forward**: forward mode, one Jacobian-vector product per input coordinate (D < C - 1).
- **candidates**: a screening bounds every boundary's z from below; only the boundaries whose
  tails do not fit the pruning budget get an exact gradient.

Two screenings, run only where they cost together at most the declared share of the cheapest
route (:data:`probust.execution.cost_model.SCREENING_SHARE`, per device kind; so that unlucky
screenings cost at most that much more than not screening), the first at most :data:`RHO` of it
alone:

1. **spectral**: up to :data:`SPECTRAL_PROBES` random cotangents on the features, pulled back
   on the same forward pass, bound the top eigenvalue of the features' covariance (by their Gram
   matrix's top eigenvalue) and with it every boundary's variance
   (:func:`probust.estimators.pruning.spectral_z_lower`). Whether it runs is decided per model
   and class count, so all points of a pass share it; its probes come in the device kind's
   stages (:data:`probust.execution.cost_model.SPECTRAL_STAGES`: 4, then 8 on a CPU), the second
   only on the points where the most 8 probes could give would drop more boundaries than the
   4 more probes cost.
2. **sketch**: forward-mode probes bound each boundary's variance separately
   (:func:`probust.estimators.pruning.sketch_z_lower`), in the stages of
   :data:`probust.estimators.pruning.SKETCH_STAGES` (8, 16, then 32 probes); decided per point,
   where its probes (every stage's) and the first screening's together cost at most that share
   of the best route after the first screening, and then per stage, where the stage's new
   probes cost fewer pulls than the candidates the stages before left.

The dropped boundaries' tails and the screenings' failure probabilities are added to
``cdf_error`` (:mod:`probust.estimators.pruning`). A point's route depends only on the point
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

from probust import _rng, gradients, linear_head
from probust._checks import check_choice, check_logits, check_target
from probust._memory_format import to_format, weights_in_format
from probust._segments import add_rows
from probust.errors import OptionError, Part, Setting
from probust.estimators import pruning
from probust.estimators.base import noise_words
from probust.estimators.result import ROUTE_NAMES as ROUTE_NAMES  # re-exported: where the routes are
from probust.execution import JacobianPlan
from probust.gradients import (
    Pullback,
    Strategy,
    features_and_logits,
    margin_jacobian,
    margin_sketch,
    margins,
    other_classes,
)
from probust.noise import Noise

#: The most reverse-mode probes of the spectral screening (its last stage's, on every device kind:
#: :data:`probust.execution.cost_model.SPECTRAL_STAGES`).
SPECTRAL_PROBES = 8
#: The spectral screening runs only where its cost is at most this share of the cheapest exact route.
RHO = 0.1

#: Indices into :data:`ROUTE_NAMES`, the routes a point can take, as recorded in ``Estimate.route``.
DIRECT, HEAD, FORWARD, CANDIDATES = 0, 1, 2, 3
#: The ``gradients`` setting of Taylor and MMSE, where the exact margin gradients come from: "auto"
#: chooses per point by counted cost; the others are routes of :data:`ROUTE_NAMES`, forced on
#: every point (with no screening: they give every boundary's gradient). The screenings are the
#: ``prune`` setting's (:data:`probust.estimators.pruning.PRUNE_CHOICES`).
GRADIENTS = ("auto", "direct", "head", "forward")
#: The Taylor/MMSE settings that force each route on every point (to compare them): an exact
#: source (``gradients``), or a screening then its candidates (``prune``); "auto": neither.
FORCING: dict[str, dict[str, str]] = {
    "auto": {},
    **{source: {"gradients": source} for source in GRADIENTS[1:]},
    **{screening: {"prune": screening} for screening in pruning.SCREENINGS},
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
    """Check Taylor's and MMSE's ``prune`` (:data:`probust.estimators.pruning.PRUNE_CHOICES`) and
    ``gradients`` (:data:`GRADIENTS`) and what they are combined with; the one check, run by the
    estimators and by the runner before any work (which names its settings the same).

    Raises:
        OptionError: a value not offered, or a forced screening or source that cannot apply
            (``field`` "prune" or "gradients"; the message names the setting in the way).
    """
    check_choice(prune, pruning.PRUNE_CHOICES, "prune")
    check_choice(gradients, GRADIENTS, "gradients")
    if prune in pruning.SCREENINGS:
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
        plan: rows per pass, strategy (:class:`probust.gradients.Strategy`), format.
        noise: Gaussian or not (the covariance S of the variances).
        tol: the mvn-cdf's tolerance (pruning shares of it).
        seed: the estimator's seed (probes' random streams).
        prune: whether boundaries may be dropped (mvn-cdf under Gaussian noise); otherwise every
            boundary's gradient is computed, by the cheapest exact route.
        jvp: a forward-mode probe in pulls (:func:`probust.execution.cost_model.jvp_in_pulls`);
            inf where forward mode was found not to run through the model. Where it was not
            probed yet, a point whose route wants the sketch probes it first
            (:func:`probust.gradients.forward_mode_runs`).
        share: the screenings' share of the best route
            (:func:`probust.execution.cost_model.screening_share`).
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
            (:func:`probust.execution.cost_model.spectral_stages` of the device kind).
        every_boundary: every pull is every boundary's (C - 1 cotangents, no head, no
            screening), so its width never depends on the other rows: vmap takes them in the
            plan's class chunks, unpadded, as the plan was timed (:func:`timed_pulls`).
            Otherwise pulls are padded to :data:`probust.gradients.VMAP_STEP` cotangents, so
            that a pull's shape, and its rounding, does not depend on what the other points of
            its pass need.
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

    @property
    def pull(self) -> Strategy:
        """How the pulls run: by the plan's loop or vmap, whichever was timed faster on them
        (:func:`timed_pulls`; speed and rounding only); a forward-mode plan pulls by the loop."""
        return Strategy.LOOP if self.plan.strategy.whole_jacobian else self.plan.strategy


class Routed(NamedTuple):
    """The linearisation of a chunk of points by :func:`linearise`.

    Attributes:
        target: int64 [P].
        margin: [P, C], c_i averaged over the copies (0 at the target).
        kept: with ``prune``: which boundaries the mvn-cdf sees (:class:`pruning.Pruned`), else None.
        normal: with ``prune``: [P, K, *S], the kept boundaries' u in the order of
            ``kept.classes`` (0 on padding); else [P, C, *S], every u_i (0 at the target).
        route: int64 [P], each point's route (index into :data:`ROUTE_NAMES`).
        logits: [P, N, C], the model's logits on each point's copies (detached): the model's
            verdict on MMSE's own copies, which its trust check needs, without another pass.
    """

    target: Tensor
    margin: Tensor
    kept: pruning.Pruned | None
    normal: Tensor
    route: Tensor
    logits: Tensor


def spectral_pays(ctx: Context, classes: int, inputs: int) -> bool:
    """Whether the spectral screening runs: its probes cost at most RHO of the cheapest reverse-mode
    route that gives every gradient (a property of the model and the class count, not of the
    points; the forward route then competes with its candidates point by point)."""
    if ctx.gradients != "auto" or ctx.screening != "auto":
        return ctx.screening == "spectral"
    return ctx.prune and SPECTRAL_PROBES <= RHO * static_exact(ctx.head, classes, inputs, math.inf)


def static_exact(head: nn.Linear | None, classes: int, inputs: int, jvp: float) -> float:
    """Pullbacks per row of the cheapest route that computes every gradient, before seeing a point
    (the head's every feature alive; forward mode at ``jvp`` pulls per probe, inf: not available)."""
    options = [float(classes - 1)]
    if head is not None and head.in_features + 1 < classes - 1:
        options.append(head.in_features + 1.0)
    if inputs < classes - 1:
        options.append(inputs * jvp)
    return min(options)


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


class _Rows:
    """The rows of a group of points (N copies each) and the pullbacks of cotangents on them.

    Where the rows fit one pass, its graph is kept and every pull reuses it; otherwise each
    pull runs the forward passes again, block by block (MMSE with more copies than a pass holds),
    unless the context is differentiable: then every block's graph is kept, as its result needs.
    """

    def __init__(self, ctx: Context, copies: Tensor) -> None:
        self.ctx = ctx
        self.points, self.n = copies.shape[:2]
        self.rows = copies.reshape(self.points * self.n, *copies.shape[2:])
        self.row_point = torch.arange(self.points, device=copies.device).repeat_interleave(self.n)
        # MMSE's copies of a point may outnumber the pull rows, which are sized for the widest
        # pull: where their graph fits, one forward pass serves every pull (no pass per block).
        rows = max(ctx.pull_rows, ctx.graph_rows)
        self.blocks = [slice(i, i + rows) for i in range(0, len(self.rows), rows)]
        self._kept: list[Pullback] = []
        if len(self.blocks) == 1 or ctx.differentiable:
            self._kept = [self._pullback(block) for block in self.blocks]
            self.logits = _cat([kept.logits for kept in self._kept])
            self.features = _cat([kept.features for kept in self._kept])
        else:
            run = features_and_logits(ctx.model, ctx.head)
            outs = []
            with torch.no_grad():
                for block in self.blocks:
                    outs.append(run(to_format(self.rows[block], ctx.plan.channels_last)))
            self.features = torch.cat([f for f, _ in outs])
            self.logits = torch.cat([g for _, g in outs])

    def _pullback(self, block: slice) -> Pullback:
        rows = to_format(self.rows[block], self.ctx.plan.channels_last)
        return Pullback(
            self.ctx.model, rows, self.ctx.head, strategy=self.ctx.pull, differentiable=self.ctx.differentiable
        )

    def pull(self, cotangents: Tensor) -> Tensor:
        """Input gradients [R, K, *S] of cotangents [K, R, F] on the rows' features."""
        if self._kept:
            return _cat(
                [self._pull(pullback, cotangents[:, block]) for pullback, block in zip(self._kept, self.blocks)]
            )
        # One block's graph alive at a time: each pull runs its forward pass again.
        return torch.cat([self._pull(self._pullback(block), cotangents[:, block]) for block in self.blocks])

    def _pull(self, pullback: Pullback, cotangents: Tensor) -> Tensor:
        if self.ctx.every_boundary:
            return pullback.pull(cotangents, chunk_size=self.ctx.plan.class_chunk, pad=False)
        return pullback.pull(cotangents)

    def average(self, per_row: Tensor) -> Tensor:
        """[P, ...]: the mean of [R, ...] over each point's copies."""
        if self.n == 1:
            return per_row
        return add_rows(per_row.new_zeros(self.points, *per_row.shape[1:]), self.row_point, per_row) / self.n


def _cat(parts: list[Tensor]) -> Tensor:
    """The parts concatenated along rows (one part as it is: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _linearise_group(ctx: Context, copies: Tensor, target: Tensor | None, indices: Tensor) -> Routed:
    points, n = copies.shape[:2]
    rows = _Rows(ctx, copies)
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

    # The exact routes' costs in pullbacks per copy (inf where a route does not apply).
    forced = ctx.gradients
    direct_cost = torch.full((points,), float(classes - 1), dtype=torch.float64, device=c.device)
    head_cost = torch.full_like(direct_cost, math.inf)
    alive = None
    if ctx.head is not None and (ctx.head.in_features + 1 < classes - 1 or forced == "head"):
        alive = rows.features != 0  # [R, d]: features held at exactly 0 have zero Jacobian rows (checked)
        head_cost = _per_point_max(rows, alive.sum(1).double()) + 1
    forward_cost = torch.full_like(direct_cost, math.inf)
    jvp = ctx.jvp
    if (inputs < classes - 1 and math.isfinite(jvp)) or forced == "forward":
        forward_cost.fill_(inputs * jvp)
    if forced in ("direct", "head", "forward"):
        keep = {"direct": direct_cost, "head": head_cost, "forward": forward_cost}[forced]
        if forced == "head" and ctx.head is None:
            raise OptionError(
                "'head' needs a model whose logits come from an nn.Linear head; none was found", field="gradients"
            )
        for cost in (direct_cost, head_cost, forward_cost):
            if cost is not keep:
                cost.fill_(math.inf)
    exact_cost = torch.minimum(torch.minimum(direct_cost, head_cost), forward_cost)

    # Screenings: lower bounds on every boundary's z, failing with probability delta per point.
    budget, share = pruning.shares(ctx.tol)
    z_screen = torch.full((points, classes), -math.inf, dtype=torch.float64, device=c.device)
    delta = torch.zeros(points, dtype=torch.float64, device=c.device)
    candidates_cost = torch.full_like(direct_cost, math.inf)
    screened: pruning.Pruned | None = None
    spent: Tensor | float = 0.0
    if spectral_pays(ctx, classes, inputs):
        z_screen, spent = _spectral(ctx, rows, c, target, indices)
        delta += share
        screened = pruning.drop(z_screen, target, budget=budget, delta=delta)
        candidates_cost = screened.kept.double()
    screening = ctx.screening
    if screening == "sketch" or (forced == screening == "auto" and ctx.prune and math.isfinite(jvp)):
        screened, candidates_cost = _staged_sketch(
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

    grads = _Exact(ctx, rows, c, target, route, screened, alive, copies)
    if not ctx.prune:
        return Routed(target, c, None, grads.all_normals(), route, copy_logits)
    exact = grads.exact.clone()
    exact.scatter_(1, target[:, None], False)
    z = torch.where(exact, pruning.exact_z(c, grads.variance), z_screen)
    # What no gradient was computed for must be dropped: the screening fitted its tails in the budget.
    unknown = ~exact
    unknown.scatter_(1, target[:, None], False)
    kept = pruning.drop(z, target, budget=budget, delta=delta, forced=unknown, reserved=budget + 2 * share)
    return Routed(target, c, kept, grads.kept_normals(kept.classes), route, copy_logits)


class _Exact:
    """The exact margin gradients of a group of points, each by its route.

    One pull serves the direct and candidate routes (their boundaries' cotangents) and the head
    route (basis vectors of the alive features, and one check of the dead ones); the forward
    route runs forward mode on its points' copies.

    Attributes:
        exact: bool [P, C], the boundaries whose exact variance is known (only where the context
            prunes: nothing reads it otherwise, so no variance is computed).
        variance: float64 [P, C], u_i S u_i^T where ``exact``.
    """

    def __init__(
        self,
        ctx: Context,
        rows: _Rows,
        c: Tensor,
        target: Tensor,
        route: Tensor,
        screened: pruning.Pruned | None,
        alive: Tensor | None,
        copies: Tensor,
    ) -> None:
        points, classes = c.shape
        self.ctx, self.target, self.classes = ctx, target, classes
        self.exact = torch.zeros(points, classes, dtype=torch.bool, device=c.device)
        self.variance = torch.zeros(points, classes, dtype=torch.float64, device=c.device)
        self.list_points = ((route == DIRECT) | (route == CANDIDATES)).nonzero().flatten()
        self.head_points = (route == HEAD).nonzero().flatten()
        self.forward_points = (route == FORWARD).nonzero().flatten()
        self.shape = copies.shape[2:]

        # The listed boundaries of each list-route point: all others, or the screening's candidates.
        listed = target[:, None].expand(-1, 1)
        count = 0
        if len(self.list_points):
            direct = route[self.list_points] == DIRECT
            candidates = screened.classes[self.list_points] if screened is not None else target[self.list_points, None]
            width = classes - 1 if bool(direct.any()) else candidates.shape[1]
            others = other_classes(target[self.list_points], classes)[:, :width]
            listed_here = torch.where(direct[:, None], others, _pad_to(candidates, target[self.list_points], width))
            listed = target[:, None].expand(-1, width).clone()
            listed[self.list_points] = listed_here
            count = int((listed_here != target[self.list_points, None]).sum(1).max())
            listed = listed[:, : max(count, 1)]
        self.listed = listed  # [P, L], padded with the target
        # Nothing listed (every candidate screened out): no pull of padding alone.
        list_width = count if len(self.list_points) else 0

        row_route = route[rows.row_point]
        head_rows = row_route == HEAD
        order = count_alive = None
        width = list_width
        if len(self.head_points):
            assert alive is not None
            order = torch.argsort((~alive).to(torch.int8), dim=1, stable=True)  # [R, d], alive first
            count_alive = alive.sum(1)
            width = max(width, int(count_alive[head_rows].max()) + 1)  # + one check of the dead ones

        self.u_listed: Tensor | None = None
        self.jacobian: Tensor | None = None
        if width > 0:
            features = rows.features
            cot = torch.zeros(width, rows.rows.shape[0], features.shape[1], dtype=features.dtype, device=c.device)
            if list_width:
                list_rows = (row_route == DIRECT) | (row_route == CANDIDATES)
                row_cot = _boundary_cotangents(target[rows.row_point], listed[rows.row_point], ctx.head, classes)
                cot[:list_width] = torch.where(list_rows[:, None, None], row_cot, 0.0).transpose(0, 1)
            if alive is not None and order is not None and count_alive is not None:
                cot += _basis_cotangents(features, alive, order, count_alive, head_rows, width)
            grads = rows.pull(cot)  # [R, width, *S]
            if list_width:
                u = rows.average(grads[:, :list_width])[self.list_points]
                self.u_listed = u
                if ctx.prune:
                    var = ctx.noise.quadratic_form(u).diagonal(dim1=1, dim2=2)
                    mark = listed[self.list_points] != target[self.list_points, None]
                    self._record(self.list_points, listed[self.list_points], var, mark)
            if alive is not None and order is not None and count_alive is not None:
                self.jacobian = _head_jacobian(rows, grads, alive, order, count_alive, head_rows)[self.head_points]
            if self.jacobian is not None and ctx.prune:
                form = ctx.noise.quadratic_form(self.jacobian)  # [H, d, d]
                assert ctx.head is not None  # the head route needs one
                var = linear_head.boundary_variances(
                    linear_head.boundary_weights(ctx.head, target[self.head_points]), form
                )
                self.exact[self.head_points] = True
                self.variance[self.head_points] = var
        self.u_forward: Tensor | None = None
        if len(self.forward_points):
            self.u_forward = _forward_normals(ctx, copies[self.forward_points], target[self.forward_points])
            if ctx.prune:
                self.exact[self.forward_points] = True
                self.variance[self.forward_points] = ctx.noise.quadratic_form(self.u_forward).diagonal(dim1=1, dim2=2)

    def _record(self, which: Tensor, classes: Tensor, variance: Tensor, mark: Tensor) -> None:
        exact = self.exact[which]
        var = self.variance[which]
        exact.scatter_(1, classes, mark | exact.gather(1, classes))
        var.scatter_(1, classes, torch.where(mark, variance, var.gather(1, classes)))
        self.exact[which] = exact
        self.variance[which] = var

    def kept_normals(self, kept: Tensor) -> Tensor:
        """u [P, K, *S] of the boundaries ``kept`` [P, K] (each computed exactly; the target: 0)."""
        points, width = kept.shape
        some = (
            self.u_listed
            if self.u_listed is not None
            else self.jacobian
            if self.jacobian is not None
            else self.u_forward
        )
        assert some is not None or bool((kept == self.target[:, None]).all())
        dtype = some.dtype if some is not None else torch.float32
        out = torch.zeros(points, width, *self.shape, dtype=dtype, device=kept.device)
        if self.u_listed is not None:
            listed = self.listed[self.list_points]
            position = torch.zeros(len(self.list_points), self.classes, dtype=torch.int64, device=kept.device)
            position.scatter_(1, listed, torch.arange(listed.shape[1], device=kept.device).expand_as(listed))
            # Every kept class was listed; the padding (the target) gets a zero gradient.
            here = kept[self.list_points]
            u = self.u_listed.gather(1, _expand(position.gather(1, here), self.u_listed))
            padding = here == self.target[self.list_points, None]
            out[self.list_points] = torch.where(_expand(padding, u), 0.0, u)
        if self.jacobian is not None:
            assert self.ctx.head is not None
            a = linear_head.boundary_weights(self.ctx.head, self.target[self.head_points], kept[self.head_points])
            out[self.head_points] = linear_head.margin_normals(a, self.jacobian)
        if self.u_forward is not None:
            out[self.forward_points] = self.u_forward.gather(1, _expand(kept[self.forward_points], self.u_forward))
        return out

    def all_normals(self) -> Tensor:
        """u [P, C, *S] of every boundary (0 at the target): the routes without pruning."""
        every = torch.arange(self.classes, device=self.target.device).expand(len(self.target), -1)
        return self.kept_normals(every)


def _per_point_max(rows: _Rows, per_row: Tensor) -> Tensor:
    out = torch.zeros(rows.points, dtype=per_row.dtype, device=per_row.device)
    return out.scatter_reduce(0, rows.row_point, per_row, reduce="amax", include_self=False)


def _pad_to(classes: Tensor, target: Tensor, width: int) -> Tensor:
    """classes [P, K] cut or padded (with each point's target) to [P, width]."""
    if classes.shape[1] >= width:
        return classes[:, :width]
    return torch.cat([classes, target[:, None].expand(-1, width - classes.shape[1])], dim=1)


def _boundary_cotangents(target: Tensor, classes: Tensor, head: nn.Linear | None, count: int) -> Tensor:
    """[R, K, F]: the cotangents on the features of boundaries ``classes`` [R, K] of rows with
    targets [R]: W_t - W_i through a head, e_t - e_i on the logits (0 where i is the target)."""
    if head is not None:
        return linear_head.boundary_weights(head, target, classes)
    eye = torch.eye(count, device=target.device)
    return eye[target][:, None] - eye[classes]


def _basis_cotangents(
    features: Tensor, alive: Tensor, order: Tensor, count: Tensor, head_rows: Tensor, width: int
) -> Tensor:
    """[width, R, d]: for the head route's rows, e_k for each alive feature k (in ``order``),
    then one random combination of the dead features (its pullback must be exactly 0)."""
    rows, d = features.shape
    cot = torch.zeros(width, rows, d, dtype=features.dtype, device=features.device)
    slots = torch.arange(width, device=features.device)[:, None]
    used = (slots < count[None]) & head_rows[None]  # [width, R]
    index = order.T[: min(width, d)]
    cot[: index.shape[0]].scatter_(2, index[..., None], used[: index.shape[0], :, None].to(features.dtype))
    weights = torch.randn(rows, d, generator=torch.Generator().manual_seed(0), dtype=features.dtype).to(features.device)
    check = torch.where(alive, 0.0, weights) * head_rows[:, None]
    cot[count.clamp_max(width - 1), torch.arange(rows, device=features.device)] += torch.where(
        head_rows[:, None] & (count[:, None] < width), check, 0.0
    )
    return cot


def _head_jacobian(
    rows: _Rows, grads: Tensor, alive: Tensor, order: Tensor, count: Tensor, head_rows: Tensor
) -> Tensor:
    """J [P, d, *S] averaged over copies, from the pulled basis rows (zeros for other routes);
    rows whose dead features fail the check get every dead row pulled back as well."""
    n_rows, d = alive.shape
    width = grads.shape[1]
    flat = grads.flatten(2)  # [R, width, D]
    check = flat[torch.arange(n_rows, device=flat.device), count.clamp_max(width - 1)]
    failed = head_rows & ~alive.all(1) & (check != 0).any(1)
    jacobian = flat.new_zeros(n_rows, d, flat.shape[2])
    slots = min(width, d)
    used = (torch.arange(slots, device=flat.device)[None] < count[:, None]) & head_rows[:, None]
    index = order[:, :slots]
    jacobian.scatter_add_(
        1, index[..., None].expand(-1, -1, flat.shape[2]), torch.where(used[..., None], flat[:, :slots], 0.0)
    )
    if bool(failed.any()):
        # A feature at 0 whose Jacobian row is not 0 (e.g. no ReLU before the head): pull every dead row.
        dead = ~alive & failed[:, None]
        dead_count = dead.sum(1)
        dead_order = torch.argsort((~dead).to(torch.int8), dim=1, stable=True)
        extra_width = int(dead_count.max())
        cot = _basis_cotangents(rows.features, ~dead, dead_order, dead_count, failed, extra_width + 1)
        # _basis_cotangents adds a check slot for rows' "dead" (here: the not-failed) features: cleared.
        cot = cot * (torch.arange(extra_width + 1, device=flat.device)[:, None] < dead_count[None])[..., None]
        more = rows.pull(cot).flatten(2)
        used = torch.arange(extra_width + 1, device=flat.device)[None] < dead_count[:, None]
        index = dead_order[:, : extra_width + 1].clamp_max(d - 1)
        jacobian.scatter_add_(
            1, index[..., None].expand(-1, -1, more.shape[2]), torch.where(used[..., None], more, 0.0)
        )
    return rows.average(jacobian).view(rows.points, d, *grads.shape[2:])


def _expand(index: Tensor, like: Tensor) -> Tensor:
    return index.view(*index.shape, *([1] * (like.ndim - 2))).expand(*index.shape, *like.shape[2:])


def _spectral(ctx: Context, rows: _Rows, c: Tensor, target: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """The spectral screening in ``ctx.spectral_stages``: (lower bounds on z [P, C]
    (:func:`pruning.spectral_z_lower`), the probes each point pulled, float64 [P]).

    Stage s bounds every z from the point's first ``spectral_stages[s]`` probes (a function of
    the seed, the point and its index, whichever stage pulls them) at its part of the
    screening's failure share (:func:`pruning.spectral_stage_failure`; the caller counts the
    whole share). A later stage runs on a point only where the most its probes could give
    (:func:`pruning.spectral_z_best`) would drop more boundaries than it pulls probes: the far
    boundaries of a point already dropped, or out of any such bound's reach, cost no more probes.
    The decision reads the point's own bounds alone, so it does not depend on its batch.
    """
    features = rows.features
    stages = ctx.spectral_stages
    keys = _rng.point_keys(ctx.seed, indices, _rng.STREAM_SCREEN)
    probes = _rng.normal(keys, 0, stages[-1], features.shape[1], dtype=features.dtype)  # [P, m, F]
    if ctx.head is not None:
        scale = linear_head.boundary_norms_squared(ctx.head, target)
    else:
        scale = torch.full_like(c, 2.0, dtype=torch.float64)
    budget, share = pruning.shares(ctx.tol)
    z = torch.full_like(c, -math.inf, dtype=torch.float64)
    run = torch.ones(len(target), dtype=torch.bool, device=c.device)
    pulled = torch.zeros(len(target), 0, *rows.rows.shape[1:], dtype=rows.rows.dtype, device=c.device)
    used = torch.zeros(len(target), dtype=torch.float64, device=c.device)
    done, failure = 0, 0.0
    for stage, count in enumerate(stages):
        stage_failure = pruning.spectral_stage_failure(share, stage, len(stages))
        if stage:
            best = pruning.spectral_z_best(z, done, failure, count, stage_failure)
            gain = pruning.kept_count(z, target, budget) - pruning.kept_count(best, target, budget)
            run = run & ((count - done) < gain)
            if not bool(run.any()):
                break
        new = rows.average(rows.pull(probes[rows.row_point, done:count].transpose(0, 1)))  # [P, k, *S]
        pulled = torch.cat([pulled, new], dim=1)
        z_stage = pruning.spectral_z_lower(c, scale, ctx.noise.quadratic_form(pulled), stage_failure)
        z = torch.where(run[:, None], torch.maximum(z, z_stage), z)
        used = torch.where(run, float(count), used)
        done, failure = count, stage_failure
    return z, used


def _staged_sketch(
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
    screened: pruning.Pruned | None,
) -> tuple[pruning.Pruned | None, Tensor]:
    """The forward-mode sketch in :data:`pruning.SKETCH_STAGES`, each stage on the points whose
    counts say it pays: (the screening's selection, each point's candidates cost in pulls).

    Stage s bounds every z from the point's first SKETCH_STAGES[s] probes (the earlier stages'
    and its new ones, :func:`pruning.sketch_z_lower`), failing with its part of the sketch's
    failure share (:func:`pruning.stage_failure`): the bounds of all stages hold together but
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
    budget, failure = pruning.shares(ctx.tol)
    # The points whose whole sketch, every stage, fits the share: its worst case.
    ran = torch.ones(points, dtype=torch.bool, device=c.device)
    if not forced:
        ran = spent + pruning.PROBES * ctx.jvp <= ctx.share * torch.minimum(exact_cost, candidates_cost)
        if bool(ran.any()) and not gradients.forward_mode_runs(ctx.model, copies[:, 0]):
            return screened, candidates_cost  # a fact about the model (untimed), the same for every point
    done = 0
    before: Tensor | None = None  # the last stage's points
    derivatives = c.new_zeros(0)  # their derivatives along its probes, [W, done, C]
    for stage, probes in enumerate(pruning.SKETCH_STAGES):
        run = ran & ((probes - done) * ctx.jvp < candidates_cost)
        if not bool(run.any()):
            break
        which = run.nonzero().flatten()
        new = _sketch(ctx, copies[which], target[which], indices[which], done, probes)
        if before is not None:  # a stage's points all ran the one before
            new = torch.cat([derivatives[torch.searchsorted(before, which)], new], dim=1)
        before, derivatives = which, new
        z_stage = pruning.sketch_z_lower(c[which], derivatives, pruning.stage_failure(failure, stage))
        z_screen[which] = torch.maximum(z_screen[which], z_stage)
        if stage == 0:
            # The whole sketch's share, whichever later stages run: whether they run depends on
            # the first stage's bounds, so only the union over every stage is a probability
            # that holds whatever the point stops at.
            delta[which] += failure
        screened = pruning.drop(z_screen, target, budget=budget, delta=delta)
        candidates_cost = torch.where(run, screened.kept.double(), candidates_cost)
        ran, done = run, probes
    return screened, candidates_cost


def _sketch(ctx: Context, copies: Tensor, target: Tensor, indices: Tensor, first: int, stop: int) -> Tensor:
    """float64 [P', stop - first, C]: the margins' derivatives along the points' forward-mode probes
    ``first``..``stop - 1`` (:func:`probust.gradients.margin_sketch`; each probe a function of
    the seed, the point and its index, whichever stage draws it)."""
    keys = _rng.point_keys(ctx.seed, indices, _rng.STREAM_PRUNE)
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


def _forward_normals(ctx: Context, copies: Tensor, target: Tensor) -> Tensor:
    """Every u [P', C, *S] by forward mode, averaged over each point's copies."""
    points, n = copies.shape[:2]
    rows = copies.reshape(points * n, *copies.shape[2:])
    row_target = target.repeat_interleave(n)
    parts = [
        _forward_block(
            ctx.model,
            ctx.plan,
            rows[first : first + ctx.plan.rows],
            row_target[first : first + ctx.plan.rows],
            differentiable=ctx.differentiable,
        )
        for first in range(0, len(rows), ctx.plan.rows)
    ]
    u = torch.cat(parts)
    return u.view(points, n, *u.shape[1:]).mean(1) if n > 1 else u


def _forward_block(
    model: nn.Module,
    plan: JacobianPlan,
    rows: Tensor,
    target: Tensor | None,
    *,
    fallback: bool = True,
    differentiable: bool = False,
) -> Tensor:
    """u [R, C, *S] of one pass of rows by forward mode (the forward route), in the plan's format
    and tangent chunks; ``target`` None: each row's prediction; ``fallback`` and
    ``differentiable`` as in :func:`probust.gradients.margin_jacobian`."""
    return margin_jacobian(
        model,
        to_format(rows, plan.channels_last),
        target,
        strategy=Strategy.FORWARD,
        class_chunk_size=plan.class_chunk,
        fallback=fallback,
        differentiable=differentiable,
    )[2]


def timed_pulls(
    model: nn.Module,
    head: nn.Linear | None,
    plan: JacobianPlan,
    rows: Tensor,
    count: int,
    *,
    every_boundary: bool = False,
) -> Tensor:
    """What the routes' plan is timed on (:meth:`probust.execution.Execution.jacobian_plan`): their own
    work on ``rows`` [R, *S] under ``plan``, the weights and rows in its memory format.

    A loop or vmap plan: one :class:`probust.gradients.Pullback` pass (as :class:`_Rows` runs it) and
    a pull of ``count`` boundary cotangents on its features, as :class:`_Rows` pulls them: padded to
    :data:`probust.gradients.VMAP_STEP` as the routes' narrow pulls are, or, for a context that
    takes ``every_boundary``, in the plan's class chunks unpadded. A forward-mode plan: the forward
    route's pass (every margin's gradient). Where torch.func cannot run the plan's strategy through
    the model, torch's error propagates (the plan's measuring skips that strategy).
    """
    with weights_in_format(model, plan.channels_last):
        if plan.strategy.whole_jacobian:
            return _forward_block(model, plan, rows, None, fallback=False)
        pullback = Pullback(model, to_format(rows, plan.channels_last), head, strategy=plan.strategy, fallback=False)
        target = pullback.logits.argmax(1)
        classes = other_classes(target, pullback.logits.shape[1])[:, :count]
        cotangents = _boundary_cotangents(target, classes, head, pullback.logits.shape[1]).transpose(0, 1)
        if every_boundary:
            return pullback.pull(cotangents, chunk_size=plan.class_chunk, pad=False)
        return pullback.pull(cotangents)


def _pad_width(normal: Tensor, width: int) -> Tensor:
    if normal.shape[1] == width:
        return normal
    return torch.cat([normal, normal.new_zeros(normal.shape[0], width - normal.shape[1], *normal.shape[2:])], dim=1)


def _cat_pruned(parts: list[Routed], width: int) -> pruning.Pruned:
    """The groups' selections as one, their classes padded (with each point's target) to ``width``."""
    kept = [p.kept for p in parts]
    assert all(k is not None for k in kept)
    return pruning.Pruned(
        classes=torch.cat([_pad_to(k.classes, p.target, width) for p, k in zip(parts, kept) if k is not None]),
        kept=torch.cat([k.kept for k in kept if k is not None]),
        z_lower=torch.cat([k.z_lower for k in kept if k is not None]),
        bound=torch.cat([k.bound for k in kept if k is not None]),
        reserved=max(k.reserved for k in kept if k is not None),
    )
