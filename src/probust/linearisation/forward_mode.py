"""Forward-mode passes (Jacobian-vector products) without torch's work on tangents that are zero.

torch's forward-mode rules for convolution, linear layers and batch norm differentiate with
respect to every input, and under ``torch.func.jvp`` a module's weights enter with zero tangents:
a convolution then runs three convolutions (the output, the input's tangent and the zero weight's)
and an eval-mode batch norm recomputes its normalised input for the zero weight's term: on a
convolutional net, a large share of a forward-mode pass (docs/performance.md, "Forward mode").
:func:`jvp` is ``torch.func.jvp`` with those three rules replaced by ones that skip tangents that
are absent, and gives the same bits: the skipped terms are exact zeros (a sum with them changes
nothing but the sign of a zero), and the rules that remain are torch's own operations in torch's
own order (``tests/linearisation/test_forward_mode.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["jvp", "jvps"]

_CONVS = frozenset({F.conv1d, F.conv2d, F.conv3d})  # torch.convNd themselves (the same builtins)
_CONV_NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_DEFAULTS = (None, 1, 0, 1, 1)  # bias, stride, padding, dilation, groups
_BN_NAMES = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_BN_DEFAULTS = (None, None, False, 0.1, 1e-5)  # weight, bias, training, momentum, eps


def jvp(func: Callable[[Tensor], Any], primal: Tensor, tangent: Tensor) -> tuple[Any, Any]:
    """``torch.func.jvp(func, (primal,), (tangent,))``: (func(primal), its derivative along tangent).

    The same values, bit for bit, at less cost where ``func`` runs convolutions, linear layers or
    eval-mode batch norms whose parameters carry no tangent. Works under ``torch.func.vmap``.
    With grad mode on, torch's own rules run: the lean ones have no backward, and a caller there
    may differentiate the derivatives (gradient-norm training).
    """
    with contextlib.nullcontext() if torch.is_grad_enabled() else _LeanTangents():
        out = torch.func.jvp(func, (primal,), (tangent,))
    return out[0], out[1]


def jvps(
    func: Callable[[Tensor], Any], primal: Tensor, tangents: Tensor, chunk_size: int | None = None
) -> tuple[Any, Any]:
    """:func:`jvp` along each of K tangents [K, *primal.shape]: (func(primal), the K derivatives [K, ...]).

    torch.func.vmap batches the tangents only, so func's own pass runs once for all K, not once
    per tangent as it would for K stacked copies of the primal; the values are the same bits.
    ``chunk_size`` tangents at a time (None: all).
    """
    if chunk_size is None:
        unbatched_output: Any = (None, 0)  # torch's annotation leaves out None inside the tuple
        output, outputs_t = torch.func.vmap(lambda t: jvp(func, primal, t), out_dims=unbatched_output)(tangents)
        return output, outputs_t
    # vmap joins chunks along each output's out_dim, which None (an output the same for every
    # tangent) cannot be: the output is then expanded like the derivatives and its first row kept.
    outputs, outputs_t = torch.func.vmap(lambda t: jvp(func, primal, t), chunk_size=chunk_size)(tangents)
    return torch.utils._pytree.tree_map(lambda o: o[0], outputs), outputs_t


def _arguments(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: tuple) -> list[Any]:
    """Every argument of a call, by position: ``names`` in order, the last ``len(defaults)`` of
    them optional (their defaults)."""
    first_default = len(names) - len(defaults)
    return [
        args[i] if i < len(args) else kwargs.get(name, defaults[i - first_default] if i >= first_default else None)
        for i, name in enumerate(names)
    ]


class _LeanTangents(TorchFunctionMode):
    """Routes convolution, linear and eval-mode batch-norm calls to :class:`_Conv`, :class:`_Linear`
    and :class:`_BatchNormEval`, whose tangent rules skip absent tangents; every other call (and
    any form of these it does not recognise) runs as it would."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONVS and len(args) >= 2 and set(kwargs) <= set(_CONV_NAMES[2:]):
            x, weight, bias, stride, padding, dilation, groups = _arguments(args, kwargs, _CONV_NAMES, _CONV_DEFAULTS)
            if not isinstance(padding, str):
                return _Conv.apply(x, weight, bias, (func, stride, padding, dilation, groups))
        elif func is F.linear and len(args) >= 2 and set(kwargs) <= {"bias"}:
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return _Linear.apply(args[0], args[1], bias)
        elif func is F.batch_norm and len(args) >= 3 and set(kwargs) <= set(_BN_NAMES[3:]):
            x, mean, var, weight, bias, training, momentum, eps = _arguments(args, kwargs, _BN_NAMES, _BN_DEFAULTS)
            if not training and mean is not None and var is not None:
                return _BatchNormEval.apply(x, mean, var, weight, bias, (momentum, eps))
        return func(*args, **kwargs)


def _sum(terms: list[Tensor | None]) -> Tensor | None:
    present = [t for t in terms if t is not None]
    if not present:
        return None
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


class _Conv(torch.autograd.Function):
    """F.conv*d(x, weight, bias, ...) whose tangent is conv(x_t, weight) [+ conv(x, weight_t) + bias_t]."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None, options: tuple) -> Tensor:
        conv, stride, padding, dilation, groups = options
        return conv(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        x, weight, _, options = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(x, weight)
        ctx.options = options

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor | None, weight_t: Tensor | None, bias_t: Tensor | None, _: None) -> Tensor | None:
        x, weight = ctx.saved_tensors
        conv, stride, padding, dilation, groups = ctx.options
        terms: list[Tensor | None] = [
            None if x_t is None else conv(x_t, weight, None, stride, padding, dilation, groups),
            None if weight_t is None else conv(x, weight_t, None, stride, padding, dilation, groups),
            None if bias_t is None else bias_t.view(-1, *([1] * (x.dim() - 2))),
        ]
        return _sum(terms)


class _Linear(torch.autograd.Function):
    """F.linear(x, weight, bias) whose tangent is linear(x_t, weight) [+ linear(x, weight_t) + bias_t]."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(inputs[0], inputs[1])

    @staticmethod
    def jvp(ctx: Any, x_t: Tensor | None, weight_t: Tensor | None, bias_t: Tensor | None) -> Tensor | None:
        x, weight = ctx.saved_tensors
        terms: list[Tensor | None] = [
            None if x_t is None else F.linear(x_t, weight),
            None if weight_t is None else F.linear(x, weight_t),
            bias_t,
        ]
        return _sum(terms)


class _BatchNormEval(torch.autograd.Function):
    """Eval-mode F.batch_norm whose tangent is (x_t * (1 / sqrt(var + eps))) * weight, as torch's
    rule computes it [+ its terms for tangents of the weight and bias, where present]."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None, options: tuple
    ) -> Tensor:
        momentum, eps = options
        return F.batch_norm(x, mean, var, weight, bias, False, momentum, eps)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        x, mean, var, weight, _, options = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(x, mean, var, weight)
        ctx.eps = options[1]
        ctx.has_weight = weight is not None

    @staticmethod
    def jvp(
        ctx: Any,
        x_t: Tensor | None,
        mean_t: Tensor | None,
        var_t: Tensor | None,
        weight_t: Tensor | None,
        bias_t: Tensor | None,
        _: None,
    ) -> Tensor | None:
        if mean_t is not None or var_t is not None:
            raise RuntimeError("batch_norm is not differentiable wrt running_mean and running_var (as in torch)")
        x, mean, var, weight = ctx.saved_tensors
        if not ctx.has_weight:
            weight = None
        shape = (-1, *([1] * (x.dim() - 2)))
        invstd = (1 / torch.sqrt(var + ctx.eps)).view(shape)
        normalised_t = None if x_t is None else x_t * invstd
        if normalised_t is not None and weight is not None:
            normalised_t = normalised_t * weight.view(shape)
        terms: list[Tensor | None] = [
            normalised_t,
            None if weight_t is None else (x - mean.view(shape)) * invstd * weight_t.view(shape),
            None if bias_t is None else bias_t.view(shape),
        ]
        return _sum(terms)
