"""Input gradients of any cotangents on a model's features, from one forward pass.

Taylor and MMSE need u_i = grad (f_t - f_i)(x) for some boundaries i: one backward pass per
boundary. Where the logits come from a linear head f = W h + b (:mod:`probust.linear_head`),
u_i = J^T (W_t - W_i) with J = dh/dx, so every gradient the estimators need is a pullback of
a cotangent on the features h: a boundary's (W_t - W_i), a basis vector e_k (row k of J), or
a random probe. Without a head the features are the logits themselves and a boundary's
cotangent is e_t - e_i.

:class:`Pullback` runs the forward pass once, with autograd, and then pulls back as many
batches of cotangents as the caller asks for on the same graph: the estimators first pull a
few random probes to bound every boundary's variance, then the exact gradients of only the
boundaries that can matter (:mod:`probust.estimators.routes`).

Rows must not interact inside the model (eval mode), so a row's gradients do not depend on
the other rows of its pass.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from probust._autograd import pull_back

#: Cotangents per vmapped pullback: a fixed width, so that every vmapped pass has the same
#: shape whatever the other rows of its block need (BLAS rounding depends on shapes).
VMAP_STEP = 8

#: Words of torch's own messages when torch.func (vjp, vmap, jvp) cannot transform an operation:
#: an autograd.Function without ``setup_context``, an operator without a forward-mode formula
#: (CPU flash attention), a missing batching rule, data-dependent control flow under vmap.
_TRACE_MESSAGES = (
    "functorch",
    "torch.func",
    "vmap",
    "forward ad",
    "forward-mode",
    "setup_context",
    "batching rule",
    "jvp",
    "not implemented",
    "not supported",
    "does not support",
)


def cannot_trace(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a torch.func transform of a model, says torch.func cannot
    transform it (then autograd's plain backward passes give the same gradients).

    Narrow on purpose: a NotImplementedError, or a RuntimeError whose message is one of torch's
    about its transforms (:data:`_TRACE_MESSAGES`). Any other error (a TypeError or an
    AttributeError from a bug, in probust or in the model; a RuntimeError of shapes) is not a
    tracing limit and propagates. A model's own NotImplementedError is read as one, but the
    fallback runs the model again and raises it there.
    """
    if isinstance(exc, NotImplementedError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    message = str(exc).lower()
    return any(words in message for words in _TRACE_MESSAGES)


class TraceFallbackWarning(RuntimeWarning):
    """torch.func could not trace a model, so its gradients are computed with autograd, one
    backward pass at a time (the same numbers, more slowly). Issued with :func:`warnings.warn`:
    Python's default filter shows each message once per place, and a filter can silence or raise it."""


def features_and_logits(model: nn.Module, head: nn.Linear | None) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """x -> (features [B, F], logits [B, C]).

    With a head (see :func:`probust.linear_head.find_linear_head`), the model runs with its
    head's output swapped for the head's input, so that the model returns the features h
    (nothing follows the head) while the logits are kept aside. Without one, the features
    are the logits.
    """
    if head is None:

        def plain(x: Tensor) -> tuple[Tensor, Tensor]:
            logits = model(x)
            return logits, logits

        return plain

    def swapped(x: Tensor) -> tuple[Tensor, Tensor]:
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

    return swapped


class Pullback:
    """One forward pass with autograd over ``rows``, then pullbacks of feature cotangents.

    Args:
        model: maps [R, *S] to logits [R, C], in eval mode.
        rows: inputs [R, *S] (in the memory format the caller chose).
        head: the model's linear head, or None (the features are then the logits).
        strategy: "loop" (one autograd backward pass per cotangent, on the retained graph) or
            "vmap" (torch.func's pullback, vectorised over :data:`VMAP_STEP` cotangents at a
            time). A model torch.func cannot trace falls back to "loop" with a TraceFallbackWarning.

    Attributes:
        logits: [R, C], detached.
        features: [R, F], detached (F = d, the head's inputs, or C).
    """

    def __init__(self, model: nn.Module, rows: Tensor, head: nn.Linear | None, *, strategy: str = "loop") -> None:
        self.shape = rows.shape[1:]
        run = features_and_logits(model, head)
        self._pullback: Callable[[Tensor], tuple[Tensor, ...]] | None = None
        if strategy == "vmap":
            try:
                # (features, pullback, logits): torch's annotation knows only the pair without has_aux.
                features, pullback, *aux = torch.func.vjp(run, rows, has_aux=True)
                self._pullback, logits = pullback, aux[0]
            except (RuntimeError, NotImplementedError) as exc:
                if not cannot_trace(exc):
                    raise
                _warn_fallback(model, exc)
        if self._pullback is None:
            self._x = rows.detach().requires_grad_(True)
            with torch.enable_grad():
                features, logits = run(self._x)
            self._graph = features
        self.logits = logits.detach()
        self.features = features.detach()

    def pull(self, cotangents: Tensor) -> Tensor:
        """The input gradients of cotangents [K, R, F] on the features: [R, K, *S].

        Row r of the result, k-th entry, is J_r^T cotangents[k, r] (J_r = dh/dx at row r).
        May be called any number of times.
        """
        count = cotangents.shape[0]
        cotangents = cotangents.to(self.features.dtype)
        if count == 0:
            return cotangents.new_zeros(cotangents.shape[1], 0, *self.shape)
        if self._pullback is not None:
            width = -(-count // VMAP_STEP) * VMAP_STEP
            if width > count:
                cotangents = torch.cat([cotangents, cotangents.new_zeros(width - count, *cotangents.shape[1:])])
            # The result is detached, so no graph back to the parameters is wanted: without
            # no_grad each part would keep its whole double-backward graph alive until the cat
            # (about 260 MB per 8 cotangents on a 2-layer ViT-B/16, 24 GB at d = 768).
            with torch.no_grad():
                parts = [
                    torch.func.vmap(self._pullback)(cotangents[k : k + VMAP_STEP])[0]
                    for k in range(0, width, VMAP_STEP)
                ]
            grads = torch.cat(parts)[:count]
        else:
            grads = torch.stack([pull_back(self._graph, self._x, c, retain_graph=True)[0] for c in cotangents])
        return grads.detach().transpose(0, 1)


def _warn_fallback(model: nn.Module, exc: Exception) -> None:
    warnings.warn(
        f"torch.func could not trace {type(model).__name__} ({exc.__class__.__name__}: {str(exc)[:120]}); "
        "computing gradients with one backward pass per cotangent instead",
        TraceFallbackWarning,
        stacklevel=4,
    )
