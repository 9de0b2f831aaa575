"""How margin gradients are taken: the one engine every estimator's gradients go through.

Three strategies compute the same input gradients (up to float rounding):

- **loop**: one forward pass with autograd, then one backward pass per cotangent on the kept graph;
- **vmap**: torch.func's vjp, its pullback vectorised over the cotangents;
- **forward**: torch.func's forward mode, one Jacobian-vector product per input coordinate (few
  coordinates) or per probe (the sketch, :mod:`probust.linearisation.forward_mode`).

:class:`Pullback` is the one implementation of loop and vmap: it keeps one forward pass and
pulls any number of batches of cotangents on the model's features (the routes of
:mod:`probust.linearisation.routes`); :func:`pull` is a Pullback on the logits pulled once (the
Jacobian paths below, with their graph where they are differentiated).
Where the logits come from a linear head f = W h + b (:mod:`probust.linearisation.head`), u_i = J^T (W_t - W_i)
with J = dh/dx, so every gradient the estimators need is a pullback of a cotangent on the
features h: a boundary's (W_t - W_i), a basis vector e_k (row k of J), or a random probe.
Without a head the features are the logits themselves and a boundary's cotangent is e_t - e_i.

Where torch.func cannot transform a model, decided by one narrow test of the error torch raised
(:func:`cannot_trace`), vmap runs as the loop with a :class:`TraceFallbackWarning` and forward
mode's Jacobian as the loop; forward mode's availability for probes is one untimed probe per
model (:func:`forward_mode_runs`). Any other error propagates: a TypeError from a bug is never
read as "cannot trace".

Rows must not interact inside the model (eval mode), so a row's gradients do not depend on
the other rows of its pass.

The margins g [B, C] (:func:`margins`) and their Jacobians (:mod:`probust.linearisation.margins`)
are taken through it; :class:`JacobianPlan` is how a call runs them.
"""

from __future__ import annotations

import contextlib
import enum
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probust._user_model import PerModel
from probust.linearisation import forward_mode

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


class Strategy(str, enum.Enum):
    """How gradients are taken; each value is the name the ``jacobian`` setting gives it.

    The members compare equal to their names (a ``str`` subclass) and print as them.
    """

    LOOP = "loop"
    VMAP = "vmap"
    FORWARD = "forward"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def traced(self) -> bool:
        """Whether it runs through torch.func (whose first use imports its compiler stack, and
        which some models cannot trace)."""
        return self is not Strategy.LOOP

    @property
    def whole_jacobian(self) -> bool:
        """Whether one pass gives every class's gradient (forward mode: one probe per input
        coordinate), whatever margins were asked for."""
        return self is Strategy.FORWARD


@dataclass(frozen=True)
class JacobianPlan:
    """How to compute input Jacobians: strategy, rows per pass, classes per vmapped pass, and
    whether rows and weights run in channels_last (declared by :mod:`probust.execution`)."""

    strategy: Strategy
    rows: int
    class_chunk: int | None
    channels_last: bool

    def __post_init__(self) -> None:
        # A plan read back from the plan cache names its strategy.
        object.__setattr__(self, "strategy", Strategy(self.strategy))


#: The strategies' names, as the settings take them.
STRATEGIES = tuple(strategy.value for strategy in Strategy)


class TraceFallbackWarning(RuntimeWarning):
    """torch.func could not trace a model, so its gradients are computed with autograd, one
    backward pass at a time (the same numbers, more slowly). Issued with :func:`warnings.warn`:
    Python's default filter shows each message once per place, and a filter can silence or raise it."""


def features_and_logits(model: nn.Module, head: nn.Linear | None) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """x -> (features [B, F], logits [B, C]).

    With a head (see :func:`probust.linearisation.head.find_linear_head`), the model runs with its
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
            "vmap" (torch.func's pullback, vectorised over the cotangents).
        fallback: where torch.func cannot trace the model (:func:`cannot_trace`), "vmap" runs as
            "loop" with a :class:`TraceFallbackWarning`; False raises torch's error instead.
        differentiable: keep the autograd graph of the logits, features and gradients (double
            backpropagation, to the parameters and to ``rows`` where it requires grad); else
            all three are detached.

    Attributes:
        logits: [R, C].
        features: [R, F] (F = d, the head's inputs, or C).
    """

    def __init__(
        self,
        model: nn.Module,
        rows: Tensor,
        head: nn.Linear | None,
        *,
        strategy: Strategy | str = Strategy.LOOP,
        fallback: bool = True,
        differentiable: bool = False,
    ) -> None:
        self.shape = rows.shape[1:]
        self.differentiable = differentiable
        self._model, self._rows, self._fallback = model, rows, fallback
        self._run = features_and_logits(model, head)
        self._pullback: Callable[[Tensor], tuple[Tensor, ...]] | None = None
        if Strategy(strategy) is Strategy.VMAP:
            try:
                # (features, pullback, logits): torch's annotation knows only the pair without has_aux.
                features, pullback, *aux = torch.func.vjp(self._run, rows, has_aux=True)
                self._pullback, logits = pullback, aux[0]
            except RuntimeError as exc:  # NotImplementedError included
                if not (fallback and cannot_trace(exc)):
                    raise
                _warn_fallback(model, exc)
        if self._pullback is None:
            features, logits = self._record()
        self.logits = logits if differentiable else logits.detach()
        self.features = features if differentiable else features.detach()

    def _record(self) -> tuple[Tensor, Tensor]:
        """The forward pass with autograd that the loop pulls back through: (features, logits)."""
        rows = self._rows
        # Differentiated with respect to the input too: the caller's own tensor, not a copy.
        self._x = rows if self.differentiable and rows.requires_grad else rows.detach().requires_grad_(True)
        with torch.enable_grad():
            features, logits = self._run(self._x)
        self._graph = features
        return features, logits

    def pull(self, cotangents: Tensor, *, chunk_size: int | None = VMAP_STEP, pad: bool = True) -> Tensor:
        """The input gradients of cotangents [K, R, F] on the features: [R, K, *S].

        Row r of the result, k-th entry, is J_r^T cotangents[k, r] (J_r = dh/dx at row r).
        May be called any number of times.

        Args:
            chunk_size: cotangents per vmapped pullback (None: all at once); the loop takes one
                at a time.
            pad: pad the cotangents with zeros to a multiple of ``chunk_size``, so that every
                vmapped pass has the same shape whatever the count (the routes' pulls).
        """
        count = cotangents.shape[0]
        cotangents = cotangents.to(self.features.dtype)
        if count == 0:
            return cotangents.new_zeros(cotangents.shape[1], 0, *self.shape)
        if self._pullback is None:
            # Stacked along the rows' dimension: [R, K, *S] contiguous, no copy to transpose.
            return torch.stack(
                [
                    pull_back(self._graph, self._x, c, retain_graph=True, create_graph=self.differentiable)[0]
                    for c in cotangents
                ],
                dim=1,
            )
        step = count if chunk_size is None else chunk_size
        width = -(-count // step) * step if pad else count
        if width > count:
            cotangents = torch.cat([cotangents, cotangents.new_zeros(width - count, *cotangents.shape[1:])])
        # Without a graph to keep, no_grad stops autograd recording the pullback itself: each part
        # would keep its whole double-backward graph alive until the cat, memory that grows with
        # the cotangents pulled (tens of gigabytes for a ViT-B's 768 features).
        try:
            with contextlib.nullcontext() if self.differentiable else torch.no_grad():
                parts = [torch.func.vmap(self._pullback)(cotangents[k : k + step])[0] for k in range(0, width, step)]
        except RuntimeError as exc:  # a batching rule torch.func lacks shows only when vmapped
            if not (self._fallback and cannot_trace(exc)):
                raise
            _warn_fallback(self._model, exc)
            self._pullback = None
            self._record()  # the same logits and features, now with the graph the loop needs
            return self.pull(cotangents[:count])
        grads = parts[0] if len(parts) == 1 else torch.cat(parts)
        return grads[:count].transpose(0, 1)


def _warn_fallback(model: nn.Module, exc: Exception) -> None:
    warnings.warn(
        f"torch.func could not trace {type(model).__name__} ({exc.__class__.__name__}: {str(exc)[:120]}); "
        "computing gradients with one backward pass per cotangent instead",
        TraceFallbackWarning,
        stacklevel=4,
    )


def _jacobian_forward(
    model: nn.Module, x: Tensor, tangent_chunk_size: int | None, differentiable: bool
) -> tuple[Tensor, Tensor]:
    """Forward mode: one Jacobian-vector product per input coordinate (cheap for few coordinates)."""
    d = x[0].numel()
    basis = torch.eye(d, device=x.device, dtype=x.dtype).view(d, 1, *x.shape[1:]).expand(-1, x.shape[0], *x.shape[1:])
    # Without a graph to keep, no_grad lets forward_mode skip the weights' zero tangents.
    with contextlib.nullcontext() if differentiable else torch.no_grad():
        logits, columns = forward_mode.jvps(model, x, basis, tangent_chunk_size)  # [B, C], [d, B, C]
    return logits, columns.permute(1, 2, 0).reshape(x.shape[0], -1, *x.shape[1:])


def pull(
    model: nn.Module,
    x: Tensor,
    cotangents_of: Callable[[Tensor], Tensor],
    *,
    strategy: Strategy | str,
    chunk_size: int | None = None,
    differentiable: bool = False,
    fallback: bool = True,
) -> tuple[Tensor, Tensor]:
    """Logits [B, C] and the input gradients [B, K, *S] of the K cotangents [K, B, C] that
    ``cotangents_of(logits)`` gives, from one forward pass over the rows ``x`` [B, *S]: a
    :class:`Pullback` on the logits, pulled once.

    Args:
        strategy: "loop" (one autograd backward pass per cotangent on the kept graph) or "vmap"
            (torch.func's vjp, vectorised over the cotangents, ``chunk_size`` at a time; None:
            all at once). Both give the same gradients up to float rounding.
        differentiable: keep the autograd graph (double backpropagation), else detached.
        fallback: as for :class:`Pullback`.
    """
    pullback = Pullback(model, x, None, strategy=strategy, fallback=fallback, differentiable=differentiable)
    cotangents = cotangents_of(pullback.logits.detach())
    return pullback.logits, pullback.pull(cotangents, chunk_size=chunk_size, pad=False)


def forward_jacobian(
    model: nn.Module, x: Tensor, *, chunk_size: int | None = None, differentiable: bool = False, fallback: bool = True
) -> tuple[Tensor, Tensor]:
    """Logits [B, C] and their full input Jacobian [B, C, *S] by forward mode (one
    Jacobian-vector product per input coordinate, ``chunk_size`` at a time); where torch.func
    cannot run forward mode through the model (:func:`cannot_trace`), by the reverse-mode loop
    (one backward pass per class), unless ``fallback`` is False."""
    try:
        return _jacobian_forward(model, x, chunk_size, differentiable)
    except RuntimeError as exc:  # NotImplementedError included
        if not (fallback and cannot_trace(exc)):
            raise
        pullback = Pullback(model, x, None, differentiable=differentiable)
        return pullback.logits, pullback.pull(unit_cotangents(pullback.logits.detach()))


def unit_cotangents(logits: Tensor) -> Tensor:
    """e_c for every class c: [C, B, C]."""
    eye = torch.eye(logits.shape[1], device=logits.device, dtype=logits.dtype)
    return eye[:, None, :].expand(-1, logits.shape[0], -1)


_RUNS: PerModel[bool] = PerModel()


def forward_mode_runs(model: nn.Module, x: Tensor) -> bool:
    """Whether torch.func's forward mode runs through ``model`` on rows like ``x`` [B, *S]: one
    probe of one row, untimed, kept per model object and input shape while the model's structure
    stays (:mod:`probust._user_model`). False only where torch
    says it cannot (:func:`cannot_trace`, e.g. CPU flash attention has no forward-mode
    formula); any other error propagates."""
    key = (x.device, x.dtype, tuple(x.shape[1:]))
    known = _RUNS.get(model, key)
    if known is not None:
        return known
    row = x[:1].detach()
    try:
        with torch.no_grad():
            forward_mode.jvps(model, row, torch.ones_like(row)[None])
        runs = True
    except RuntimeError as exc:  # NotImplementedError included
        if not cannot_trace(exc):
            raise
        runs = False
    _RUNS.put(model, key, runs)
    return runs


# ---------------------------------------------------------------- one backward pass


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
    sympy, where a scalar output needs no check. A plain loop of ``logits[:, j].sum()`` backward
    passes never pays that import; Taylor and MMSE would, in every fresh process
    (docs/performance.md, "First use").

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


# ---------------------------------------------------------------- the margins


def margins(logits: Tensor, target: Tensor) -> Tensor:
    """g [B, C] = logits[b, t_b] - logits[b, :] from logits [B, C] and targets [B]."""
    return logits.gather(1, target[:, None]) - logits


def other_classes(target: Tensor, classes: int) -> Tensor:
    """int64 [B, C-1]: for each point the class indices other than its target, in order."""
    everything = torch.arange(classes, device=target.device).expand(len(target), classes)
    return everything[everything != target[:, None]].view(len(target), classes - 1)
