"""Taylor: the margins linearised at the point itself (exact for linear models)."""

from __future__ import annotations

import torch
from torch import Tensor

from probust._checks import check_logits
from probust.estimators.linearised import Linearisation, Linearised
from probust.execution.tuning import to_format, weights_in_format
from probust.linearise import margin_jacobian, margins


class Taylor(Linearised):
    """p_robust from the first-order Taylor linearisation of the margins at x.

    c_i = g_i(x), u_i = grad g_i(x); exact for linear models under Gaussian noise.

    Args:
        model, batch_size, seed, show_progress: see :class:`Estimator`.
        sigma: noise standard deviation per input coordinate, in the units of x; or a
            :class:`probust.noise.Noise` (its covariance S enters as u S u^T).
        cdf: "mvn" (multivariate normal CDF) or "mv-sigmoid" (the paper's closed form).
        tol: absolute error tolerance of the mvn-cdf.
        class_chunk_size: classes per vmapped backward pass (bounds memory for large C).
        differentiable: keep the autograd graph, so that ``r.p`` (and ``r.z``, ``r.margin``)
            can be differentiated with respect to the model's parameters and, when it requires
            grad, the input x (double backpropagation through the margins' Jacobian, then
            through the mvn-cdf or the mv-sigmoid). Off by default: the graph costs memory and
            time. The mvn-cdf's gradient holds its QMC points fixed (see :mod:`probust.mvn`).
        p_fail: also compute ``r.p_fail`` = 1 - p directly, with relative accuracy, and its
            relative error ``r.p_fail_error`` (:func:`probust.mvn.mvn_sf`; the mv-sigmoid's
            is a closed form). Costs up to C - 1 extra QMC integrals per point for the mvn-cdf.
        fail_rtol: target relative error of ``r.p_fail``.
        prune: skip the decision boundaries that cannot matter (:mod:`probust.estimators.pruning`),
            by one of two routes:

            - through the model's linear head (:mod:`probust.linear_head`), where the logits are
              an ``nn.Linear`` of d features with d < C - 1: d backward passes give every
              margin's gradient and its exact z, and the mvn-cdf sees only the boundaries whose
              tails do not fit within 5% of ``tol`` (added to ``r.cdf_error``);
            - otherwise a sketch: 32 forward-mode products against probes drawn from the noise
              bound every boundary's z from below at once; exact gradients are computed only
              for the boundaries still within reach, and what the others could cost (their
              tails' sum plus the sketch's failure probability, at most 6% of ``tol``) is added
              to ``r.cdf_error``; ``r.z`` then holds the lower bound and ``r.grad_norm`` NaN
              for the skipped boundaries.

            ``r.boundaries_kept`` counts the kept ones. "auto" (default): for the mvn-cdf under
            Gaussian noise without ``differentiable`` or ``p_fail``, by the head wherever it
            pays, else by the sketch from :data:`~probust.estimators.pruning.AUTO_MIN_CLASSES`
            classes on (not when the Jacobian is taken in forward mode); where pruning cannot
            apply (mv-sigmoid, other noise, ``p_fail``) "auto" still takes every gradient
            through the head when it pays. "on" / True: always (an error where it cannot
            apply); "off" / False: every margin's gradient by its own backward pass, bitwise as
            before. The head route equals the direct one up to float rounding (the same
            products summed in another order, ~1e-7 relative on z). A model forward mode
            cannot run through falls back to every boundary with one warning.
    """

    base_method = "taylor"

    def linearise(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Linearisation:
        plan = self._jacobian_plan(x, x.shape[0])
        logits, targets, normals = [], [], []
        with weights_in_format(self.model, plan.channels_last):
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
