"""Taylor and MMSE: linearise the C-1 margins, then map their z-scores to a probability.

Both return, per point, the margins c_i and boundary normals u_i of their linearisation
(:meth:`Linearised.linearise`, which the Monte Carlo variants mc_cv and mc_is reuse), then
p = Phi_{U S U^T}(z) (mvn-cdf) or the mv-sigmoid of z.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from typing import NamedTuple

import torch
from torch import Tensor, nn

from probust import _rng, gradients
from probust._checks import check_choice, check_fraction, check_positive_float, check_target_shape
from probust._progress import progress
from probust.errors import OptionError, Part, Setting
from probust.estimators import maps, pruning, routes, trust
from probust.estimators.base import Estimator, noise_words
from probust.estimators.result import Estimate
from probust.execution import cost_model
from probust.execution.budget import row_cost
from probust.execution.costs import pull_strategy
from probust.execution.tuning import JacobianPlan, forward_mode_pays, to_format, weights_in_format
from probust.gradients import Strategy
from probust.linear_head import find_linear_head
from probust.linearise import margin_jacobian
from probust.mvn import DEFAULT_TOL
from probust.noise import Noise, as_noise

CDFS = ("mvn", "mv-sigmoid")


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


def timed_margins(model: nn.Module, plan: JacobianPlan, rows: Tensor, margins: int) -> object:
    """What a Jacobian plan is timed on: the gradients of ``margins`` margins of ``rows`` under
    ``plan`` (all of them in forward mode), the weights and rows in its memory format."""
    with weights_in_format(model, plan.channels_last):
        return margin_jacobian(
            model,
            to_format(rows, plan.channels_last),
            class_chunk_size=plan.class_chunk,
            strategy=plan.strategy,
            limit=None if plan.strategy.whole_jacobian else margins,
            fallback=False,
        )


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
        jacobian: str = "auto",
        class_chunk_size: int | None = None,
        differentiable: bool = False,
        p_fail: bool = False,
        fail_rtol: float = 1e-2,
        prune: str | bool | None = "auto",
        route: str = "auto",
        check_draws: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        if check_draws is not None and (
            isinstance(check_draws, bool) or not isinstance(check_draws, int) or check_draws < 0
        ):
            raise OptionError(f"must be None or an int >= 0, got {check_draws!r}", field="check_draws")
        self.check_draws = check_draws
        self._compose_execution(jacobian=jacobian, class_chunk_size=class_chunk_size)
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
        self.prune = pruning.as_prune(prune)
        if self.prune == "on":
            unsupported: dict[Part, bool] = {
                Setting("cdf", "mv-sigmoid"): cdf != "mvn",
                Setting("differentiable", True): differentiable,
                Setting("p_fail", True): p_fail,
                "non-Gaussian noise": not self.noise.is_gaussian,
            }
            reasons = [name for name, bad in unsupported.items() if bad]
            if reasons:
                listed = [part for i, reason in enumerate(reasons) for part in ((", ",) if i else ()) + (reason,)]
                raise OptionError("'on' cannot be combined with ", *listed, "; use 'auto' or 'off'", field="prune")
        check_choice(route, routes.ROUTE_CHOICES, "route")
        if route != "auto" and (self.prune == "off" or differentiable or self.jacobian == Strategy.FORWARD):
            raise OptionError(
                f"{route!r} needs ",
                Setting("prune"),
                " 'auto' or 'on', ",
                Setting("differentiable", False),
                " and a ",
                Setting("jacobian"),
                " other than 'forward' (those compute every gradient directly); use 'auto'",
                field="route",
            )
        prunable = cdf == "mvn" and not p_fail and self.noise.is_gaussian
        if route in ("spectral", "sketch") and not prunable:
            raise OptionError(
                f"{route!r} prunes boundaries, which needs ",
                Setting("cdf", "mvn"),
                ", ",
                Setting("p_fail", False),
                " and Gaussian noise",
                field="route",
            )
        self.route = route

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.base_method if self.cdf == "mvn" else f"{self.base_method}_mvs"

    @property
    def jacobian(self) -> str:
        """The Jacobian strategy as given (:attr:`probust.execution.Execution.jacobian`)."""
        return self.execution.jacobian

    @property
    def class_chunk_size(self) -> int | None:
        """Classes per vmapped pass as given (:attr:`probust.execution.Execution.class_chunk_size`)."""
        return self.execution.class_chunk_size

    def linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        """The linearised margins of a chunk of points: every margin's gradient directly, by
        the Jacobian plan for the chunk's ``copies`` rows per point, the weights in its memory format.

        Args:
            x: [B, *S] on the model's device, in its dtype; the model already in eval mode (as
                inside an estimator's call).
            target: long [B] or None (the clean prediction; a tie is an error).
            indices: int64 [B], the points' indices in the data set (their random streams).
        """
        target = self._target(x, target)
        plan = self._jacobian_plan(x, x.shape[0] * self.copies)
        with self.execution.in_format(self.model, plan):
            return self._linearise(plan, x, target, indices)

    @abstractmethod
    def _linearise(self, plan: JacobianPlan, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        """:meth:`linearise` under ``plan`` (rows per pass, strategy, class chunk, memory format:
        the weights already in it; the rows are put in it here)."""

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        parts = []
        target = check_target_shape(target, x.shape[0], x.device)
        chunk = self.points_per_chunk(x)
        ctx = self.route_context(x)
        direct_route = routes.FORWARD if ctx is None and self._forward_jacobian(x) else routes.DIRECT
        with progress(x.shape[0], self.method, self.show_progress) as bar:
            for first in range(0, x.shape[0], chunk):
                rows = slice(first, min(first + chunk, x.shape[0]))
                chunk_target = None if target is None else target[rows]
                if ctx is None:
                    linearisation = self.linearise(x[rows], chunk_target, indices[rows])
                    _check_finite(linearisation, indices[rows])
                    part = self._from_linearisation(*linearisation)
                    part.route = torch.full_like(part.target, direct_route)
                    _, margin, normal = linearisation
                    classes = torch.arange(margin.shape[1], device=margin.device).expand_as(margin)
                    self._check(part, x[rows], indices[rows], [(slice(None), classes, margin, normal)])
                else:
                    part = self._routed(ctx, x[rows], chunk_target, indices[rows])
                parts.append(part)
                bar.update(rows.stop - rows.start)
        estimate = Estimate.cat(parts)
        # One warning per call, after every chunk: stacklevel 3 from here is the caller of __call__.
        trust.warn_untrusted(estimate, noise_words(self.noise), self._instead, stacklevel=3)
        return estimate

    #: What the trust warning suggests instead of this method.
    _instead = "use method 'mc' there, or a smaller sigma"

    def _check_eps(self, x: Tensor, indices: Tensor) -> Tensor | None:
        """The draws the linearisation is checked on, [B, m, *S], or None (``check_draws=0``):
        ``check_draws`` fresh draws of the points' own stream (:data:`probust._rng.STREAM_TRUST`;
        None: :data:`probust.estimators.trust.TAYLOR_CHECK_DRAWS`)."""
        draws = trust.TAYLOR_CHECK_DRAWS if self.check_draws is None else self.check_draws
        if draws == 0:
            return None
        keys = _rng.point_keys(self.seed, indices, _rng.STREAM_TRUST)
        return self.noise.sample(keys, 0, draws, x.shape[1:])

    def _check(
        self, part: Estimate, x: Tensor, indices: Tensor, groups: list[tuple[Tensor | slice, Tensor, Tensor, Tensor]]
    ) -> None:
        """Set ``part.agreement`` and ``part.agreement_draws``: the model's verdict against the
        linearisation's on the check draws (:mod:`probust.estimators.trust`); a diagnostic only,
        computed without autograd, that changes no other field.

        Args:
            part: the chunk's estimate (points in the order of ``x``).
            x: [B, *S].
            indices: int64 [B], the points' indices in the data set.
            groups: (points, classes [n, K], margin [n, C], normal [n, K, *S]) per group of
                points: the boundaries each point's linearisation kept, the class of each
                (its target on padding), the margins of every class and the kept normals.
        """
        eps = self._check_eps(x, indices)
        if eps is None:
            return
        with torch.no_grad():
            model_verdict = trust.model_survives(self.model, x, eps, part.target, self.execution.clean_rows)
            linear_verdict = torch.empty_like(model_verdict)
            for points, classes, margin, normal in groups:
                active = classes != part.target[points, None]
                linear_verdict[points] = trust.linear_survives(margin.gather(1, classes), normal, eps[points], active)
        part.agreement = trust.agreement(model_verdict, linear_verdict)
        part.agreement_draws = torch.full_like(part.target, eps.shape[1])

    def route_context(self, x: Tensor) -> routes.Context | None:
        """How the margin gradients of points like ``x`` are computed: None where every margin's
        gradient is taken directly (:meth:`linearise`: ``prune="off"``, ``differentiable``, a
        fixed ``jacobian="forward"``, or a model too small in classes for any other route to
        pay), else the settings of :func:`probust.estimators.routes.linearise`, which chooses a
        route per point from counts (the model's linear head, screenings that prune the
        boundaries that cannot matter, forward mode, or every gradient).

        Decided from counts and the declared cost model (:mod:`probust.execution.cost_model`)
        before anything is timed: C, the head's width, the input size and the probes'
        declared cost. Forward mode counts only where one untimed probe shows it runs."""
        if self.prune == "off" or self.differentiable or self.jacobian == Strategy.FORWARD:
            return None
        if not isinstance(self.model, nn.Module):
            return None
        classes = row_cost(self.model, x).classes
        inputs = x[0].numel()
        prune = self.prune == "on" or (self.cdf == "mvn" and not self.p_fail and self.noise.is_gaussian)
        head = find_linear_head(self.model, x[:1])
        # Forward mode at its declared cost, unless it cannot run through the model: probed
        # (untimed) here where it would decide the route (a forced one, or D probes below the
        # reverse routes' passes), else only once a point's route wants the sketch.
        jvp = cost_model.jvp_in_pulls(x.device)
        forced_forward = self.route in ("forward", "sketch")
        if forced_forward or (
            self.route == "auto" and inputs * jvp < routes.static_exact(head, classes, inputs, math.inf)
        ):
            if not gradients.forward_mode_runs(self.model, x):
                if forced_forward:
                    raise OptionError(
                        f"{self.route!r} needs forward mode (torch.func.jvp), which cannot run through this model; "
                        "use 'spectral' or 'auto'",
                        field="route",
                    )
                jvp = math.inf
        exact = routes.static_exact(head, classes, inputs, jvp)
        spectral = self.route == "spectral" or (
            self.route == "auto"
            and prune
            and routes.SPECTRAL_PROBES <= routes.RHO * routes.static_exact(head, classes, inputs, math.inf)
        )
        sketch_could_pay = prune and routes.SPECTRAL_PROBES * spectral + pruning.PROBES * jvp <= (
            routes.SCREENING_SHARE * exact
        )
        if self.route == "auto" and not (self.prune == "on" or exact < classes - 1 or spectral or sketch_could_pay):
            return None  # nothing pays but every gradient, one pass each: the direct path
        # The measuring is bounded by the work it serves: at least the screening's probes per row.
        passes = routes.SPECTRAL_PROBES if spectral else exact
        plan = self._jacobian_plan(x, x.shape[0] * self.copies, passes=passes)
        with self.execution.in_format(self.model, plan):
            pull = pull_strategy(self.model, head, x, plan)
        return routes.Context(
            model=self.model,
            head=head,
            plan=plan,
            noise=self.noise,
            tol=self.tol,
            seed=self.seed,
            prune=prune,
            jvp=jvp,
            pull=pull,
            route=self.route,
            probe_rows=self.execution.forward_mode_rows(self.model, x, plan),
            pull_rows=self.execution.pull_rows(self.model, x, plan, self.copies),
            graph_rows=self.execution.graph_rows(self.model, x, plan),
        )

    def _forward_jacobian(self, x: Tensor) -> bool:
        """Whether :meth:`linearise` takes every gradient by forward mode: asked for, or by
        counts (:func:`probust.execution.tuning.forward_mode_pays`) where ``jacobian="auto"``."""
        if self.jacobian != "auto" or self.differentiable or not isinstance(self.model, nn.Module):
            return self.jacobian == Strategy.FORWARD
        return forward_mode_pays(self.model, x, x[0].numel(), row_cost(self.model, x).classes)

    def _routed(self, ctx: routes.Context, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        """The estimate of a chunk of points by :func:`probust.estimators.routes.linearise`."""
        target = self._target(x, target)
        with self.execution.in_format(self.model, ctx.plan):
            routed = routes.linearise(ctx, self._copies(x, indices), target, indices)
        _check_finite(Linearisation(routed.target, routed.margin, routed.normal), indices)
        if routed.kept is None:
            part = self._from_linearisation(routed.target, routed.margin, routed.normal)
            part.route = routed.route
            classes = torch.arange(routed.margin.shape[1], device=x.device).expand_as(routed.margin)
            self._check(part, x, indices, [(slice(None), classes, routed.margin, routed.normal)])
            return part
        # Each width group is standardised apart (its covariance's matrix product has a shape
        # that depends on the point alone), then one mvn-cdf call takes them all: its values do
        # not depend on the batch nor on +inf padding, and its fixed cost is paid once per chunk.
        groups, order = [], []
        for index, group in pruning.by_width(routed.kept, routed.target):
            normal = _pad_or_cut(routed.normal[index], group.classes.shape[1])
            groups.append(
                (group, normal, self._standardise_kept(routed.target[index], routed.margin[index], normal, group))
            )
            order.append(index)
        p, err = maps.mvn_probability(
            maps.stack([std for _, _, std in groups]), tol=self.tol - routed.kept.reserved, seed=self.seed
        )
        parts, first = [], 0
        for (group, normal, std), index in zip(groups, order):
            here = slice(first, first + len(index))
            first += len(index)
            parts.append(
                self._from_kept(routed.target[index], routed.margin[index], normal, group, std, p[here], err[here])
            )
        estimate = _in_order(parts, order)
        estimate.route = routed.route
        # Each point's kept boundaries at its group's width (a shape that depends on the point alone).
        self._check(
            estimate,
            x,
            indices,
            [(index, group.classes, routed.margin[index], normal) for (group, normal, _), index in zip(groups, order)],
        )
        return estimate

    def _target(self, x: Tensor, target: Tensor | None) -> Tensor | None:
        """The targets of a chunk before it is linearised (Taylor: as given; None is read off the
        logits of the linearisation's own pass)."""
        return target

    #: noisy copies linearised per point (MMSE's N)
    copies = 1

    def points_per_chunk(self, x: Tensor) -> int:
        """Points linearised together (:meth:`probust.execution.Execution.points_per_chunk`):
        their gradients, a float64 copy of them for the covariance, and their noisy copies'
        inputs take at most half the memory budget."""
        return self.execution.points_per_chunk(self.model, x, self.copies)

    def _jacobian_plan(self, x: Tensor, rows: int, passes: float | None = None) -> JacobianPlan:
        """How to differentiate ``rows`` rows like ``x`` (:meth:`probust.execution.Execution.jacobian_plan`);
        ``passes``: backward passes per row the call runs (default C - 1), which bounds the measuring."""
        return self.execution.jacobian_plan(
            self.model,
            x,
            rows,
            run=functools.partial(timed_margins, self.model),
            differentiable=self.differentiable,
            passes=passes,
        )

    def _from_linearisation(self, target: Tensor, c: Tensor, u: Tensor) -> Estimate:
        std = maps.standardise(c, u, target, self.noise)
        p_fail = fail_error = None
        if self.cdf == "mvn":
            p, err = maps.mvn_probability(std, tol=self.tol, seed=self.seed)
            if self.p_fail:
                p_fail, fail_error = maps.mvn_fail_probability(std, rtol=self.fail_rtol, seed=self.seed)
        else:
            p, err = maps.mv_sigmoid(std.z_others), None
            if self.p_fail:  # a closed form: exact up to rounding
                p_fail = maps.mv_sigmoid_fail(std.z_others)
                fail_error = torch.zeros_like(p_fail)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            margin=c,
            grad_norm=u.detach().flatten(2).norm(dim=2),  # a diagnostic: no graph (norm'(0) is NaN)
            z=std.z,
            cdf_error=err,
            p_fail=p_fail,
            p_fail_error=fail_error,
            boundaries_kept=torch.full_like(target, c.shape[1] - 1),
        )

    def _copies(self, x: Tensor, indices: Tensor) -> Tensor:
        """[B, N, *S]: the inputs whose linearisations are averaged (Taylor: x itself)."""
        return x[:, None]

    def _standardise_kept(self, target: Tensor, c: Tensor, u: Tensor, kept: pruning.Pruned) -> maps.Standardised:
        """The reduced problem of the kept boundaries: column 0 is the target; padding columns
        get a positive margin and a zero gradient (z = +inf)."""
        points = c.shape[0]
        pad = kept.classes == target[:, None]
        reduced_c = torch.cat([c.new_zeros(points, 1), torch.where(pad, 1.0, c.gather(1, kept.classes))], dim=1)
        reduced_u = torch.cat([torch.zeros_like(u[:, :1]), u], dim=1)
        return maps.standardise(reduced_c, reduced_u, torch.zeros_like(target), self.noise)

    def _from_kept(
        self, target: Tensor, c: Tensor, u: Tensor, kept: pruning.Pruned, std: maps.Standardised, p: Tensor, err: Tensor
    ) -> Estimate:
        """Like :meth:`_from_linearisation`, from the reduced problem's probability p and error."""
        z = kept.z_lower.scatter(1, kept.classes, std.z[:, 1:])
        norms = u.flatten(2).norm(dim=2)
        # Padding scatters its zero norm onto the target, where it belongs.
        grad_norm = torch.full_like(c, torch.nan).scatter(1, target[:, None], 0.0).scatter(1, kept.classes, norms)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            margin=c,
            grad_norm=grad_norm,
            z=z,
            cdf_error=err + kept.bound,
            boundaries_kept=kept.kept,
        )
