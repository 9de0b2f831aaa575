"""The model's last linear layer, through which every margin gradient is d backward passes instead of C - 1.

Most classifiers end in an ``nn.Linear``: logits f(x) = W h(x) + b with features h [B, d]. Every
margin g_i = f_t - f_i then has the gradient

    u_i = (W_t - W_i) J(x),    J = dh/dx [d, *S],

so the d rows of the features' Jacobian give all C - 1 margin gradients exactly (one small
matrix product), and the boundaries' covariance is u S u^T = A (J S J^T) A^T with A_i = W_t - W_i:
every z_i is known exactly from d backward passes. This pays where d < C - 1: the paper's CNN
(d = 50) at C = 100 or 1,000, a ResNet18 (d = 512) at C = 1,000. The result equals the direct
Jacobian's up to float rounding (the same products, summed in another order). Features held at
exactly 0 (a ReLU before the head) have zero rows and need no pass (the estimators check that
claim: :mod:`probust.linearisation.routes`); a trained ReLU network holds many of its features at 0
at any one point. The head route's arithmetic (A, u = A J and diag(A M A^T)) is in
:mod:`probust.linearisation.exact`; here are the head itself and a bound on its boundaries.

:func:`find_linear_head` finds such a layer by running the model once with hooks; it accepts a
layer only if the model returns that layer's output object unchanged and calls it once on a
[B, d] input, so anything applied after it (a temperature, an in-place edit) disables the path.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn


def find_linear_head(model: nn.Module, x: Tensor) -> nn.Linear | None:
    """The ``nn.Linear`` that computes the model's logits from features [B, d], or None.

    Args:
        model: maps [B, *S] to logits [B, C], in eval mode.
        x: a few inputs [b, *S] (one row suffices) to run the model on once.

    Returns the layer when the model's output is that layer's output object (nothing applied
    after it, checked again by recomputing it from its input), the layer ran exactly once and
    its input was 2-D; otherwise None (the caller then differentiates every margin directly).
    """
    if not isinstance(model, nn.Module) or isinstance(model, torch.jit.ScriptModule):
        return None  # a plain callable has no layers to find; TorchScript runs no Python hooks
    calls: list[tuple[nn.Module, tuple, object]] = []

    def record(module: nn.Module, args: tuple, out: object) -> None:
        calls.append((module, args, out))

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(out, Tensor) or out.ndim != 2:
        return None
    heads = [(module, args) for module, args, result in calls if result is out]
    if len(heads) != 1:
        return None
    head, args = heads[0]
    assert isinstance(head, nn.Linear)  # only Linear layers were hooked
    if sum(module is head for module, _, _ in calls) != 1 or len(args) != 1 or args[0].ndim != 2:
        return None
    with torch.no_grad():
        again = nn.functional.linear(args[0], head.weight, head.bias)
    if again.shape != out.shape or not torch.allclose(again, out, rtol=1e-5, atol=1e-6):
        return None  # edited in place after the layer
    return head


def boundary_norms_squared(head: nn.Linear, target: Tensor) -> Tensor:
    """float64 [B, C]: ||W_t - W_i||^2 for every class i (0 at the target), never below the exact value.

    From the rows' Gram entries ||W_t||^2 + ||W_i||^2 - 2 W_t . W_i in float64, one class row of
    dot products per distinct target: O(C d) per class present instead of the [B, C, d]
    differences. The float32 weights' products are exact in float64; the sums' rounding (at most
    d * 2^-53 of ||W_t||^2 + ||W_i||^2 each) is added, so the value bounds the norm from above
    (the screenings need an upper bound on each boundary's variance). A point's values depend only
    on its target and the head (one matrix-vector product of a fixed shape per target, BLAS like
    the head's own forward pass).
    """
    weight, norms = _float64_rows(head)
    classes, which = torch.unique(target, return_inverse=True)
    dots = torch.stack([torch.mv(weight, weight[k]) for k in classes.tolist()]) if len(classes) else norms[:0, None]
    total = norms[classes][:, None] + norms[None]
    slack = total * (4 * weight.shape[1] * 2.0**-53)
    out = (total - 2 * dots).clamp_min(0.0) + slack
    out.scatter_(1, classes[:, None], 0.0)
    return out[which]


_ROWS: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple[int, int, torch.device, torch.dtype], Tensor, Tensor]] = (
    weakref.WeakKeyDictionary()
)


def _float64_rows(head: nn.Linear) -> tuple[Tensor, Tensor]:
    """The head's weight in float64 [C, d] and its rows' squared norms [C], kept between calls
    until the weight changes (its version counter moves on every in-place update)."""
    weight = head.weight.detach()
    key = (weight._version, weight.data_ptr(), weight.device, weight.dtype)
    held = _ROWS.get(head)
    if held is not None and held[0] == key:
        return held[1], held[2]
    w64 = weight.to(torch.float64)
    norms = w64.square().sum(1)
    _ROWS[head] = (key, w64, norms)
    return w64, norms
