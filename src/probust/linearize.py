"""Decision-boundary margins g_i = f_t - f_i and their input gradients, batched.

For a batch x [B, *S] with target classes t [B], the margins are g [B, C] with
g[b, i] = f_t(x_b) - f_i(x_b) (so g[b, t_b] == 0), and their gradients u [B, C, *S] with
u[b, t_b] == 0. Gradients come from one forward pass and a vmapped vector-Jacobian product
over the C cotangents e_t - e_i (torch.func), so the cost is one forward and C batched
backward passes (`logit_jacobian`); the margin gradients follow by a subtraction. Models that torch.func cannot trace (e.g. TorchScript) fall back to a
Python loop over classes with autograd.

Rows must not interact inside the model (true in eval mode: batch norm uses running stats).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn



def margins(logits: Tensor, target: Tensor) -> Tensor:
    """g [B, C] = logits[b, t_b] - logits[b, :] from logits [B, C] and targets [B]."""
    return logits.gather(1, target[:, None]) - logits


def _jacobian_torch_func(model: nn.Module, x: Tensor, class_chunk_size: int | None) -> tuple[Tensor, Tensor]:
    logits, pullback = torch.func.vjp(model, x)
    eye = torch.eye(logits.shape[1], device=logits.device, dtype=logits.dtype)
    cotangents = eye[:, None, :].expand(-1, logits.shape[0], -1)
    (grads,) = torch.func.vmap(pullback, chunk_size=class_chunk_size)(cotangents)
    return logits, grads.transpose(0, 1)


def _jacobian_autograd(model: nn.Module, x: Tensor, create_graph: bool = False) -> tuple[Tensor, Tensor]:
    if not (create_graph and x.requires_grad):
        x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x)
        classes = logits.shape[1]
        grads = [
            torch.autograd.grad(logits[:, i].sum(), x, retain_graph=create_graph or i < classes - 1, create_graph=create_graph)[0]
            for i in range(classes)
        ]
    return logits, torch.stack(grads, dim=1)


_FALLBACK_WARNED: set[type] = set()


def logit_jacobian(
    model: nn.Module, x: Tensor, *, class_chunk_size: int | None = None, differentiable: bool = False
) -> tuple[Tensor, Tensor]:
    """Logits [B, C] and their input Jacobian [B, C, *S] at x.

    Args:
        model: maps [B, *S] to logits [B, C]; rows must be independent (eval mode).
        x: inputs [B, *S].
        class_chunk_size: how many classes' backward passes run at once (bounds memory
            for large C); None means all C together.
        differentiable: keep the autograd graph, so that both outputs can be differentiated
            with respect to the model's parameters and (if it requires grad) ``x``; the default
            returns detached tensors. torch.func's vjp and vmap compose with ordinary autograd
            on the tensors they capture, so the Jacobian's own graph is built by the same
            vectorised pass (double backpropagation).
    """
    try:
        logits, grads = _jacobian_torch_func(model, x, class_chunk_size)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
        if type(model) not in _FALLBACK_WARNED:
            _FALLBACK_WARNED.add(type(model))
            warnings.warn(
                f"torch.func could not trace {type(model).__name__} ({exc.__class__.__name__}: {str(exc)[:120]}); "
                "computing gradients with one backward pass per class instead",
                RuntimeWarning,
                stacklevel=3,
            )
        logits, grads = _jacobian_autograd(model, x, create_graph=differentiable)
    if differentiable:
        return logits, grads
    return logits.detach(), grads.detach()


def margin_gradients(jacobian: Tensor, target: Tensor) -> Tensor:
    """u [B, C, *S] = grad f_t - grad f_i from the logit Jacobian [B, C, *S] (u[b, t_b] = 0)."""
    index = target.view(-1, 1, *([1] * (jacobian.ndim - 2))).expand(-1, 1, *jacobian.shape[2:])
    return jacobian.gather(1, index) - jacobian


def plan_blocks(points: int, samples: int, rows: int) -> Iterator[tuple[slice, int, int]]:
    """Split (points x samples) noisy copies into forward passes of at most ``rows`` rows.

    Yields (point slice, first sample, number of samples). Points are grouped when a whole
    point's samples fit in one pass; otherwise one point's samples are split into blocks.
    """
    per_point = min(samples, rows)
    group = max(1, rows // per_point)
    for first in range(0, points, group):
        for start in range(0, samples, per_point):
            yield slice(first, min(first + group, points)), start, min(per_point, samples - start)


def smoothed_margin_jacobian(
    model: nn.Module,
    x: Tensor,
    target: Tensor,
    eps: Tensor,
    *,
    batch_size: int,
    class_chunk_size: int | None = None,
    differentiable: bool = False,
) -> tuple[Tensor, Tensor]:
    """The MMSE (SmoothGrad) linearisation: mean of g and of grad g over noisy copies.

    Args:
        model, class_chunk_size, differentiable: as in :func:`logit_jacobian`.
        x: clean inputs [B, *S].
        target: long [B], the class whose boundaries are measured (fixed for all copies).
        eps: noise [B, N, *S]; copy j of point b is x[b] + eps[b, j].
        batch_size: the most rows in one forward/backward pass.

    Returns:
        (g_mean [B, C], u_mean [B, C, *S]), averaged over the N copies.
    """
    points, copies = eps.shape[:2]
    shape = x.shape[1:]
    rows = (x[:, None] + eps).reshape(points * copies, *shape)
    row_target = target.repeat_interleave(copies)
    row_point = torch.arange(points, device=x.device).repeat_interleave(copies)
    g_sum = u_sum = None
    for first in range(0, len(rows), batch_size):
        block = slice(first, first + batch_size)
        logits, jacobian = logit_jacobian(
            model, rows[block], class_chunk_size=class_chunk_size, differentiable=differentiable
        )
        g = margins(logits, row_target[block])
        u = margin_gradients(jacobian, row_target[block])
        if g_sum is None:
            g_sum = g.new_zeros(points, *g.shape[1:])
            u_sum = u.new_zeros(points, *u.shape[1:])
        if differentiable:  # out of place: the sums carry a graph
            g_sum = g_sum.index_add(0, row_point[block], g)
            u_sum = u_sum.index_add(0, row_point[block], u)
        else:
            g_sum.index_add_(0, row_point[block], g)
            u_sum.index_add_(0, row_point[block], u)
    return g_sum / copies, u_sum / copies


def project(u: Tensor, eps: Tensor) -> Tensor:
    """u_i . eps_j for every boundary and noise draw: u [B, C, *S], eps [B, n, *S] -> [B, n, C].

    With margins c [B, C] this evaluates the linearised model c + u . eps at every draw: one
    batched matrix product, far cheaper than a forward pass.
    """
    return torch.bmm(eps.flatten(2).to(u.dtype), u.flatten(2).transpose(1, 2))
