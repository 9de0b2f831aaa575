"""MMSE: the margins and their gradients averaged over N noisy copies (SmoothGrad)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from probust._checks import check_choice, check_positive_int
from probust._inputs import check_target
from probust.estimators.linearised import Linearised
from probust.noise import STREAM_MMSE, Noise, point_keys

#: MMSE's noisy copies per point by default (the paper's N = 5): the estimator's, ``probust estimate``'s
#: ``--mmse-samples``, ``probust certify``'s ``--estimate-copies`` and the mc_cv / mc_is linearisation's.
DEFAULT_COPIES = 5


class MMSE(Linearised):
    """p_robust from the MMSE (SmoothGrad) linearisation: margins and gradients averaged
    over N noisy copies x + eps_j, eps_j drawn from the same noise.

    Args:
        model, sigma, seed, execution, cdf, tol, differentiable, p_fail, fail_rtol, prune, gradients,
            check_draws: see :class:`Taylor`. The routes and screenings work on the averaged linearisation
            (gradients, probes' pullbacks and derivatives averaged over the N copies, exactly the
            smoothed boundary's), so they keep the same guarantee. Differentiable MMSE
            differentiates through the N noisy copies with the noise held fixed (a pathwise
            gradient of the smoothed margins).
        n_samples: N, noisy copies per point (the paper uses 5 to 500).
        sampling: "centred" (default): for Gaussian noise the N draws are centred to sum to
            zero and rescaled by sqrt(N / (N - 1)), so each copy is still exactly N(0, S)
            (the average stays unbiased) while the linear part of the model cancels exactly:
            MMSE is exact for linear models at any N >= 2. "iid": independent draws, as in
            the paper. Non-Gaussian noise always uses independent draws.
        check_draws: the noise draws on which the model's verdict is compared with the
            linearisation's (``r.agreement``, :mod:`probust.estimators.trust`). None (default):
            the N noisy copies themselves, free: their linearised margins are known, and the
            model's verdict is read off the logits its pass on them computed; an int m > 0: up
            to m fresh draws of their own stream instead, in Taylor's stages (:class:`Taylor`);
            0: no check (``r.agreement`` is None). p does not depend on it.

    Raises:
        OptionError: as for :class:`Taylor`, and ``n_samples`` or ``sampling`` out of range (named).
    """

    base_method = "mmse"
    SAMPLINGS = ("centred", "iid")

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        n_samples: int = DEFAULT_COPIES,
        *,
        sampling: str = "centred",
        **kwargs,
    ) -> None:
        super().__init__(model, sigma, **kwargs)
        self.n_samples = check_positive_int(n_samples, "n_samples")
        check_choice(sampling, self.SAMPLINGS, "sampling")
        self.sampling = sampling

    @property
    def copies(self) -> int:  # type: ignore[override]
        return self.n_samples

    def _draws(self, keys: Tensor, shape: torch.Size) -> Tensor:
        """Noise [B, N, *S] for the N copies of each point."""
        eps = self.noise.sample(keys, 0, self.n_samples, shape)
        if self.sampling == "centred" and self.noise.is_gaussian and self.n_samples >= 2:
            # A linear map of Gaussians: each centred, rescaled draw is again exactly N(0, S).
            eps = (eps - eps.mean(dim=1, keepdim=True)) * (self.n_samples / (self.n_samples - 1)) ** 0.5
        return eps

    _instead = "use method 'mc' there, a smaller sigma, or more noisy copies (n_samples)"

    @property
    def _checks_own_copies(self) -> bool:
        return self.check_draws is None

    def _own_check_eps(self, x: Tensor, indices: Tensor) -> Tensor:
        # the copies the linearisation averaged over
        return self._draws(point_keys(self.seed, indices, STREAM_MMSE), x.shape[1:])

    def _target(self, x: Tensor, target: Tensor | None, clean_rows: int) -> Tensor:
        return check_target(target, self._clean_logits(x, clean_rows))  # the copies' predictions may differ

    def _copies(self, x: Tensor, indices: Tensor) -> Tensor:
        return x[:, None] + self._draws(point_keys(self.seed, indices, STREAM_MMSE), x.shape[1:])
