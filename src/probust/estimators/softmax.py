"""The softmax baseline: the model's own confidence, independent of any noise."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from probust._checks import check_positive_float
from probust._inputs import check_target
from probust.estimators.base import Estimator
from probust.estimators.result import Estimate


class Softmax(Estimator):
    """The softmax baseline: p = softmax(f(x) / T)_t. Independent of any noise.

    Args:
        model, seed, execution: see :class:`Estimator`.
        temperature: T > 0.
    """

    method = "softmax"

    def __init__(self, model: nn.Module, temperature: float = 1.0, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.temperature = check_positive_float(temperature, "temperature")

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        logits = self._clean_logits(x)
        target = check_target(target, logits)
        probs = torch.softmax(logits.to(torch.float64) / self.temperature, dim=1)
        return Estimate(p=probs.gather(1, target[:, None]).squeeze(1), target=target, method=self.method)
