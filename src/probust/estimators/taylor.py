"""Taylor: the margins linearised at the point itself (exact for linear models)."""

from __future__ import annotations

import torch
from torch import Tensor

from probust._checks import check_logits
from probust._memory_format import to_format
from probust.estimators.linearised import Linearisation, Linearised
from probust.execution.tuning import JacobianPlan
from probust.linearise import margin_jacobian, margins


class Taylor(Linearised):
    """p_robust from the first-order Taylor linearisation of the margins at x.

    c_i = g_i(x), u_i = grad g_i(x); exact for linear models under Gaussian noise.

    Args:
        model, batch_size, memory_budget, channels_last, seed, show_progress, execution: see
            :class:`Estimator`.
        sigma: noise standard deviation per input coordinate, in the units of x; or a
            :class:`probust.noise.Noise` (its covariance S enters as u S u^T).
        cdf: "mvn" (multivariate normal CDF) or "mv-sigmoid" (the paper's closed form).
        tol: absolute error tolerance of the mvn-cdf.
        jacobian: how the input gradients are computed: "loop", "vmap", "forward", or "auto"
            (measured); with ``class_chunk_size`` (classes per vmapped backward pass, which bounds
            memory for large C) an execution setting (:class:`probust.execution.Execution`).
        differentiable: keep the autograd graph, so that ``r.p`` (and ``r.z``, ``r.margin``)
            can be differentiated with respect to the model's parameters and, when it requires
            grad, the input x (double backpropagation through the margins' Jacobian, then
            through the mvn-cdf or the mv-sigmoid). Off by default: the graph costs memory and
            time. The mvn-cdf's gradient holds its QMC points fixed (see :mod:`probust.mvn`).
        p_fail: also compute ``r.p_fail`` = 1 - p directly, with relative accuracy, and its
            relative error ``r.p_fail_error`` (:func:`probust.mvn.mvn_sf`; the mv-sigmoid's
            is a closed form). Costs up to C - 1 extra QMC integrals per point for the mvn-cdf.
        fail_rtol: target relative error of ``r.p_fail``.
        prune: whether the mvn-cdf may leave out decision boundaries that cannot matter (a
            boundary z noise standard deviations away changes p by at most Phi(-z)), and with
            them their gradients. "auto" (default): where that can apply (the mvn-cdf under
            Gaussian noise, without ``differentiable`` or ``p_fail``); "on" / True: the same, an
            error where it cannot apply; "off" / False: every margin's gradient, by its own
            backward pass (the paper's computation) or, where ``jacobian`` takes it, forward mode
            (fewer input coordinates than 1/1.5 of the margins, by counts). The boundaries left out add their
            tails, and any bound's failure probability, to ``r.cdf_error`` (at most 7% of
            ``tol`` in all; the mvn-cdf samples to the rest), their ``r.z`` holds a lower bound
            and their ``r.grad_norm`` NaN; ``r.boundaries_kept`` counts the others.
        route: how each point's margin gradients are computed (:mod:`probust.estimators.routes`);
            "auto" (default) takes per point the cheapest, counted in backward passes from the
            model's counts and a declared cost of a forward-mode probe (never timed, so the same
            on every run: :mod:`probust.execution.cost_model`): every boundary
            directly, the rows of the features' Jacobian through the model's linear head (where
            its d features are fewer than the C - 1 margins: every gradient exactly, ~1e-7
            relative from the direct ones), forward mode (few input coordinates), or, where
            boundaries may be left out, a screening that bounds every boundary's z at once (8
            reverse-mode probes on the features, or 32 forward-mode probes) and then the exact
            gradients of only the boundaries still within reach. "direct", "head", "forward",
            "spectral" and "sketch" force one route on every point (to compare them).
            ``r.route`` records each point's.
        check_draws: fresh noise draws per point on which the model's verdict (argmax
            f(x + eps) = t) is compared with the linearisation's (every c_i + u_i . eps > 0):
            ``r.agreement`` is the fraction that agree, and 1 - agreement estimates a bound on
            the linearisation's error at the point (:mod:`probust.estimators.trust`); a
            :class:`~probust.estimators.trust.LinearisationWarning` names the points where it is
            confidently above 5%. None (default): :data:`~probust.estimators.trust.TAYLOR_CHECK_DRAWS`
            (16: one forward pass without autograd per draw); 0: no check (``r.agreement`` is
            None). The draws have a stream of their own: p does not depend on it.
    """

    base_method = "taylor"

    def _linearise(self, plan: JacobianPlan, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        logits, targets, normals = [], [], []
        for first in range(0, x.shape[0], plan.rows):
            rows = slice(first, first + plan.rows)
            block_logits, block_target, u = margin_jacobian(
                self.model,
                to_format(x[rows], plan.channels_last),
                None if target is None else target[rows],
                class_chunk_size=plan.class_chunk,
                differentiable=self.differentiable,
                strategy=plan.strategy,
            )
            check_logits(block_logits, u.shape[0])
            logits.append(block_logits)
            targets.append(block_target)
            normals.append(u)
        target = torch.cat(targets)
        return Linearisation(
            target, margins(torch.cat(logits), target), torch.cat(normals) if len(normals) > 1 else normals[0]
        )
