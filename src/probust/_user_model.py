"""The user's model, as probust reads it: its output contract, the facts kept per model object,
and the memory format its weights and inputs run in.

**The output contract.** A model maps float inputs [B, *S] to one of

    logits [B, C], C >= 2                           taken as they are
    a Mapping with a "logits" entry                 out["logits"]   (a Hugging Face ModelOutput's .logits)
    a tuple or list whose first item is [B, C]      out[0]          (e.g. (logits, features))

Anything else (another dict, a tensor of another shape, probabilities, a single logit) is refused
with one :class:`ModelOutputError` that says what to do. :func:`logits_reading` decides;
:func:`read_logits` applies the decision; :class:`LogitsOf` is the small module that returns
a model's logits (read this way, and with inputs cast to a low-precision model's own dtype), so
the code that differentiates the model still sees the user's own modules inside it.

**Facts kept per model** (:class:`PerModel`: row costs, plans, whether forward mode runs),
dropped when the model's structure changes. A notebook changes a model in place: a new head
(``model.fc = nn.Linear(512, 10)``), a layer swapped for another, ``model.half()``. Facts measured
before would then describe another network. Each fact is therefore kept under the model's
structure token (:func:`structure_token`), read again at every look-up: a replaced module,
parameter or buffer, or one of another shape, dtype or device, a ``forward`` replaced on a module
object, or a forward hook added or removed, empties the model's entries. New values in the same
tensors (a training step, ``load_state_dict``) keep them.

**The memory format** (layout only): an execution plan decides whether a convolutional model
runs in channels_last; the estimators' maths put their rows and the weights in that format with
:func:`weights_in_format` and :func:`to_format`, which neither time nor plan anything (so the
maths never call back into planning).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

import torch
from torch import Tensor, nn

from probust.errors import OptionError

__all__ = [
    "CONTRACT",
    "LogitsOf",
    "ModelOutputError",
    "PerModel",
    "Reading",
    "check_logits",
    "check_noisy_logits",
    "eval_mode",
    "finite_rows",
    "is_low_precision",
    "logits_model",
    "logits_reading",
    "output_problem",
    "model_device",
    "parameter_dtype",
    "read_logits",
    "structure_token",
    "to_format",
    "weights_in_format",
]


#: How logits are read from an output: the output itself, its "logits" entry, or its first item.
Reading = Literal["tensor", "logits", "first"]

#: The contract in words, for messages.
CONTRACT = "logits [B, C], a Hugging Face ModelOutput (its .logits) or a tuple whose first item is the logits"

_WRAP = "wrap the model in an nn.Module whose forward returns the logits tensor [B, C]"


class ModelOutputError(OptionError):
    """The model's output is not one the contract reads as logits (``field`` is ``"model"``)."""


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


# --- the model's outputs and modes, as every estimator checks them at each call ---------------


def check_logits(logits: Tensor, batch: int) -> Tensor:
    """The model's output for a batch of ``batch`` rows must be finite logits [batch, C], C >= 2."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"the model must return a tensor of logits [B, C], got {type(logits).__name__}")
    if logits.ndim != 2 or logits.shape[0] != batch:
        raise ValueError(f"the model must return logits of shape [B, C] = [{batch}, C], got {tuple(logits.shape)}")
    if logits.shape[1] < 2:
        raise ValueError(f"the model must have at least 2 classes, got C = {logits.shape[1]}")
    if not torch.isfinite(logits).all():
        raise ValueError("the model returned NaN or inf logits")
    return logits


def finite_rows(logits: Tensor, copies: int) -> Tensor:
    """Which noisy copies gave finite logits: logits [P * copies, C] -> bool [P, copies].

    x * 0 is 0 for a finite x and NaN for NaN or +-inf, so a row's sum of them is finite exactly
    when all its logits are (no overflow: the sum is of zeros). Several times cheaper than
    ``isfinite(logits).all(1)`` for many classes, and no device synchronisation: callers sum it
    per point and check the sums once (:func:`check_noisy_logits`)."""
    return torch.isfinite((logits * 0).sum(dim=1)).view(-1, copies)


def check_noisy_logits(nonfinite: Tensor, copies: int, indices: Tensor, noise: str) -> None:
    """Raise ValueError when the model gave NaN or inf logits on any point's noisy copies.

    Such a copy has no prediction (argmax would return the NaN's index), so p_robust is
    undefined there: it is refused, never counted.

    Args:
        nonfinite: int [B], copies of each point whose logits held a NaN or an inf.
        copies: noisy copies drawn per point in the pass that was checked.
        indices: int [B], the points' indices in the data set (``index_offset + row``).
        noise: the noise, in words (e.g. its description), for the message.
    """
    if not bool(nonfinite.any()):
        return
    bad = nonfinite.nonzero().flatten()
    shown = ", ".join(f"point {int(indices[i])}: {int(nonfinite[i])} of {copies} copies" for i in bad[:5].tolist())
    more = f" and {len(bad) - 5} more points" if len(bad) > 5 else ""
    raise ValueError(
        f"the model returned NaN or inf logits on noisy copies x + eps under noise {noise} ({shown}{more}; "
        "point = data-set index, index_offset + row): p_robust is undefined there and such copies are never "
        "counted; make the model finite on noisy inputs (e.g. clamp before a log or an exp) or use a smaller noise"
    )


def model_device(model: nn.Module) -> torch.device | None:
    """The device of the model's first parameter or buffer (None for a parameter-free model)."""
    for tensor in model.parameters():
        return tensor.device
    for buffer in model.buffers():
        return buffer.device
    return None


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode, and give each its own mode back afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


V = TypeVar("V")


def structure_token(model: Any) -> tuple:
    """What a model's kept facts depend on: the identity and class of each of its modules, a
    ``forward`` set on a module object (``model.forward = f``) and the module's own forward hooks,
    and the identity, shape, dtype and device of each parameter and buffer (not their values,
    nor their memory format). Empty for a callable that is not a module. One walk over the
    modules, parameters and buffers, reading no values: cheap enough for every look-up."""
    if not isinstance(model, nn.Module):
        return ()
    return (
        tuple(
            (
                id(module),
                type(module),
                id(module.__dict__.get("forward")),
                tuple(module._forward_pre_hooks),
                tuple(module._forward_hooks),
            )
            for module in model.modules()
        ),
        tuple((id(t), t.shape, t.dtype, t.device) for t in (*model.parameters(), *model.buffers())),
    )


class PerModel(Generic[V]):
    """Values kept per model object, weakly, and per key (e.g. an input shape), under the model's
    :func:`structure_token`: a look-up after the structure changed finds nothing. A model that
    cannot be held weakly keeps nothing."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary[Any, tuple[tuple, dict[Hashable, V]]] = weakref.WeakKeyDictionary()

    def _entries(self, model: Any) -> dict[Hashable, V] | None:
        token = structure_token(model)
        try:
            held = self._held.get(model)
            if held is None or held[0] != token:
                held = (token, {})
                self._held[model] = held
        except TypeError:  # not weakly referable or not hashable
            return None
        return held[1]

    def get(self, model: Any, key: Hashable) -> V | None:
        """The value kept for ``model`` under ``key``, or None."""
        entries = self._entries(model)
        return None if entries is None else entries.get(key)

    def put(self, model: Any, key: Hashable, value: V) -> None:
        """Keep ``value`` for ``model`` under ``key`` (for as long as its structure and the model last)."""
        entries = self._entries(model)
        if entries is not None:
            entries[key] = value

    def holds(self, model: Any) -> bool:
        """Whether anything is kept for ``model`` under its current structure."""
        return bool(self._entries(model))

    def forget(self, model: Any) -> None:
        """Drop everything kept for ``model``."""
        try:
            self._held.pop(model, None)
        except TypeError:
            pass


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
