"""A training objective for average-case robustness: mu * mean(-log p_robust(x)).

Used as the ``extra_loss`` of :func:`probust.train.train` (CLI: ``probust train --robust-loss MU
--robust-sigma S``), it is added to the cross-entropy, so a batch's loss is

    CE + mu * mean_i -log p_robust(x_i; sigma)

with p_robust the differentiable Taylor (or MMSE) estimate: the margins' input Jacobian is built
with its own graph (double backpropagation), then mapped through the mvn-cdf (gradient with
respect to its bounds and correlation, QMC points held fixed) or the mv-sigmoid. By default the
probability is that of keeping the *label* under noise, so that on misclassified examples the
term pulls towards the right class instead of making a wrong prediction robust, and the map is
the mv-sigmoid; the weight is ramped up over the first steps (see ``warmup_steps``).

Example:
    >>> loss = probust.RobustLoss(sigma=0.3, mu=1.0)
    >>> probust.train.train("fashion-mnist", "cnn", epochs=3, extra_loss=loss)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probust._checks import check_positive_float, check_positive_int
from probust.estimators import CDFS, MMSE, Taylor
from probust.noise import Noise, as_noise

TARGETS = ("label", "prediction")
LINEARISATIONS = ("taylor", "mmse")


class RobustLoss:
    """``(model, x, y, logits) -> mu * mean(-log p_robust)``: the robust training term.

    Args:
        sigma: noise standard deviation per input coordinate (units of x), or a Noise.
        mu: weight of the term (>= 0).
        cdf: "mv-sigmoid" (default; closed form, -log p = softplus(logsumexp(-z))) or "mvn"
            (the multivariate normal CDF, differentiated through its QMC integral; slower).
            With target="label" prefer the mv-sigmoid: for a misclassified example -log Phi(z)
            grows like z^2 / 2, so a few badly wrong examples dominate the term, while the
            mv-sigmoid's grows linearly, like a cross-entropy (on digits, mvn + label lost 10
            points of accuracy and robustness where mv-sigmoid + label gained both).
        linearisation: "taylor" (at x) or "mmse" (``mmse_samples`` noisy copies; N times dearer).
        target: "label" (default: the probability that the noisy input is still classified
            correctly) or "prediction" (p_robust proper: keep the clean prediction; its
            Taylor z is >= 0, so -log p stays bounded).
        tol: absolute tolerance of the mvn-cdf (training tolerates a coarse one).
        max_points: use only the first this many examples of each batch (cost control); None: all.
        min_p: floor of p inside the log, for both maps: each example adds at most
            -log(min_p) (9.2 at the default 1e-4) and no gradient once below it. Without the
            floor the label target diverges: a misclassified example's z = c / (sigma |u|) runs
            to -inf as its input gradient u shrinks, so its term (and gradient) grows without
            bound; on Fashion-MNIST (mu = 3, sigma = 0.3, seed 1) the training loss reached
            2.5e4 in the second epoch and the model collapsed to a constant class. Badly wrong
            examples are left to the cross-entropy.
        mmse_samples: copies of the MMSE linearisation.
        warmup_steps: the weight grows linearly from 0 to ``mu`` over this many calls (training
            steps; 500 ~ one epoch of Fashion-MNIST at batch 128). From a random
            initialisation the term's gradient is many times the cross-entropy's and, applied
            at once, drives the network towards a flat classifier (robust and useless; on
            digits, mu = 1 without warm-up loses more than 25 points of accuracy); letting the
            cross-entropy shape the features first avoids that. The count lives in this
            object (:meth:`state_dict`); :func:`probust.train.train` saves it in its checkpoints,
            so a resumed run continues the ramp where the interrupted one stopped.

    The estimate is computed with the model in eval mode (rows must not interact for the
    vectorised Jacobian), then the model's mode is restored.
    """

    def __init__(
        self,
        sigma: float | Tensor | Noise,
        mu: float = 1.0,
        *,
        cdf: str = "mv-sigmoid",
        linearisation: str = "taylor",
        target: str = "label",
        tol: float = 1e-3,
        max_points: int | None = None,
        min_p: float = 1e-4,
        mmse_samples: int = 5,
        warmup_steps: int = 500,
    ) -> None:
        self.noise = as_noise(sigma)
        if not (isinstance(mu, (int, float)) and mu >= 0):
            raise ValueError(f"mu must be a number >= 0, got {mu!r}")
        for value, allowed, name in ((cdf, CDFS, "cdf"), (linearisation, LINEARISATIONS, "linearisation"), (target, TARGETS, "target")):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        self.mu = float(mu)
        self.cdf = cdf
        self.linearisation = linearisation
        self.target = target
        self.tol = check_positive_float(tol, "tol")
        self.max_points = None if max_points is None else check_positive_int(max_points, "max_points")
        self.min_p = check_positive_float(min_p, "min_p")
        self.mmse_samples = check_positive_int(mmse_samples, "mmse_samples")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps
        self.calls = 0
        # train() records getattr(extra_loss, "__qualname__") in the checkpoint and refuses to
        # resume a run whose loss differs: name the settings, not just the class.
        self.__qualname__ = repr(self)

    def __repr__(self) -> str:
        noise = self.noise.describe()
        scale = noise.get("sigma", noise)
        return (
            f"RobustLoss(sigma={scale}, mu={self.mu:g}, cdf={self.cdf!r}, linearisation={self.linearisation!r}, "
            f"target={self.target!r}, max_points={self.max_points}, min_p={self.min_p:g}, warmup_steps={self.warmup_steps})"
        )

    def config(self) -> dict:
        """The loss's settings as a JSON-serialisable dict (``probust.train`` stores it in the
        checkpoint's metadata as ``extra_loss_config``).

        Keys: ``name`` ("RobustLoss"), ``mu``, ``sigma`` (the noise's standard deviation per
        coordinate; None for non-scalar noise, then ``noise`` describes it), ``noise`` (the
        noise's own description), ``cdf``, ``linearisation``, ``target``, ``tol``,
        ``max_points``, ``min_p``, ``mmse_samples``, ``warmup_steps``.
        """
        noise = self.noise.describe()
        sigma = noise.get("sigma")
        return {
            "name": type(self).__name__,
            "mu": self.mu,
            "sigma": float(sigma) if isinstance(sigma, (int, float)) else None,
            "noise": noise,
            "cdf": self.cdf,
            "linearisation": self.linearisation,
            "target": self.target,
            "tol": self.tol,
            "max_points": self.max_points,
            "min_p": self.min_p,
            "mmse_samples": self.mmse_samples,
            "warmup_steps": self.warmup_steps,
        }

    def estimator(self, model: nn.Module, batch: int) -> Taylor:
        """The differentiable estimator this loss evaluates (for ``batch`` points at once)."""
        # vmap builds the double-backward graph in one vectorised pass (a per-class loop would not).
        common = dict(cdf=self.cdf, tol=self.tol, differentiable=True, jacobian="vmap")
        if self.linearisation == "taylor":
            return Taylor(model, self.noise, batch_size=batch, **common)
        return MMSE(model, self.noise, n_samples=self.mmse_samples, batch_size=batch * self.mmse_samples, **common)

    def neg_log_p(self, model: nn.Module, x: Tensor, y: Tensor | None = None) -> Tensor:
        """-log p_robust per example: float64 [B], differentiable in the model's parameters."""
        target = y if self.target == "label" else None
        r = self.estimator(model, x.shape[0])(x.detach(), target)
        if self.cdf == "mv-sigmoid":
            # -log(1 / (1 + sum_i exp(-z_i))); z = +inf at the target drops out of the sum. The
            # z clamp keeps logsumexp finite (an inf there turns the zero gradient into NaN).
            return F.softplus(torch.logsumexp(-r.z.clamp_min(-1e4), dim=1)).clamp_max(-math.log(self.min_p))
        return -torch.log(r.p.clamp_min(self.min_p))

    def weight(self) -> float:
        """The weight the next call uses: mu, ramped over the first ``warmup_steps`` calls."""
        if self.warmup_steps == 0:
            return self.mu
        return self.mu * min(1.0, (self.calls + 1) / self.warmup_steps)

    def state_dict(self) -> dict:
        """What changes during training (the calls counted by the warm-up), for checkpoints."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` (a resumed training run)."""
        calls = state["calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"state['calls'] must be an integer >= 0, got {calls!r}")
        self.calls = calls

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor | None = None) -> Tensor:
        """The term to add to the batch's loss: a scalar in x's dtype."""
        weight = self.weight()
        self.calls += 1
        if weight == 0:
            return x.new_zeros(())
        if self.max_points is not None:
            x, y = x[: self.max_points], y[: self.max_points]
        return weight * self.neg_log_p(model, x, y).mean().to(x.dtype)
