"""Taylor and MMSE: linearise the C-1 margins, then map their z-scores to a probability.

Both return, per point, the margins c_i and boundary normals u_i of their linearisation
(:meth:`Linearised.linearise`, which the Monte Carlo variants mc_cv and mc_is reuse), then
p = Phi_{U S U^T}(z) (mvn-cdf) or the mv-sigmoid of z.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import NamedTuple

import torch
from torch import Tensor, nn

from probust import _rng, linear_head
from probust._checks import check_positive_float, check_positive_int, check_target, check_target_shape
from probust._progress import progress
from probust.estimators import maps, pruning
from probust.estimators.base import Estimator
from probust.estimators.estimate import Estimate
from probust.execution.budget import row_cost, rows_within
from probust.execution.tuning import JACOBIANS, JacobianPlan, plan_jacobian, to_format, weights_in_format
from probust.linear_head import find_linear_head
from probust.linearise import margin_jacobian, margin_sketch, margins
from probust.noise import Noise, as_noise

CDFS = ("mvn", "mv-sigmoid")
_MAX_POINTS_PER_CHUNK = 1024  # the mvn-cdf is batched: more points per call gain nothing beyond this


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


def _in_order(parts: list[Estimate], order: list[Tensor]) -> Estimate:
    """The estimates of groups of points (``parts[g]`` holds the points ``order[g]``) in point order."""
    return Estimate.cat(parts).take(torch.argsort(torch.cat(order)))


_SKETCH_ERRORS = (RuntimeError, NotImplementedError, AttributeError, TypeError)
_SKETCH_WARNED: set[type] = set()


class Linearised(Estimator):
    """Shared by Taylor and MMSE: linearise the margins, then map z to a probability."""

    base_method = ""

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        *,
        cdf: str = "mvn",
        tol: float = 1e-4,
        jacobian: str = "auto",
        class_chunk_size: int | None = None,
        differentiable: bool = False,
        p_fail: bool = False,
        fail_rtol: float = 1e-2,
        prune: str | bool | None = "auto",
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        if jacobian not in JACOBIANS:
            raise ValueError(f"jacobian must be one of {JACOBIANS}, got {jacobian!r}")
        self.jacobian = jacobian
        self.noise = as_noise(sigma)
        if cdf not in CDFS:
            raise ValueError(f"cdf must be one of {CDFS}, got {cdf!r}")
        self.cdf = cdf
        self.tol = check_positive_float(tol, "tol")
        self.class_chunk_size = (
            None if class_chunk_size is None else check_positive_int(class_chunk_size, "class_chunk_size")
        )
        if not isinstance(differentiable, bool) or not isinstance(p_fail, bool):
            raise ValueError(f"differentiable and p_fail must be bools, got {differentiable!r} and {p_fail!r}")
        self.differentiable = differentiable
        self.p_fail = p_fail
        self.fail_rtol = check_positive_float(fail_rtol, "fail_rtol")
        if self.fail_rtol >= 1:
            raise ValueError(f"fail_rtol must be in (0, 1), got {fail_rtol!r}")
        self.prune = pruning.as_prune(prune)
        if self.prune == "on":
            unsupported = {
                "cdf='mv-sigmoid'": cdf != "mvn",
                "differentiable=True": differentiable,
                "p_fail=True": p_fail,
                "non-Gaussian noise": not self.noise.is_gaussian,
            }
            reasons = [name for name, bad in unsupported.items() if bad]
            if reasons:
                raise ValueError(f"prune='on' cannot be combined with {', '.join(reasons)}; use prune='auto' or 'off'")
        self._sketch_failed = False
        self._head_key: tuple | None = None
        self._head: nn.Linear | None = None

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.base_method if self.cdf == "mvn" else f"{self.base_method}_mvs"

    @abstractmethod
    def linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        """The linearised margins of a chunk of points.

        Args:
            x: [B, *S] on the model's device, in its dtype; the model already in eval mode (as
                inside an estimator's call).
            target: long [B] or None (the clean prediction; a tie is an error).
            indices: int64 [B], the points' indices in the data set (their random streams).
        """

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        parts = []
        target = check_target_shape(target, x.shape[0], x.device)
        chunk = self.points_per_chunk(x)
        head = self.head(x)
        prune = self.prunes(x)
        with progress(x.shape[0], self.method, self.show_progress) as bar:
            for first in range(0, x.shape[0], chunk):
                rows = slice(first, min(first + chunk, x.shape[0]))
                chunk_target = None if target is None else target[rows]
                part: Estimate | None = None
                if head is not None:
                    part = self._through_head(x[rows], chunk_target, indices[rows], head, prune=prune)
                elif prune:
                    part = self._pruned(x[rows], chunk_target, indices[rows])
                if part is None:
                    linearisation = self.linearise(x[rows], chunk_target, indices[rows])
                    _check_finite(linearisation, indices[rows])
                    part = self._from_linearisation(*linearisation)
                parts.append(part)
                bar.update(rows.stop - rows.start)
        return Estimate.cat(parts)

    def prunes(self, x: Tensor) -> bool:
        """Whether the boundaries of points like ``x`` are pruned (:mod:`probust.estimators.pruning`).

        "auto": for the mvn-cdf under Gaussian noise without ``differentiable`` or ``p_fail``:
        wherever the gradients are taken through the model's linear head (:meth:`head`; every
        z is then exact), otherwise by the sketch from
        :data:`~probust.estimators.pruning.AUTO_MIN_CLASSES` classes on, unless the Jacobian
        plan is forward mode (which builds every gradient at once anyway).
        """
        if self.prune == "off" or (self._sketch_failed and self.head(x) is None):
            return False
        if self.prune == "on":
            return True
        if self.cdf != "mvn" or self.differentiable or self.p_fail or not self.noise.is_gaussian:
            return False
        if self.head(x) is not None:  # exact z for every boundary: nothing to lose by pruning
            return True
        if row_cost(self.model, x).classes < pruning.AUTO_MIN_CLASSES:
            return False
        return self._jacobian_plan(x, x.shape[0] * self.copies).strategy != "forward"

    def head(self, x: Tensor) -> nn.Linear | None:
        """The model's linear head where the gradients pay to be taken through it
        (:mod:`probust.linear_head`): d features < C - 1 margins, ``prune`` not "off", not
        ``differentiable``, and a Jacobian plan in reverse mode. None: every margin directly."""
        if self.prune == "off" or self.differentiable:
            return None
        key = (id(self.model), tuple(x.shape[1:]), x.dtype, x.device)
        if self._head_key != key:
            found = find_linear_head(self.model, x[:1])
            if found is not None and not linear_head.pays(found, found.out_features - 1):
                found = None
            if found is not None and self._jacobian_plan(x, x.shape[0] * self.copies).strategy == "forward":
                found = None
            self._head_key, self._head = key, found
        return self._head

    #: noisy copies linearised per point (MMSE's N)
    copies = 1

    def points_per_chunk(self, x: Tensor) -> int:
        """Points linearised together: their gradients, a float64 copy of them for the
        covariance, and their noisy copies' inputs take at most half the memory budget."""
        cost = row_cost(self.model, x)
        per_point = 4 * cost.classes * cost.input + 2 * self.copies * cost.input + 24 * cost.classes**2
        fits = rows_within(self._budget(x) // 2, per_point, what="the margin gradients of one point")
        return min(_MAX_POINTS_PER_CHUNK, fits)

    def _jacobian_plan(self, x: Tensor, rows: int) -> JacobianPlan:
        """How to differentiate ``rows`` rows like ``x`` (measured once per model; half the budget)."""
        cost = row_cost(self.model, x)
        return plan_jacobian(
            self.model,
            x[:16],
            cost.classes,
            budget=self._budget(x) // 2,
            total_rows=rows,
            strategy=self.jacobian,
            rows=self.batch_size,
            class_chunk=self.class_chunk_size,
            channels_last=self.channels_last,
            differentiable=self.differentiable,
            run=self._timed_jacobian,
        )

    def _timed_jacobian(self, plan: JacobianPlan, rows: Tensor, margins: int) -> object:
        with weights_in_format(self.model, plan.channels_last):
            return margin_jacobian(
                self.model,
                to_format(rows, plan.channels_last),
                class_chunk_size=plan.class_chunk,
                strategy=plan.strategy,
                limit=None if plan.strategy == "forward" else margins,
                fallback=False,
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

    @abstractmethod
    def _refine(self, x: Tensor, target: Tensor, indices: Tensor, classes: Tensor) -> tuple[Tensor, Tensor]:
        """(c [B, C], u [B, K, *S]): every margin, and the gradients of the boundaries ``classes`` [B, K]."""

    def _pruned(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate | None:
        """The estimate of a chunk from its kept boundaries only; None where the model cannot be
        sketched in forward mode (one warning; the caller computes every gradient instead)."""
        target = check_target(target, self._clean_logits(x)) if target is None else target
        probes = self.noise.sample(
            _rng.point_keys(self.seed, indices, _rng.STREAM_PRUNE), 0, pruning.PROBES, x.shape[1:]
        )
        plan = self._jacobian_plan(x, x.shape[0] * self.copies)
        try:
            with weights_in_format(self.model, plan.channels_last):
                margin, derivatives = margin_sketch(
                    self.model,
                    self._copies(x, indices),
                    target,
                    probes.to(x.device),
                    batch_size=plan.rows,
                    probe_chunk_size=plan.class_chunk,
                    to_rows=lambda rows: to_format(rows, plan.channels_last),
                )
        except _SKETCH_ERRORS as exc:
            self._sketch_failed = True
            if type(self.model) not in _SKETCH_WARNED:
                _SKETCH_WARNED.add(type(self.model))
                warnings.warn(
                    f"torch.func cannot run forward mode through {type(self.model).__name__} "
                    f"({exc.__class__.__name__}: {str(exc)[:120]}); computing every boundary's gradient (no pruning)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return None
        kept = pruning.select(margin, derivatives, target, tol=self.tol)
        parts, order = [], []
        for index, group in pruning.by_width(kept, target):
            c, u = self._refine(x[index], target[index], indices[index], group.classes)
            parts.append(self._from_kept(target[index], c, u, group))
            order.append(index)
        return _in_order(parts, order)

    def _through_head(
        self, x: Tensor, target: Tensor | None, indices: Tensor, head: nn.Linear, *, prune: bool
    ) -> Estimate:
        """The estimate of a chunk from the features' Jacobian (d backward passes per copy):
        every z exactly; with ``prune`` the mvn-cdf sees only the boundaries that can matter
        (:func:`~probust.estimators.pruning.select_exact`)."""
        plan = self._jacobian_plan(x, x.shape[0] * self.copies)
        with weights_in_format(self.model, plan.channels_last):
            logits, jacobian = linear_head.averaged_feature_jacobian(
                self.model,
                head,
                self._copies(x, indices),
                batch_size=plan.rows,
                strategy=plan.strategy,
                chunk_size=plan.class_chunk,
                to_rows=lambda rows: to_format(rows, plan.channels_last),
            )
        target = self._head_target(x, target, logits)
        c = margins(logits, target)
        _check_finite(Linearisation(target, c, jacobian), indices)
        if not prune:
            u = linear_head.margin_normals(linear_head.boundary_weights(head, target), jacobian)
            return self._from_linearisation(target, c, u)
        variance = linear_head.boundary_variances(
            linear_head.boundary_weights(head, target), self.noise.quadratic_form(jacobian)
        )
        kept = pruning.select_exact(c, variance, target, tol=self.tol)
        parts, order = [], []
        for index, group in pruning.by_width(kept, target):
            weights = linear_head.boundary_weights(head, target[index], group.classes)
            u = linear_head.margin_normals(weights, jacobian[index])
            parts.append(self._from_kept(target[index], c[index], u, group))
            order.append(index)
        return _in_order(parts, order)

    def _head_target(self, x: Tensor, target: Tensor | None, logits: Tensor) -> Tensor:
        """The target of a chunk linearised through the head (Taylor: its logits are the clean ones)."""
        return check_target(target, logits)

    def _from_kept(self, target: Tensor, c: Tensor, u: Tensor, kept: pruning.Pruned) -> Estimate:
        """Like :meth:`_from_linearisation`, on the reduced problem of the kept boundaries."""
        points = c.shape[0]
        pad = kept.classes == target[:, None]
        # Column 0 is the target; padding columns get a positive margin and a zero gradient (z = +inf).
        reduced_c = torch.cat([c.new_zeros(points, 1), torch.where(pad, 1.0, c.gather(1, kept.classes))], dim=1)
        reduced_u = torch.cat([torch.zeros_like(u[:, :1]), u], dim=1)
        std = maps.standardise(reduced_c, reduced_u, torch.zeros_like(target), self.noise)
        p, err = maps.mvn_probability(std, tol=self.tol - kept.reserved, seed=self.seed)
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
