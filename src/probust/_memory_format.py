"""The channels_last memory format of a model's weights and of its inputs: layout only.

An execution plan (:mod:`probust.execution.tuning`) decides whether a convolutional model runs in
channels_last; the estimators' maths put their rows and the weights in that format with these two
helpers, which neither time nor plan anything (so the maths never call back into planning).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn


@contextlib.contextmanager
def weights_in_format(model: nn.Module, channels_last: bool) -> Iterator[None]:
    """Hold the model's 4-D parameters and buffers in channels_last, then give the originals back.

    The model's tensors are swapped (``.data``), not copied into: the caller's model, its
    optimiser state and its parameters' identities are untouched once the block exits.
    """
    if not channels_last:
        yield
        return
    swapped: list[tuple[Tensor, Tensor]] = []
    try:
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.ndim != 4:
                continue
            # Compared by strides, not is_contiguous: a weight with one input channel (a first
            # convolution on grey images) counts as channels_last-contiguous in its plain strides,
            # and convolving channels_last inputs with it takes a slower path.
            restrided = torch.empty_like(tensor.data, memory_format=torch.channels_last)
            if restrided.stride() != tensor.data.stride():
                swapped.append((tensor, tensor.data))
                tensor.data = restrided.copy_(tensor.data)
        yield
    finally:
        for tensor, original in swapped:
            tensor.data = original


def to_format(x: Tensor, channels_last: bool) -> Tensor:
    """``x`` in channels_last where ``channels_last`` (a copy unless it already is), else ``x`` itself."""
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


__all__ = ["to_format", "weights_in_format"]
