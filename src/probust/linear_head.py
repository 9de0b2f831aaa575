"""Margin gradients through the model's last linear layer: d backward passes instead of C - 1.

Most classifiers end in an ``nn.Linear``: logits f(x) = W h(x) + b with features h [B, d]. Every
margin g_i = f_t - f_i then has the gradient

    u_i = (W_t - W_i) J(x),    J = dh/dx [d, *S],

so the d rows of the features' Jacobian give all C - 1 margin gradients exactly (one small
matrix product), and the boundaries' covariance is u S u^T = A (J S J^T) A^T with A_i = W_t - W_i:
every z_i is known exactly from d backward passes. This pays where d < C - 1: the paper's CNN
(d = 50) at C = 100 or 1,000, a ResNet18 (d = 512) at C = 1,000. The result equals the direct
Jacobian's up to float rounding (the same products, summed in another order). Features held at
exactly 0 (a ReLU before the head) have zero rows and are skipped, after a check: the trained
CNNs of benchmarks/prune_models.py keep about 16 of their 50 features alive per point.

:func:`find_linear_head` finds such a layer by running the model once with hooks; it accepts a
layer only if the model returns that layer's output object unchanged and calls it once on a
[B, d] input, so anything applied after it (a temperature, an in-place edit) disables the path.
"""

from __future__ import annotations

from collections.abc import Callable

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


_STEP = 8  # feature rows per vmapped pullback (see feature_jacobian)


def pays(head: nn.Linear | None, margins: int) -> bool:
    """Whether the head path needs fewer backward passes than ``margins`` direct ones."""
    return head is not None and head.in_features < margins


def _features_and_logits(model: nn.Module, head: nn.Linear) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """x -> (features h [B, d], logits [B, C]): the model run with its head's output swapped for
    the head's input, so that the model returns h (nothing follows the head: see
    :func:`find_linear_head`), while the logits are kept aside."""

    def run(x: Tensor) -> tuple[Tensor, Tensor]:
        box: dict[str, Tensor] = {}

        def swap(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
            box["logits"] = out
            return args[0]

        hook = head.register_forward_hook(swap)
        try:
            features = model(x)
        finally:
            hook.remove()
        return features, box["logits"]

    return run


def feature_jacobian(
    model: nn.Module,
    head: nn.Linear,
    x: Tensor,
    *,
    strategy: str = "vmap",
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits [B, C] and the features' input Jacobian J [B, d, *S] at x (no autograd graph).

    Only the rows of features that are not exactly 0 are pulled back, each point its own: a
    feature held at 0 by a ReLU (most of a trained ReLU network's, often) has a zero row. One
    extra pass checks that claim: the dead features' rows, combined with random weights, must
    pull back to exactly 0 (a nonzero row would survive the combination with probability 1);
    a point that fails it gets every row.

    Args:
        model, head: the model and its linear head (:func:`find_linear_head`).
        x: inputs [B, *S].
        strategy: "vmap" (torch.func, vectorised over the rows; ``chunk_size`` at once) or
            "loop" (one autograd backward pass per row).
    """
    run = _features_and_logits(model, head)
    pull: Callable[[Tensor], Tensor]
    if strategy == "loop":
        x_in = x.detach().requires_grad_(True)
        with torch.enable_grad():
            graph, logits = run(x_in)
        features = graph

        def pull(cotangents: Tensor) -> Tensor:
            rows = [torch.autograd.grad(graph, x_in, c, retain_graph=True)[0] for c in cotangents]
            return torch.stack(rows)

    else:
        # (features, pullback, logits): torch's annotation knows only the pair without has_aux.
        features, pullback, *aux = torch.func.vjp(run, x, has_aux=True)
        logits = aux[0]

        def pull(cotangents: Tensor) -> Tensor:
            return torch.func.vmap(pullback, chunk_size=step)(cotangents)[0]

    # The rows are pulled back `step` at a time, and their count is padded to a multiple of it:
    # every vmapped pass has the same shape whatever the other points of the block keep alive,
    # so a point's rows do not depend on its block (as with the direct path's C - 1 passes).
    step = min(_STEP, chunk_size or _STEP)
    features = features.detach()
    alive = _alive(features, pull)
    # Row k of each point: its k-th alive feature (a zero cotangent past its count).
    count = alive.sum(1)
    width = -(-max(int(count.max()), 1) // step) * step
    which = torch.argsort((~alive).to(torch.int8), dim=1, stable=True)  # [B, d]
    which = torch.cat([which, which[:, :1].expand(-1, max(width - which.shape[1], 0))], dim=1)[:, :width]
    used = torch.arange(width, device=x.device) < count[:, None]
    cotangents = torch.zeros(width, *features.shape, dtype=features.dtype, device=x.device)
    cotangents.scatter_(2, which.T.unsqueeze(2), used.T.unsqueeze(2).to(features.dtype))
    rows = pull(cotangents).transpose(0, 1).detach()  # [B, width, *S]
    jacobian = rows.new_zeros(x.shape[0], features.shape[1], *x.shape[1:])
    index = which.view(*which.shape, *([1] * (x.ndim - 1))).expand_as(rows)
    jacobian.scatter_add_(1, index, torch.where(used.view(*used.shape, *([1] * (x.ndim - 1))), rows, 0.0))
    return logits.detach(), jacobian


def _alive(features: Tensor, pull: Callable[[Tensor], Tensor]) -> Tensor:
    """bool [B, d]: the features whose Jacobian rows must be computed (all but checked zeros)."""
    dead = features == 0
    if not bool(dead.any()):
        return ~dead
    weights = torch.randn(features.shape, generator=torch.Generator().manual_seed(0), dtype=features.dtype)
    probe = torch.where(dead, weights.to(features.device), 0.0)
    combined = pull(probe[None])[0].detach()
    zero_rows = (combined.flatten(1) == 0).all(1)
    return ~(dead & zero_rows[:, None])


def boundary_weights(head: nn.Linear, target: Tensor, classes: Tensor | None = None) -> Tensor:
    """A [B, K, d] = W_t - W_i for the classes i (int64 [B, K]; None: all C, zero at the target).

    Detached: the head path serves estimates without a graph (``differentiable`` goes direct)."""
    weight = head.weight.detach()
    rows = weight[None].expand(len(target), -1, -1) if classes is None else weight[classes]
    return weight[target][:, None] - rows


def margin_normals(weights: Tensor, jacobian: Tensor) -> Tensor:
    """u [B, K, *S] = A J from boundary weights A [B, K, d] and the features' Jacobian J [B, d, *S]."""
    flat = torch.bmm(weights.to(jacobian.dtype), jacobian.flatten(2))
    return flat.view(*flat.shape[:2], *jacobian.shape[2:])


def boundary_variances(weights: Tensor, feature_form: Tensor) -> Tensor:
    """u_i S u_i^T for every boundary, float64 [B, K]: diag(A M A^T), M = J S J^T [B, d, d]."""
    a = weights.to(torch.float64)
    return torch.einsum("bkd,bde,bke->bk", a, feature_form, a)


def averaged_feature_jacobian(
    model: nn.Module,
    head: nn.Linear,
    copies: Tensor,
    *,
    batch_size: int,
    strategy: str = "vmap",
    chunk_size: int | None = None,
    to_rows: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits and the features' Jacobian averaged over each point's copies (MMSE's noisy copies;
    one copy, the point itself, for Taylor): (logits [B, C], J [B, d, *S]).

    Args:
        copies: [B, N, *S], N inputs per point.
        batch_size: the most rows (copies) per pass.
        strategy, chunk_size: as in :func:`feature_jacobian`.
        to_rows: applied to each block of rows before the model sees it (e.g. a memory format).

    Averaging J averages every margin's gradient: u_i = (W_t - W_i) J is linear in J.
    """
    points, n = copies.shape[:2]
    rows = copies.reshape(points * n, *copies.shape[2:])
    row_point = torch.arange(points, device=copies.device).repeat_interleave(n)
    logit_sum = jacobian_sum = None
    for first in range(0, len(rows), batch_size):
        block = slice(first, first + batch_size)
        inputs = rows[block] if to_rows is None else to_rows(rows[block])
        logits, jacobian = feature_jacobian(model, head, inputs, strategy=strategy, chunk_size=chunk_size)
        if logit_sum is None or jacobian_sum is None:
            logit_sum = logits.new_zeros(points, logits.shape[1])
            jacobian_sum = jacobian.new_zeros(points, *jacobian.shape[1:])
        logit_sum.index_add_(0, row_point[block], logits)
        jacobian_sum.index_add_(0, row_point[block], jacobian.contiguous())
    assert logit_sum is not None and jacobian_sum is not None  # points >= 1: the loop ran
    return logit_sum / n, jacobian_sum / n
