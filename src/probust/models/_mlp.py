"""A multilayer perceptron for flat inputs (tables): the ``mlp`` architecture."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import Tensor, nn


class MLP(nn.Module):
    """Standardise -> (linear -> ReLU) per hidden layer -> linear, on the flattened input.

    Maps ``[B, *input_shape]`` float32 to logits ``[B, num_classes]``. The standardisation
    ``(x - mean) / std`` is a layer (buffers), so inputs and noise ``sigma`` stay in the data's
    own units (for a table: each feature's units).

    Args:
        num_classes: number of logits C.
        input_shape: shape of one input, e.g. ``(13,)`` for 13 features.
        hidden: widths of the hidden layers (default two of 64).
        mean, std: per-feature statistics (1 value, one per first-axis entry, or one per
            coordinate); None: 0 and 1.
    """

    arch = "mlp"

    def __init__(
        self,
        num_classes: int = 2,
        input_shape: Sequence[int] = (10,),
        hidden: Sequence[int] = (64, 64),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        shape = tuple(int(s) for s in input_shape)
        d = prod(shape)
        self.register_buffer("mean", _stat(mean, 0.0, shape, "mean"))
        self.register_buffer("std", _stat(std, 1.0, shape, "std"))
        if (self.std <= 0).any():
            raise ValueError(f"std must be positive, got {self.std.flatten().tolist()[:5]}...")
        widths = [d, *[int(h) for h in hidden]]
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.net = nn.Sequential(*layers)
        self.hidden = [int(h) for h in hidden]

    mean: Tensor
    std: Tensor

    def rebuild_kwargs(self) -> dict:
        """What :func:`probust.models.build` needs besides the shape to rebuild this model (mean and
        std are buffers: they come back with the state_dict)."""
        return {"hidden": self.hidden}

    def forward(self, x: Tensor) -> Tensor:
        return self.net(((x - self.mean) / self.std).flatten(1))


def _stat(values: Sequence[float] | None, default: float, shape: tuple[int, ...], name: str) -> Tensor:
    """A statistic broadcast to ``shape``: from 1 value, one per first-axis entry, or one per coordinate."""
    t = torch.as_tensor(list(values) if values is not None else [default], dtype=torch.float32).flatten()
    if t.numel() == 1:
        return t.expand(shape).clone()
    if t.numel() == prod(shape):
        return t.view(shape).clone()
    if t.numel() == shape[0]:
        return t.view(shape[0], *([1] * (len(shape) - 1))).expand(shape).clone()
    raise ValueError(f"{name} must have 1, {shape[0]} or {prod(shape)} values, got {t.numel()}")
