"""Taylor and MMSE: linearise the C-1 margins, then map their z-scores to a probability.

Both take, per point, the margins c_i and the boundary normals u_i of their linearisation by
one path, :func:`probust.linearisation.routes.linearise` (every boundary's where nothing is pruned:
the Monte Carlo variants mc_cv and mc_is reuse it, :meth:`Linearised.linearise`), then
p = Phi_{U S U^T}(z) (mvn-cdf) or the mv-sigmoid of z.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from probust import linearisation
from probust._checks import check_choice, check_fraction, check_positive_float
from probust._progress import progress, ramp, shown
from probust._user_model import structure_token, to_format, weights_in_format
from probust.errors import OptionError
from probust.estimators import maps, route_plan, trust
from probust.estimators.base import Estimator, noise_words
from probust.estimators.result import Estimate
from probust.execution import ForwardPlan, resolve_budget
from probust.mvn import DEFAULT_TOL
from probust.noise import STREAM_TRUST, Noise, as_noise, point_keys

CDFS = ("mvn", "mv-sigmoid")
#: A kept call plan serves a later call whose memory budget is within this ratio of its own.
_BUDGET_BAND = (0.8, 1.25)


class Linearisation(NamedTuple):
    """The linearised margins of a chunk of points.

    Attributes:
        target: int64 [B], the class whose survival is measured.
        margin: [B, C], c_i (0 at the target), in the model's dtype.
        normal: [B, C, *S], u_i, the gradient of the linearised margin g_i (0 at the target).
    """

    target: Tensor
    margin: Tensor
    normal: Tensor


class _CallPlan(NamedTuple):
    """What one call runs, asked of execution once, before its maths: the loop over chunks
    then only applies it (no timing, no plan cache, no budget).

    Attributes:
        chunk: points linearised together (:meth:`Linearised.points_per_chunk`).
        routes: how the margin gradients are taken (:meth:`Linearised.route_context`).
        check: the trust check's forward passes on fresh draws, sized for a whole chunk; None
            where no fresh draw is checked (``check_draws=0``, or MMSE's own copies).
        clean_rows: rows per clean forward pass (MMSE's targets).
    """

    chunk: int
    routes: linearisation.Context
    check: ForwardPlan | None
    clean_rows: int


class _Problem(NamedTuple):
    """The mvn problem of a group of points.

    Attributes:
        columns: int64 [n, K], each column's class (the target's column, and padding, hold the target).
        normal: [n, K, *S], u in column order (0 at the target's column and on padding).
        std: its standardised form (z [n, K], correlations of the columns other than the target's).
    """

    columns: Tensor
    normal: Tensor
    std: maps.Standardised


def _checked(points: Tensor, problem: _Problem, margin: Tensor) -> trust.Checked:
    """What the trust check reads of the group ``points`` of a chunk whose mvn problem is ``problem``."""
    assert problem.std.scale is not None  # set by maps.standardise; only stacks lack it
    return trust.Checked(points, problem.columns, margin, problem.normal, problem.std.z, problem.std.scale)


def _check_finite(linearisation: Linearisation, indices: Tensor) -> None:
    """Refuse margins or margin gradients that are NaN or inf (a model whose Jacobian is not
    finite somewhere, e.g. sqrt at 0): p could not be linearised there, naming the points."""
    _, margin, normal = linearisation
    finite = torch.isfinite(margin.detach()).all(1) & torch.isfinite(normal.detach().flatten(1)).all(1)
    if bool(finite.all()):
        return
    bad = indices[~finite].tolist()
    shown = ", ".join(str(i) for i in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    raise ValueError(
        f"the margins or their input gradients are NaN or inf at data-set index {shown}: the model's "
        "Jacobian is not finite there, so p_robust cannot be linearised (use method 'mc')"
    )


def _pad_or_cut(normal: Tensor, width: int) -> Tensor:
    """u [B, K, *S] cut or zero-padded to [B, width, *S] (padding classes have zero gradients)."""
    if normal.shape[1] >= width:
        return normal[:, :width]
    return torch.cat([normal, normal.new_zeros(normal.shape[0], width - normal.shape[1], *normal.shape[2:])], dim=1)


def _in_order(parts: list[Estimate], order: list[Tensor]) -> Estimate:
    """The estimates of groups of points (``parts[g]`` holds the points ``order[g]``) in point order."""
    return Estimate.cat(parts).take(torch.argsort(torch.cat(order)))


class Linearised(Estimator):
    """Shared by Taylor and MMSE: linearise the margins, then map z to a probability."""

    base_method = ""

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        *,
        cdf: str = "mvn",
        tol: float = DEFAULT_TOL,
        differentiable: bool = False,
        p_fail: bool = False,
        fail_rtol: float = 1e-2,
        prune: str = "auto",
        gradients: str = "auto",
        check_draws: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        if check_draws is not None and (
            isinstance(check_draws, bool) or not isinstance(check_draws, int) or check_draws < 0
        ):
            raise OptionError(f"must be None or an int >= 0, got {check_draws!r}", field="check_draws")
        self.check_draws = check_draws
        self.noise = as_noise(sigma)
        check_choice(cdf, CDFS, "cdf")
        self.cdf = cdf
        self.tol = check_positive_float(tol, "tol")
        for name, value in (("differentiable", differentiable), ("p_fail", p_fail)):
            if not isinstance(value, bool):
                raise OptionError(f"must be True or False, got {value!r}", field=name)
        self.differentiable = differentiable
        self.p_fail = p_fail
        self.fail_rtol = check_fraction(fail_rtol, "fail_rtol")
        linearisation.check_settings(
            prune,
            gradients,
            cdf=cdf,
            differentiable=differentiable,
            p_fail=p_fail,
            gaussian=self.noise.is_gaussian,
            jacobian=self.execution.jacobian,
        )
        self.prune = prune
        self.gradients = gradients
        self._kept_plan: tuple[tuple, int, _CallPlan] | None = None

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.base_method if self.cdf == "mvn" else f"{self.base_method}_mvs"

    def linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        """The linearised margins of a chunk of points with every boundary's gradient (the Monte
        Carlo variants mc_cv and mc_is): the routes' every-gradient path
        (:func:`probust.estimators.route_plan.every_gradient`).

        Args:
            x: [B, *S] on the model's device, in its dtype; the model already in eval mode (as
                inside an estimator's call).
            target: long [B] or None (the clean prediction; a tie is an error).
            indices: int64 [B], the points' indices in the data set (their random streams).
        """
        routed = self._routed(route_plan.every_gradient(self, x), x, target, indices, self.execution.clean_rows)
        return Linearisation(routed.target, routed.margin, routed.normal)

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        parts = []
        plan = self._plan(x)
        with progress(x.shape[0], self.method, self.show_progress) as bar:
            # Where a bar shows, the first chunks are small, so that it moves after a pass's work.
            first = max(1, plan.routes.pull_rows // (2 * self.copies)) if shown(bar) else plan.chunk
            for rows in ramp(x.shape[0], plan.chunk, first):
                chunk_target = None if target is None else target[rows]
                routed = self._routed(plan.routes, x[rows], chunk_target, indices[rows], plan.clean_rows)
                parts.append(self._from_routed(routed, x[rows], indices[rows], plan.check))
                bar.update(rows.stop - rows.start)
        estimate = Estimate.cat(parts)
        # One warning per call, after every chunk, at the user's line.
        trust.warn_untrusted(estimate, noise_words(self.noise), self._instead)
        return estimate

    #: What the trust warning suggests instead of this method.
    _instead = "use method 'mc' there, or a smaller sigma"

    def _plan(self, x: Tensor) -> _CallPlan:
        """Everything the call asks of execution for the points ``x`` [B, *S], in one place
        before the maths: the chunk size, the routes' context (with its Jacobian plan) and the
        trust check's forward plan for a whole chunk's fresh draws.

        Kept for the next call on the same model (its structure), batch shape, dtype, device and
        settings while the memory budget stays within :data:`_BUDGET_BAND` of the one it was made
        under: a warm call then reads the budget only (execution's :func:`resolve_budget`, the
        same the plans are made under). The default budget follows
        the free memory, which moves a little between calls; a plan made under a budget a fifth
        larger still fits in the free memory's half it stands for."""
        budget = resolve_budget(self.execution.memory_budget, x.device)
        key = self._plan_key(x)
        kept = self._kept_plan
        if kept is not None and kept[0] == key and _BUDGET_BAND[0] <= budget / kept[1] <= _BUDGET_BAND[1]:
            return kept[2]
        plan = self._new_plan(x)
        self._kept_plan = (key, max(budget, 1), plan)
        return plan

    def _plan_key(self, x: Tensor) -> tuple:
        """What :meth:`_plan` depends on besides the budget (an estimator's settings are public
        attributes: one changed after a call makes a new plan)."""
        settings = (self.execution, self.prune, self.gradients, self.differentiable, self.cdf, self.p_fail)
        own = (self.copies, self.check_draws, self.tol, self.seed, id(self.noise), id(self.model))
        return (structure_token(self.model), tuple(x.shape), x.dtype, x.device, settings, own)

    def _new_plan(self, x: Tensor) -> _CallPlan:
        chunk = self.points_per_chunk(x)
        ctx = self.route_context(x)
        stages = trust.check_stages(self.check_draws)
        check = None
        if stages and not self._checks_own_copies:
            check = self.execution.forward_plan(self.model, x)
        return _CallPlan(chunk, ctx, check, self.execution.clean_rows)

    @property
    def _checks_own_copies(self) -> bool:
        """Whether the trust check reads the linearisation's own noisy copies (MMSE's, by
        default: :meth:`_own_check_eps`) instead of fresh draws."""
        return False

    def _check_eps(self, x: Tensor, indices: Tensor, start: int, count: int) -> Tensor:
        """Fresh check draws ``start .. start + count - 1`` of each point, [B, count, *S], from the
        points' own stream (:data:`probust.noise.STREAM_TRUST`), so no other number depends on them."""
        keys = point_keys(self.seed, indices, STREAM_TRUST)
        return self.noise.sample(keys, start, count, x.shape[1:])

    def _own_check_eps(self, x: Tensor, indices: Tensor) -> Tensor:
        """Draws the linearisation already holds and checks whole, [B, m, *S], instead of fresh
        ones (MMSE's noisy copies), where :attr:`_checks_own_copies`."""
        raise NotImplementedError(f"{type(self).__name__} checks fresh draws")

    def _check(
        self,
        part: Estimate,
        x: Tensor,
        indices: Tensor,
        groups: list[trust.Checked],
        copy_logits: Tensor,
        plan: ForwardPlan | None,
    ) -> None:
        """Set ``part.agreement`` and ``part.agreement_draws``: the model's verdict against the
        linearisation's on the check draws (:mod:`probust.estimators.trust`); a diagnostic only,
        computed without autograd, that changes no other field.

        Fresh draws come in stages (:func:`probust.estimators.trust.check_stages`): every point
        gets the first; each later stage goes only to the points the draws so far leave open
        (:func:`probust.estimators.trust.undecided`). A point's draws depend on its own verdicts
        and residuals alone, not on its batch. On the linearisation's own copies (MMSE's) the
        model's verdicts are read off the logits its pass already computed.

        Args:
            part: the chunk's estimate (points in the order of ``x``).
            x: [B, *S].
            indices: int64 [B], the points' indices in the data set.
            groups: the boundaries each group of points kept (:class:`probust.estimators.trust.Checked`).
            copy_logits: [B, N, C], the model's logits on the linearisation's copies.
            plan: the forward plan of the fresh draws' passes (:meth:`_plan`); None: none drawn.
        """
        every = torch.arange(x.shape[0], device=x.device)
        if self._checks_own_copies:
            own = self._own_check_eps(x, indices)
            with torch.no_grad():
                agree, _ = self._compare(every, own, part.target, groups, copy_logits, screen=False)
            part.agreement = agree.sum(1).double() / own.shape[1]
            part.agreement_draws = torch.full_like(part.target, own.shape[1])
            return
        if plan is None:
            return
        agreeing, draws = torch.zeros_like(part.target), torch.zeros_like(part.target)
        open_, start = every, 0
        with torch.no_grad(), weights_in_format(self.model, plan.channels_last):
            for stage, upto in enumerate(trust.check_stages(self.check_draws)):
                if not len(open_):
                    break
                eps = self._check_eps(x[open_], indices[open_], start, upto - start)
                logits = trust.model_logits(
                    self.model, x[open_], eps, plan.rows, to_rows=lambda rows: to_format(rows, plan.channels_last)
                )
                agree, rate = self._compare(open_, eps, part.target, groups, logits, screen=stage == 0)
                agreeing[open_] += agree.sum(1)
                draws[open_] = upto
                open_, start = open_[trust.undecided(agreeing[open_], draws[open_], rate)], upto
        part.agreement = agreeing.double() / draws
        part.agreement_draws = draws

    def _compare(
        self, which: Tensor, eps: Tensor, target: Tensor, groups: list[trust.Checked], logits: Tensor, screen: bool
    ) -> tuple[Tensor, Tensor | None]:
        """The model's verdicts against the linearisation's on the draws ``eps`` [W, m, *S] of
        the points ``which`` (int64 [W], positions in the chunk), whose logits there are
        ``logits`` [W, m, C].

        Returns:
            (agree, rate): bool [W, m], whether the two verdicts agree on each draw, and, where
            ``screen``, float64 [W], :func:`probust.estimators.trust.flip_rate` of the residuals of
            the model's margins on these draws against the linearisation's (else None).
        """
        model = trust.verdicts(logits, target[which])
        linear = torch.empty_like(model)
        rate = torch.zeros(len(which), dtype=torch.float64, device=which.device) if screen else None
        position = torch.full_like(target, -1).index_put_((which,), torch.arange(len(which), device=which.device))
        for group in groups:
            at = position[group.points]
            here = at >= 0
            if not bool(here.any()):
                continue
            classes, margin, normal, z, scale = group.classes, group.margin, group.normal, group.z, group.scale
            if not bool(here.all()):  # a copy of the normals only for a subset of the group
                classes, margin, normal, z, scale = classes[here], margin[here], normal[here], z[here], scale[here]
            at = at[here]
            active = classes != target[which[at], None]
            c = margin.gather(1, classes)
            lin = trust.linear_margins(c, normal, eps[at])  # [n, K, m]
            linear[at] = ((lin > 0) | ~active[:, :, None]).all(dim=1)
            if rate is None:
                continue
            seen = logits[at].to(lin.dtype)  # [n, m, C]
            # The model's margins f_t - f_i on the kept boundaries, [n, K, m], less the linearisation's.
            gap = seen.gather(2, target[which[at], None, None].expand(-1, seen.shape[1], 1)) - seen.gather(
                2, classes[:, None, :].expand(-1, seen.shape[1], -1)
            )
            residual = gap.transpose(1, 2) - lin
            finite = torch.isfinite(residual).all(dim=2)
            low = torch.where(finite, residual.amin(dim=2), torch.nan)
            high = torch.where(finite, residual.amax(dim=2), torch.nan)
            rate[at] = trust.flip_rate(z, scale, c, low, high, active)
        return model == linear, rate

    def route_context(self, x: Tensor) -> linearisation.Context:
        """How the margin gradients of points like ``x`` are computed
        (:func:`probust.estimators.route_plan.route_context`)."""
        return route_plan.route_context(self, x)

    def _routed(
        self, ctx: linearisation.Context, x: Tensor, target: Tensor | None, indices: Tensor, clean_rows: int
    ) -> linearisation.Routed:
        """The linearisation of a chunk of points by :func:`probust.linearisation.routes.linearise`
        (``clean_rows``: rows per clean forward pass, where the targets are read off one)."""
        target = self._target(x, target, clean_rows)
        with weights_in_format(self.model, ctx.plan.channels_last):
            return linearisation.linearise(ctx, self._copies(x, indices), target, indices)

    def _from_routed(
        self, routed: linearisation.Routed, x: Tensor, indices: Tensor, check: ForwardPlan | None
    ) -> Estimate:
        """The estimate of a chunk of points from its linearisation, whatever the route: the
        boundaries each point keeps (every one where nothing was pruned) make its problem.

        Points are grouped by their problem's width (a power of two, :func:`linearisation.by_width`;
        one group where every boundary is kept), each group standardised apart (its covariance's
        matrix product has a shape that depends on the point alone), then one mvn-cdf call takes
        them all: its values do not depend on the batch nor on +inf padding, and its fixed cost is
        paid once per chunk.

        Args:
            routed: the chunk's :class:`probust.linearisation.routes.Routed` (``kept`` None: every
                boundary kept, ``normal`` [P, C, *S] in class order).
            x: [P, *S], the chunk's points.
            indices: int64 [P], their data-set indices.
            check: the trust check's forward plan (:meth:`_plan`).
        """
        _check_finite(Linearisation(routed.target, routed.margin, routed.normal), indices)
        groups: list[tuple[Tensor, linearisation.Pruned | None]] = (
            [(torch.arange(len(routed.target), device=x.device), None)]
            if routed.kept is None
            else list(linearisation.by_width(routed.kept, routed.target))
        )
        problems = [self._problem(routed, index, kept) for index, kept in groups]
        std = maps.stack([problem.std for problem in problems])
        p_fail = fail_error = None
        if self.cdf == "mvn":
            reserved = 0.0 if routed.kept is None else routed.kept.reserved
            p, err = maps.mvn_probability(std, tol=self.tol - reserved, seed=self.seed)
            if self.p_fail:
                p_fail, fail_error = maps.mvn_fail_probability(std, rtol=self.fail_rtol, seed=self.seed)
        else:
            p, err = maps.mv_sigmoid(std.z_others), None
            if self.p_fail:  # a closed form: exact up to rounding
                p_fail = maps.mv_sigmoid_fail(std.z_others)
                fail_error = torch.zeros_like(p_fail)
        parts, first = [], 0
        for (index, kept), problem in zip(groups, problems):
            here = slice(first, first + len(index))
            first += len(index)
            parts.append(
                self._result(
                    routed.target[index],
                    routed.margin[index],
                    problem,
                    kept,
                    p[here],
                    None if err is None else err[here],
                    None if p_fail is None else p_fail[here],
                    None if fail_error is None else fail_error[here],
                )
            )
        estimate = parts[0] if routed.kept is None else _in_order(parts, [index for index, _ in groups])
        estimate.route = routed.route
        self._check(
            estimate,
            x,
            indices,
            [_checked(index, problem, routed.margin[index]) for (index, _), problem in zip(groups, problems)],
            routed.logits,
            check,
        )
        return estimate

    def _target(self, x: Tensor, target: Tensor | None, clean_rows: int) -> Tensor | None:
        """The targets of a chunk before it is linearised (Taylor: as given; None is read off the
        logits of the linearisation's own pass; MMSE: off clean passes of ``clean_rows`` rows)."""
        return target

    #: noisy copies linearised per point (MMSE's N)
    copies = 1

    def points_per_chunk(self, x: Tensor) -> int:
        """Points linearised together (:meth:`probust.execution.Execution.points_per_chunk`):
        their gradients, a float64 copy of them for the covariance, and their noisy copies'
        inputs take at most half the memory budget."""
        return self.execution.points_per_chunk(self.model, x, self.copies)

    def _copies(self, x: Tensor, indices: Tensor) -> Tensor:
        """[B, N, *S]: the inputs whose linearisations are averaged (Taylor: x itself)."""
        return x[:, None]

    def _problem(self, routed: linearisation.Routed, index: Tensor, kept: linearisation.Pruned | None) -> _Problem:
        """The mvn problem of the points ``index`` of a chunk: every boundary in class order (the
        target's own column, with its zero gradient, is no constraint), or the boundaries ``kept``
        holds after a column for the target; padding columns get a positive margin and a zero
        gradient (z = +inf)."""
        if kept is None:  # the whole chunk, in order: its tensors as they are (no copy of the normals)
            target, c, normal = routed.target, routed.margin, routed.normal
            columns = torch.arange(c.shape[1], device=c.device).expand_as(c)
            return _Problem(columns, normal, maps.standardise(c, normal, target, self.noise))
        target, c = routed.target[index], routed.margin[index]
        normal = _pad_or_cut(routed.normal[index], kept.classes.shape[1])
        pad = kept.classes == target[:, None]
        reduced_c = torch.cat([c.new_zeros(len(index), 1), torch.where(pad, 1.0, c.gather(1, kept.classes))], dim=1)
        reduced_u = torch.cat([torch.zeros_like(normal[:, :1]), normal], dim=1)
        std = maps.standardise(reduced_c, reduced_u, torch.zeros_like(target), self.noise)
        return _Problem(torch.cat([target[:, None], kept.classes], dim=1), reduced_u, std)

    def _result(
        self,
        target: Tensor,
        c: Tensor,
        problem: _Problem,
        kept: linearisation.Pruned | None,
        p: Tensor,
        err: Tensor | None,
        p_fail: Tensor | None,
        fail_error: Tensor | None,
    ) -> Estimate:
        """The estimate of a group of points from its problem's probability ``p`` and error
        (None: the mv-sigmoid), in class space: z and the gradient norms of the boundaries the
        problem holds; a dropped boundary's z is its lower bound and its norm NaN."""
        floor = torch.full(c.shape, torch.inf, dtype=torch.float64, device=c.device) if kept is None else kept.z_lower
        z = floor.scatter(1, problem.columns, problem.std.z)
        norms = problem.normal.detach().flatten(2).norm(dim=2)  # a diagnostic: no graph (norm'(0) is NaN)
        # The target's column (and padding) scatters its zero norm onto the target, where it belongs.
        grad_norm = torch.full_like(c, torch.nan).scatter(1, problem.columns, norms)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            margin=c,
            grad_norm=grad_norm,
            z=z,
            cdf_error=err if err is None or kept is None else err + kept.bound,
            p_fail=p_fail,
            p_fail_error=fail_error,
            boundaries_kept=torch.full_like(target, c.shape[1] - 1) if kept is None else kept.kept,
        )
