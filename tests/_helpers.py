"""Helpers shared by test files: small models whose exact p_robust is known, and test points.

Import as ``from tests._helpers import ...`` (test files never import each other).
"""

from __future__ import annotations

import torch
from torch import nn

import probust


def linear_model(d: int, classes: int, seed: int = 0) -> nn.Linear:
    """A random linear classifier on R^d (its decision boundaries are exactly linear)."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Linear(d, classes)
    with torch.no_grad():
        model.weight.copy_(torch.randn(classes, d, generator=gen))
        model.bias.copy_(torch.randn(classes, generator=gen))
    return model


def points_near_boundaries(model: nn.Linear, n: int, sigma: float, seed: int = 1) -> torch.Tensor:
    """Points whose p_robust is spread over (0, 1) at this sigma: small-norm inputs."""
    gen = torch.Generator().manual_seed(seed)
    d = model.in_features
    return torch.randn(n, d, generator=gen) * (sigma * 0.6)


def inside(p: torch.Tensor, mc: probust.Estimate, slack: float = 0.0) -> torch.Tensor:
    """Which of ``p`` lie in the Monte Carlo estimate's interval, widened by ``slack``."""
    return (p >= mc.ci_low - slack) & (p <= mc.ci_high + slack)


class TinyCNN(nn.Module):
    """A convolutional classifier on [B, 1, 8, 8] with a BatchNorm and a Dropout (train mode differs
    from eval mode), ``classes`` logits, and non-trivial BatchNorm running statistics."""

    def __init__(self, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(4 * 8 * 8, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if p.ndim > 1 else 0.2))
            self.norm.running_mean.copy_(torch.randn(4, generator=gen) * 0.1)
            self.norm.running_var.copy_(torch.rand(4, generator=gen) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.tanh(self.norm(self.conv(x))))
        return self.head(h.flatten(1))
