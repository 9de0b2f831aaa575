"""One backward pass of a cotangent, without torch's first-call import of its symbolic-shapes stack."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pull_back(
    output: Tensor,
    inputs: Tensor | Sequence[Tensor],
    cotangent: Tensor,
    *,
    retain_graph: bool = False,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> tuple[Tensor, ...]:
    """The gradients of <output, cotangent> with respect to ``inputs``: one backward pass.

    The same values, bit for bit, as ``torch.autograd.grad(output, inputs, cotangent, ...)``: the
    scalar's backward hands ``1.0 * cotangent`` (exact) to ``output``'s graph, which then runs as
    it would have. Why not that call itself: a tensor ``grad_outputs`` makes torch check its shape
    with torch.fx's symbolic-shapes module, and the first such call in a process imports it and
    sympy (0.85 s on the project's CPU with torch 2.14), where a scalar output needs no check. A
    plain loop of ``logits[:, j].sum()`` backward passes never pays that; Taylor and MMSE would, in
    every fresh process (docs/performance.md, "First use").

    Args:
        output: any shape; the graph to pull back through.
        inputs: the tensors to differentiate with respect to.
        cotangent: ``output``'s shape; cast to its dtype, as autograd casts a ``grad_outputs``.
        retain_graph, create_graph, allow_unused: as for ``torch.autograd.grad``.

    Returns:
        One gradient per input (None for an unused input where ``allow_unused``).
    """
    if cotangent.shape != output.shape:
        raise ValueError(f"cotangent shape {tuple(cotangent.shape)} differs from output shape {tuple(output.shape)}")
    with torch.enable_grad():  # recorded even where the caller runs without grad (a Function's backward)
        scalar = (output * cotangent.to(output.dtype)).sum()
    return torch.autograd.grad(
        scalar, inputs, retain_graph=retain_graph, create_graph=create_graph, allow_unused=allow_unused
    )


__all__ = ["pull_back"]
