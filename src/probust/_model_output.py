"""The model contract: what a model may return, read the same way by the estimators and the runner.

A model maps float inputs [B, *S] to one of

    logits [B, C], C >= 2                           taken as they are
    a Mapping with a "logits" entry                 out["logits"]   (a Hugging Face ModelOutput's .logits)
    a tuple or list whose first item is [B, C]      out[0]          (e.g. (logits, features))

Anything else (another dict, a tensor of another shape, probabilities, a single logit) is refused
with one :class:`ModelOutputError` that says what to do. :func:`logits_reading` decides;
:func:`read_logits` applies the decision; :class:`LogitsOf` is the small module that returns
a model's logits (read this way, and with inputs cast to a low-precision model's own dtype), so
the code that differentiates the model still sees the user's own modules inside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from probust.errors import OptionError, ProbustError

__all__ = [
    "CONTRACT",
    "LogitsOf",
    "ModelCallError",
    "ModelOutputError",
    "Reading",
    "is_low_precision",
    "logits_model",
    "logits_reading",
    "output_problem",
    "parameter_dtype",
    "read_logits",
]

#: How logits are read from an output: the output itself, its "logits" entry, or its first item.
Reading = Literal["tensor", "logits", "first"]

#: The contract in words, for messages.
CONTRACT = "logits [B, C], a Hugging Face ModelOutput (its .logits) or a tuple whose first item is the logits"

_WRAP = "wrap the model in an nn.Module whose forward returns the logits tensor [B, C]"


class ModelOutputError(OptionError):
    """The model's output is not one the contract reads as logits (``field`` is ``"model"``)."""


class ModelCallError(ProbustError, ValueError):
    """The model raised on a few rows of ``x`` (``field`` is ``"x"``): the message names x's shape
    as it was read (a batch of B inputs of shape S); the model's own error is chained."""


def logits_reading(out: object, batch: int) -> Reading:
    """How to read logits from ``out``, a model's output for a batch of ``batch`` inputs.

    Raises:
        ModelOutputError: ``out`` is none of the accepted outputs, its logits are not [batch, C]
            with C >= 2, or they are probabilities; the message says what to do.
    """
    problem = output_problem(out, batch)
    if problem is not None:
        raise ModelOutputError(problem, field="model")
    return _reading(out)


def read_logits(out: Any, reading: Reading) -> Tensor:
    """The logits of ``out`` read as :func:`logits_reading` decided (no check: the hot path)."""
    if reading == "tensor":
        return out
    if reading == "logits":
        return out["logits"]
    return out[0]


def output_problem(out: object, batch: int) -> str | None:
    """What is wrong with a model's output for a batch of ``batch`` inputs, and what to do; None
    when the contract reads logits [batch, C] from it (:func:`logits_reading`)."""
    if isinstance(out, Tensor):
        return _logits_problem(out, batch, "returns")
    if isinstance(out, Mapping):
        keys = list(out.keys())
        shown = ", ".join(repr(k) for k in keys[:6]) + (", ..." if len(keys) > 6 else "")
        name = type(out).__name__
        if "logits" not in keys:
            example = f", e.g. out[{keys[0]!r}]" if keys else ""
            return f"returns a {name} (keys {shown}) without 'logits', expected {CONTRACT}; {_WRAP}{example}"
        logits = out["logits"]
        if not isinstance(logits, Tensor):
            return f"returns a {name} whose 'logits' is a {type(logits).__name__}, expected a tensor [B, C]; {_WRAP}"
        return _logits_problem(logits, batch, f"returns a {name} whose 'logits' are")
    if isinstance(out, Sequence) and not isinstance(out, (str, bytes)):
        items = list(out)
        kinds = ", ".join(_kind(v) for v in items[:4]) + (", ..." if len(items) > 4 else "")
        name = type(out).__name__
        if not items or not isinstance(items[0], Tensor) or items[0].ndim != 2 or items[0].shape[0] != batch:
            fits = [i for i, v in enumerate(items) if isinstance(v, Tensor) and v.ndim == 2 and v.shape[0] == batch]
            example = f", e.g. out[{fits[0]}]" if fits else ""
            return (
                f"returns a {name} ({kinds}) whose first item is not logits [B, C] for a batch of {batch}, "
                f"expected {CONTRACT}; {_WRAP}{example}"
            )
        return _logits_problem(items[0], batch, f"returns a {name} whose first item is")
    return f"returns a {type(out).__name__}, expected {CONTRACT}; {_WRAP}"


def parameter_dtype(model: object) -> torch.dtype | None:
    """The floating dtype ``model`` computes in (its first floating parameter's), or None for a
    callable without floating parameters."""
    if isinstance(model, nn.Module):
        for parameter in model.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return None


def logits_model(model: Any, reading: Reading, dtype: torch.dtype | None) -> Any:
    """``model`` itself where it returns logits and computes in float32 or float64, else
    :class:`LogitsOf` it (``dtype``: :func:`parameter_dtype`, cast to where it is low precision)."""
    input_dtype = dtype if is_low_precision(dtype) else None
    if reading == "tensor" and input_dtype is None:
        return model
    return LogitsOf(model, reading, input_dtype)


def is_low_precision(dtype: torch.dtype | None) -> bool:
    """A floating dtype with fewer than 32 bits (bfloat16, float16): noise is not added in it."""
    return dtype is not None and dtype.is_floating_point and dtype.itemsize < 4


class LogitsOf(nn.Module):
    """``model`` as a logits model: ``forward(x)`` returns float32 logits [B, C].

    Used only where ``model`` needs it (an output the contract unwraps, or a model computing in
    bfloat16 / float16); ``model`` is a submodule, so eval mode, memory formats, hooks and
    torch.func transforms reach its own modules.

    Args:
        model: the user's model (an ``nn.Module`` or any callable).
        reading: how its logits are read (:func:`logits_reading`).
        input_dtype: the dtype its inputs are cast to (a low-precision model's own), or None.
            The logits are then given back in float32: the estimators' arithmetic (margins,
            gradients, noise) runs in float32, the CDFs in float64, only the network in its dtype.
    """

    def __init__(self, model: Any, reading: Reading, input_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        self.reading: Reading = reading
        self.input_dtype = input_dtype

    def forward(self, x: Tensor) -> Tensor:
        if self.input_dtype is None:
            return read_logits(self.model(x), self.reading)
        # The cast is differentiable: gradients come back to x in x's own (float32) dtype.
        return read_logits(self.model(x.to(self.input_dtype)), self.reading).float()

    def extra_repr(self) -> str:
        dtype = "" if self.input_dtype is None else f", input_dtype={self.input_dtype}"
        return f"reading={self.reading!r}{dtype}"


def _reading(out: object) -> Reading:
    if isinstance(out, Tensor):
        return "tensor"
    if isinstance(out, Mapping):
        return "logits"
    return "first"


def _kind(value: object) -> str:
    return str(list(value.shape)) if isinstance(value, Tensor) else type(value).__name__


def _logits_problem(logits: Tensor, batch: int, subject: str) -> str | None:
    """What is wrong with a tensor read as the logits for ``batch`` inputs (``subject``: how the
    message names it), or None."""
    if logits.ndim != 2 or logits.shape[0] != batch:
        return f"{subject} {list(logits.shape)} for a batch of {batch}, expected logits [B, C] = [{batch}, classes]"
    if logits.shape[1] < 2:
        return (
            f"{subject} {list(logits.shape)}: one output per input, expected logits of at least 2 classes [B, C]; "
            "for a binary classifier's single logit z, return torch.cat([torch.zeros_like(z), z], dim=1)"
        )
    if not logits.is_floating_point():
        return f"{subject} {logits.dtype} values, expected float logits [B, C]"
    values = logits.detach().to(torch.float64)
    # A low-precision model's probabilities sum to 1 only up to its own rounding.
    tolerance = max(1e-5, 4 * torch.finfo(logits.dtype).eps)
    if bool((values >= 0).all()) and bool(torch.allclose(values.sum(1), torch.ones_like(values[:, 0]), atol=tolerance)):
        return (
            "returns probabilities (rows of non-negative values summing to 1), expected logits: remove the final "
            "softmax, or wrap it as forward(x) = torch.log(model(x).clamp_min(1e-12))"
        )
    return None
