"""Taylor: the margins linearised at the point itself (exact for linear models)."""

from __future__ import annotations

from probust.estimators.linearised import Linearised


class Taylor(Linearised):
    """p_robust from the first-order Taylor linearisation of the margins at x.

    c_i = g_i(x), u_i = grad g_i(x); exact for linear models under Gaussian noise. Routes and
    pruning: docs/performance.md, "Routes at many classes"; the check: docs/estimators.md.

    Args:
        model, seed, execution: as for :class:`Estimator`.
        sigma: noise standard deviation per input coordinate, in the units of x; or a
            :class:`probust.noise.Noise` (its covariance S enters as u S u^T).
        cdf: "mvn" (multivariate normal CDF) or "mv-sigmoid" (the paper's closed form).
        tol: absolute error tolerance of the mvn-cdf.
        differentiable: keep the autograd graph of ``r.p``, ``r.z``, ``r.margin`` (to the parameters,
            and to x where it requires grad); the mvn-cdf's gradient holds its QMC points fixed.
        p_fail: also compute ``r.p_fail`` = 1 - p with relative accuracy, and ``r.p_fail_error``
            (:func:`probust.mvn.mvn_sf`): up to C - 1 more QMC integrals per point (mvn-cdf).
        fail_rtol: target relative error of ``r.p_fail``.
        prune: "auto" (default): with the mvn-cdf, Gaussian noise, no ``differentiable`` or ``p_fail``,
            where a screening or the linear head pays by counts, skip the boundaries (and their
            gradients) whose tails Phi(-z) fit the budget, adding at most 7% of ``tol`` to
            ``r.cdf_error``; "spectral" / "sketch": that screening on every point; "off": keep all.
        gradients: where the exact margin gradients come from (:mod:`probust.linearisation.routes`):
            "auto" (default): per point the cheapest by counts, never timed; "direct", "head" or
            "forward": that source on every point, no screening. ``r.route`` records each point's.
        check_draws: the most fresh noise draws per point (a forward pass each, in stages) on which
            the model's verdict is checked against the linearisation's (``r.agreement``,
            :mod:`probust.estimators.trust`); None: 32; 0: no check. p does not depend on it.

    Raises:
        OptionError: a setting out of range, not offered, or not combinable with the others (named).
    """

    base_method = "taylor"
