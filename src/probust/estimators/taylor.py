"""Taylor: the margins linearised at the point itself (exact for linear models)."""

from __future__ import annotations

from probust.estimators.linearised import Linearised


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
        jacobian: how the backward passes run: "loop", "vmap", or "auto" (measured); with
            ``class_chunk_size`` (classes per vmapped backward pass, which bounds memory for large
            C) an execution setting (:class:`probust.execution.Execution`): speed and rounding
            only.
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
            Gaussian noise, without ``differentiable`` or ``p_fail``) and a route other than
            every gradient by its own pass is taken (a screening or the linear head pays by
            counts, from about 81 classes or fewer than the head's features + 1 passes; or
            ``gradients`` names a source), the boundaries whose tails fit the budget are left
            out. A screening bounds every boundary's z at once (8 reverse-mode probes on the
            features, or 8 to 32 forward-mode probes, in stages), and then only the boundaries
            still within reach get exact gradients. "spectral" and "sketch" run that screening
            on every point (to compare them; an error where pruning cannot apply). "off": every
            boundary is kept. The boundaries left out add their tails, and any screening's
            failure probability, to ``r.cdf_error`` (at most 7% of ``tol`` in all; the mvn-cdf
            samples to the rest), their ``r.z`` holds a lower bound and their ``r.grad_norm``
            NaN; ``r.boundaries_kept`` counts the others.
        gradients: where the exact margin gradients come from (:mod:`probust.estimators.routes`).
            "auto" (default) takes per point the cheapest, counted in backward passes from the
            model's counts and a declared cost of a forward-mode probe (never timed, so the
            same on every run: :mod:`probust.execution.cost_model`): "direct" (one backward
            pass per boundary, the paper's computation), "head" (the rows of the features'
            Jacobian through the model's linear head, where its d features are fewer than the
            C - 1 margins: every gradient exactly, ~1e-7 relative from the direct ones) or
            "forward" (forward mode, for inputs with few coordinates), and, where ``prune``
            screens, only the screening's candidates. Any other value forces that source on
            every point (no screening runs). With ``prune="off"``, "auto" takes every
            gradient directly, or by forward mode where the counts say it pays. ``r.route``
            records each point's ("candidates": a screening's).
        check_draws: fresh noise draws per point on which the model's verdict (argmax
            f(x + eps) = t) is compared with the linearisation's (every c_i + u_i . eps > 0):
            ``r.agreement`` is the fraction that agree, and 1 - agreement estimates a bound on
            the linearisation's error at the point (:mod:`probust.estimators.trust`); a
            :class:`~probust.estimators.trust.LinearisationWarning` names the points where it is
            confidently above 5%. The most draws per point: the first
            :data:`~probust.estimators.trust.FIRST_CHECK_DRAWS` (8) on every point, the rest only
            where those leave the verdict open (:func:`~probust.estimators.trust.undecided`).
            None (default): :data:`~probust.estimators.trust.TAYLOR_CHECK_DRAWS` (32); one
            forward pass without autograd per draw; 0: no check (``r.agreement`` is None). The
            draws have a stream of their own: p does not depend on it.
    """

    base_method = "taylor"
