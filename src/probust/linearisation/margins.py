"""The margins' Jacobians and sketches for the Monte Carlo variants and the forward route.

For a batch x [B, *S] with target classes t [B], the margins g [B, C] with
g[b, i] = f_t(x_b) - f_i(x_b) (so g[b, t_b] == 0) and their gradients u [B, C, *S] with
u[b, t_b] == 0: pulls of the cotangents e_t - e_i (:func:`margin_jacobian`) or forward mode's
Jacobian (:mod:`probust.linearisation.pullback` runs both); :func:`margin_sketch` gives their
derivatives along random probes by forward mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from probust._inputs import check_target
from probust.linearisation import forward_mode
from probust.linearisation.pullback import Strategy, forward_jacobian, margins, other_classes, pull, unit_cotangents


def _finish(logits: Tensor, grads: Tensor, differentiable: bool) -> tuple[Tensor, Tensor]:
    if differentiable:
        return logits, grads
    return logits.detach(), grads.detach().contiguous()


def logit_jacobian(
    model: nn.Module,
    x: Tensor,
    *,
    class_chunk_size: int | None = None,
    differentiable: bool = False,
    strategy: Strategy | str = Strategy.VMAP,
    classes: Tensor | None = None,
    fallback: bool = True,
) -> tuple[Tensor, Tensor]:
    """Logits [B, C] and their input Jacobian [B, C, *S] at x, in one pass over the rows.

    Args:
        model: maps [B, *S] to logits [B, C]; rows must be independent (eval mode).
        x: inputs [B, *S].
        class_chunk_size: "vmap": how many classes' backward passes run at once; "forward":
            how many input coordinates' forward passes. None: all at once.
        differentiable: keep the autograd graph, so that both outputs can be differentiated
            with respect to the model's parameters and (if it requires grad) ``x``; the default
            returns detached tensors. torch.func's vjp and vmap compose with ordinary autograd
            on the tensors they capture, so the Jacobian's own graph is built by the same
            vectorised pass (double backpropagation).
        strategy: "vmap" (torch.func, vectorised over classes), "loop" (one backward pass per
            class) or "forward" (forward mode, one pass per input coordinate). All give the
            same Jacobian up to float rounding.
        classes: only these classes' rows of the Jacobian (int64 [k]).
        fallback: on a model torch.func cannot trace, fall back to "loop" with a
            :class:`TraceFallbackWarning` (False: raise).
    """
    if Strategy(strategy).whole_jacobian:
        logits, grads = forward_jacobian(
            model, x, chunk_size=class_chunk_size, differentiable=differentiable, fallback=fallback
        )
        return _finish(logits, grads if classes is None else grads[:, classes], differentiable)

    def wanted_cotangents(logits: Tensor) -> Tensor:
        every = unit_cotangents(logits)
        return every if classes is None else every[classes]

    logits, grads = pull(
        model,
        x,
        wanted_cotangents,
        strategy=strategy,
        chunk_size=class_chunk_size,
        differentiable=differentiable,
        fallback=fallback,
    )
    return _finish(logits, grads, differentiable)


def margin_jacobian(
    model: nn.Module,
    x: Tensor,
    target: Tensor | None = None,
    *,
    class_chunk_size: int | None = None,
    differentiable: bool = False,
    strategy: Strategy | str = Strategy.VMAP,
    fallback: bool = True,
    limit: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Logits [B, C], targets [B] and the margin gradients u [B, C, *S] at x.

    u[b, i] = grad (f_t - f_i)(x_b), u[b, t_b] = 0. With "loop" and "vmap" each margin is one
    backward pass of the cotangent e_t - e_i: C - 1 passes, one fewer than the full logit
    Jacobian. "forward" builds the Jacobian and subtracts.

    Args:
        model, class_chunk_size, differentiable, strategy, fallback: as in :func:`logit_jacobian`.
        x: inputs [B, *S].
        target: long [B], the class whose margins are taken; None: the prediction at x (a tie
            there is an error).
        limit: compute only the first ``limit`` margins and return them as [B, limit, *S] in
            the order of the other classes (for timing strategies).
    """
    holder: dict[str, Tensor] = {}

    def margin_cotangents(logits: Tensor) -> Tensor:
        t = check_target(target, logits)
        holder["target"] = t
        classes = logits.shape[1]
        others = other_classes(t, classes)
        if limit is not None:
            others = others[:, :limit]
        cot = torch.zeros(others.shape[1], logits.shape[0], classes, dtype=logits.dtype, device=logits.device)
        cot.scatter_(2, t.view(1, -1, 1).expand(others.shape[1], -1, 1), 1.0)
        cot.scatter_(2, others.T.unsqueeze(2), -1.0)
        return cot

    if Strategy(strategy).whole_jacobian:
        logits, jacobian = forward_jacobian(
            model, x, chunk_size=class_chunk_size, differentiable=differentiable, fallback=fallback
        )
        t = check_target(target, logits.detach())
        u = margin_gradients(jacobian, t)
        if limit is not None:
            u = u.gather(1, _expand_index(other_classes(t, logits.shape[1])[:, :limit], u))
        logits, u = _finish(logits, u, differentiable)
        return logits, t, u
    logits, grads = pull(
        model,
        x,
        margin_cotangents,
        strategy=strategy,
        chunk_size=class_chunk_size,
        differentiable=differentiable,
        fallback=fallback,
    )
    t = holder["target"]
    if limit is None:
        # Class c sits at position 0 (zeros) if it is the target, else at 1 + its rank among the others.
        n_classes = logits.shape[1]
        c = torch.arange(n_classes, device=t.device)
        position = torch.where(c == t[:, None], 0, torch.where(c < t[:, None], c + 1, c))
        padded = torch.cat([torch.zeros_like(grads[:, :1]), grads], dim=1)
        grads = padded.gather(1, _expand_index(position, padded))
    logits, grads = _finish(logits, grads, differentiable)
    return logits, t, grads


def _expand_index(index: Tensor, like: Tensor) -> Tensor:
    """An index [B, K] broadcast over the trailing input dimensions of ``like`` [B, *, *S]."""
    return index.view(*index.shape, *([1] * (like.ndim - 2))).expand(*index.shape, *like.shape[2:])


def margin_gradients(jacobian: Tensor, target: Tensor) -> Tensor:
    """u [B, C, *S] = grad f_t - grad f_i from the logit Jacobian [B, C, *S] (u[b, t_b] = 0)."""
    index = target.view(-1, 1, *([1] * (jacobian.ndim - 2))).expand(-1, 1, *jacobian.shape[2:])
    return jacobian.gather(1, index) - jacobian


def margin_sketch(
    model: nn.Module,
    x: Tensor,
    target: Tensor,
    probes: Tensor,
    *,
    batch_size: int,
    probe_chunk_size: int | None = None,
    to_rows: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Margins and their directional derivatives along random probes, for every class at once.

    One forward-mode Jacobian-vector product per probe gives grad g_i . v for all C classes:
    with probes v ~ N(0, S), each is N(0, u_i S u_i^T), which bounds every boundary's
    variance without its gradient (see :mod:`probust.linearisation.screening`).

    Args:
        model: maps [B, *S] to logits [B, C]; torch.func must run forward mode through it
            (otherwise torch.func's error propagates: the caller falls back).
        x: inputs [B, N, *S]: N copies of each point (MMSE's noisy copies; N = 1 for Taylor).
        target: long [B], the class whose margins are taken (the same for every copy).
        probes: [B, m, *S], the m probe directions of each point (shared by its copies).
        batch_size: the most rows (copies) per pass; each pass carries up to
            ``probe_chunk_size`` probes of each (the pass then holds batch_size x probe_chunk_size rows).
        probe_chunk_size: probes per pass (None: all m at once).
        to_rows: applied to each block of rows and of probes (e.g. a memory format).

    Returns:
        (g_mean [B, C], d_mean [B, m, C]): the margins and their derivatives along each
        probe, averaged over the copies (the derivative of the averaged margin: linear).
    """
    points, copies = x.shape[:2]
    shape = x.shape[2:]
    rows = x.reshape(points * copies, *shape)
    row_probes = probes.to(rows.dtype).repeat_interleave(copies, dim=0)  # [B N, m, *S]
    row_target = target.repeat_interleave(copies)
    probes_per_pass = probes.shape[1] if probe_chunk_size is None else min(probe_chunk_size, probes.shape[1])
    g_parts, d_parts = [], []
    with torch.no_grad():
        for first in range(0, len(rows), batch_size):
            block = slice(first, first + batch_size)
            t = row_target[block]
            n = len(t)
            pieces = []
            primal = rows[block] if to_rows is None else to_rows(rows[block])
            for start in range(0, probes.shape[1], probes_per_pass):
                tangent = row_probes[block, start : start + probes_per_pass].transpose(0, 1)  # [k, n, *S]
                k = tangent.shape[0]
                tangent = tangent.reshape(k * n, *shape)
                if to_rows is not None:
                    tangent = to_rows(tangent)
                # vmap batches the k probes' tangents and not the rows' forward pass, which runs
                # once instead of once per probe: the same bits as k stacked copies of the rows,
                # faster where a pass outweighs vmap's own overhead (docs/performance.md, "Forward mode").
                output, output_t = forward_mode.jvps(model, primal, tangent.view(k, n, *shape))
                out = output_t.view(k, n, -1).transpose(0, 1)  # [n, k, C]
                if start == 0:
                    g_parts.append(margins(output.view(n, -1), t))
                pieces.append(out.gather(2, t.view(-1, 1, 1).expand(-1, k, 1)) - out)
            d_parts.append(torch.cat(pieces, dim=1))
    g = torch.cat(g_parts).view(points, copies, -1).mean(dim=1)
    d = torch.cat(d_parts).view(points, copies, *d_parts[0].shape[1:]).mean(dim=1)
    return g, d
