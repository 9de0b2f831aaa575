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
import math
import weakref
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from probust.errors import OptionError, ProbustError, first_line

__all__ = [
    "CONTRACT",
    "InputProblem",
    "LogitsOf",
    "ModelCallError",
    "ModelOutputError",
    "PerModel",
    "Reading",
    "call_error",
    "first_layer",
    "input_problem",
    "is_low_precision",
    "logits_model",
    "logits_reading",
    "output_problem",
    "parameter_dtype",
    "points_problem",
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


class ModelCallError(ProbustError, ValueError):
    """The model raised on a few rows of ``x`` (``field`` is ``"x"``): the message names x's shape
    as it was read (a batch of B inputs of shape S), what about it the model's first layer does
    not take (:func:`input_problem`), and quotes the model's own error, which is chained."""


#: The spatial dimensions' names of a convolution's input, by its number of them.
_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


class InputProblem(NamedTuple):
    """What about inputs of a shape the model's first layer does not take (:func:`input_problem`).

    Attributes:
        text: in words, naming the inputs, both counts where they differ and the layer.
        fewer_dims: the inputs have one dimension fewer than the first layer takes.
        missing: the dimension the shape says is missing, where it says which: ``"batch"`` (a
            single input; the fix is ``x.unsqueeze(0)``), ``"channel"`` (a batch of inputs with
            one channel, e.g. grey images [B, H, W]; ``x.unsqueeze(1)``); else None.
    """

    text: str
    fewer_dims: bool
    missing: Literal["batch", "channel"] | None


#: What ``call_error`` advises for each missing dimension.
_ADVICE = {
    "batch": "if x is a single input, pass x.unsqueeze(0)",
    "channel": "if x is a batch of inputs with one channel, pass x.unsqueeze(1)",
}


def first_layer(model: object) -> tuple[str, nn.Module] | None:
    """The model's first layer that says what inputs it takes, with its name in the model: the
    first convolution (``in_channels``), linear layer (``in_features``) or module declaring
    ``input_channels`` (an int, the channels it takes in dimension 1, e.g. :class:`probust.Normalize`)
    in ``model.modules()`` order. That is the order the modules were assigned in ``__init__``,
    which is the order they run in an ``nn.Sequential`` and in the torchvision, timm and Hugging
    Face image classifiers (their stem or patch embedding first). None for a callable that is not
    an ``nn.Module``, or a model without such a layer."""
    if not isinstance(model, nn.Module):
        return None
    for name, module in model.named_modules():
        if _declares_input(module):
            return name, module
    return None


def _declares_input(module: nn.Module) -> bool:
    if isinstance(module, _CONVOLUTIONS):
        return module.in_channels > 0  # 0: a lazy one, not yet built
    if isinstance(module, nn.Linear):
        return module.in_features > 0
    return isinstance(getattr(module, "input_channels", None), int)


def _after(model: nn.Module, first: nn.Module) -> tuple[str, nn.Module] | None:
    """The first convolution or linear layer after ``first`` in ``model.modules()`` order."""
    seen = False
    for name, module in model.named_modules():
        if module is first:
            seen = True
        elif seen and isinstance(module, (*_CONVOLUTIONS, nn.Linear)) and _declares_input(module):
            return name, module
    return None


def _runs_first(model: nn.Module, layer: nn.Module) -> bool:
    """Whether ``layer`` is the first module ``model`` runs, through nested ``nn.Sequential``s."""
    while isinstance(model, nn.Sequential) and len(model) > 0:
        model = model[0]
    return model is layer


def _called(name: str, layer: nn.Module) -> str:
    return f"{type(layer).__name__} {name!r}" if name else type(layer).__name__


def input_problem(model: object, shape: Sequence[int], inputs: str = "x", has: str = "has") -> InputProblem | None:
    """What about inputs of ``shape`` ([B, *S]) the model's first layer (:func:`first_layer`)
    does not take, in words naming the inputs ``inputs`` (with the verb ``has``); None where the
    first layer takes them, or is not known. A missing dimension is named only where the inputs
    have one dimension fewer than the first layer takes; a count that differs is named with both
    counts and the layer.

    The rules, by the first layer:

    - a convolution over k spatial dimensions takes [B, C_in, *k]. Inputs with k + 1 dimensions
      lack one: the batch dimension where dimension 0 is C_in (a single input), the channel
      dimension where C_in is 1 (a batch of single-channel inputs), else it is not known which.
      With k + 2 dimensions and another size than C_in in dimension 1, the channels differ;
    - a module declaring ``input_channels`` C (a :class:`probust.Normalize`) takes [B, C, ...]
      in front of the model's first convolution or linear layer: followed by a convolution over
      k dimensions, it takes what that convolution takes, with C channels, and inputs of k + 1
      dimensions read as above; followed by a linear layer of F features, inputs of F numbers in
      all with C in dimension 0 are a single input. Any other size than C in dimension 1 is other
      channels; where the convolution after it takes that size, it is named too (the statistics
      are of other channels than the model's);
    - a linear layer takes F features per input: rows of another count than F (neither a row's
      numbers nor its last dimension) are other inputs, and, where x holds F numbers in all and
      the model does not run the linear layer first (so it takes more than [B, F], e.g. after
      an ``nn.Flatten``), maybe a single input without its batch dimension.
    """
    found = first_layer(model)
    if found is None or len(shape) < 2 or not isinstance(model, nn.Module):
        return None
    name, layer = found
    shape = [int(n) for n in shape]
    called = _called(name, layer)
    if isinstance(layer, _CONVOLUTIONS):
        k, channels = len(layer.kernel_size), layer.in_channels
        return _conv_problem(shape, k, channels, f"{called}, inputs [B, {channels}, {_SPATIAL[k]}]", inputs, has)
    if isinstance(layer, nn.Linear):
        return _linear_problem(shape, layer.in_features, called, _runs_first(model, layer), inputs, has)
    channels = int(getattr(layer, "input_channels", 1))  # an int: first_layer checked it
    after = _after(model, layer)
    if after is not None and isinstance(after[1], _CONVOLUTIONS):
        conv = after[1]
        k = len(conv.kernel_size)
        takes = f"{called}, inputs [B, {channels}, {_SPATIAL[k]}]"
        if len(shape) == k + 1:
            return _conv_problem(shape, k, channels, takes, inputs, has, declared=True)
    else:
        takes = f"{called}, inputs [B, {channels}, ...]"
    if shape[1] == channels:
        return None
    if after is not None and isinstance(after[1], nn.Linear):
        if shape[0] == channels and math.prod(shape) == after[1].in_features:
            return _single(channels, takes, inputs, has)
    text = _other_channels(channels, shape[1], takes, inputs, has)
    if after is not None and isinstance(after[1], _CONVOLUTIONS) and after[1].in_channels == shape[1]:
        text += f", the {shape[1]} that {_called(*after)} after it takes"
    return InputProblem(text, False, None)


def _single(channels: int, takes: str, inputs: str, has: str) -> InputProblem:
    return InputProblem(
        f"{inputs} {has} the {channels} channels of one input of the model's first layer ({takes}) in dimension 0, "
        "without the batch dimension",
        True,
        "batch",
    )


def _other_channels(channels: int, found: int, takes: str, inputs: str, has: str) -> str:
    return f"the model's first layer expects {channels} channels in dimension 1, {inputs} {has} {found} ({takes})"


def _conv_problem(
    shape: list[int], k: int, channels: int, takes: str, inputs: str, has: str, declared: bool = False
) -> InputProblem | None:
    """A first layer taking [B, channels, *k] (``takes``: it and its inputs, in words; ``declared``:
    a module declaring its channels, in front of a convolution)."""
    if len(shape) == k + 1:
        if shape[0] == channels and declared:
            return _single(channels, takes, inputs, has)
        if shape[0] == channels:
            return InputProblem(
                f"{inputs} {has} the dimensions of one input of the model's first layer ({takes}), without the "
                "batch dimension",
                True,
                "batch",
            )
        if channels == 1:
            return InputProblem(
                f"{inputs} {has} one dimension fewer than the model's first layer takes ({takes}): a batch of "
                f"{_count(shape[0], 'input')} of shape {shape[1:]} without the channel dimension",
                True,
                "channel",
            )
        return InputProblem(
            f"{inputs} {has} one dimension fewer than the model's first layer takes ({takes}), and {shape[0]} in "
            f"dimension 0, where one input would have its {channels} channels",
            True,
            None,
        )
    if len(shape) == k + 2 and shape[1] != channels:
        return InputProblem(_other_channels(channels, shape[1], takes, inputs, has), False, None)
    return None


def _linear_problem(
    shape: list[int], features: int, called: str, runs_first: bool, inputs: str, has: str
) -> InputProblem | None:
    """A first layer taking ``features`` numbers per input (``runs_first``: the model runs it
    first, so its inputs are [B, features])."""
    row = math.prod(shape[1:])
    if row == features or shape[-1] == features:
        return None
    cause = f"the model's first layer expects {features} features per input, {inputs} {has} {row} per input ({called})"
    if not runs_first and math.prod(shape) == features:  # the features of one input, read as rows
        return InputProblem(f"{cause}, and {features} numbers in all, one input's worth", True, "batch")
    return InputProblem(cause, False, None)


def points_problem(model: object, shape: Sequence[int]) -> str | None:
    """What about a batch of a data set's points (``shape``: [B, *S], the batch made by the
    caller) the model's first layer does not take, named as in :func:`input_problem` ("the points
    have ..."); None where it takes them, where it is not known, or where the points have one
    dimension fewer than it takes (the batch dimension is the caller's, so the points' own shape,
    which the message gives, says more than advice on x). The command line's model checks (a model
    file's probe and the runner's) name a model that fails on the data by it."""
    problem = input_problem(model, shape, "the points", "have")
    return None if problem is None or problem.fewer_dims else problem.text


def call_error(model: object, x: Tensor, rows: int, error: BaseException) -> ModelCallError:
    """The error for a model that raised ``error`` on the first ``rows`` rows of ``x`` (a probe):
    x's shape as it was read, what its first layer does not take (:func:`input_problem`), the
    advice to add a dimension only where x's shape says which one is missing, and the model's
    own error, with the shape it was given where that is not x's."""
    shape = list(x.shape)
    text = f"the model fails on x of shape {shape}, read as a batch of {_count(shape[0], 'input')} of shape {shape[1:]}"
    problem = input_problem(model, shape)
    if problem is not None:
        text += f": {problem.text}"
    own = f"{type(error).__name__}: {first_line(error)}" if str(error).strip() else type(error).__name__
    if rows < shape[0]:
        text += f" (the model's error on x's first {rows} rows, shape {[rows, *shape[1:]]}: {own})"
    else:
        text += f" (the model's error: {own})"
    if problem is not None and problem.missing is not None:
        text += f"; {_ADVICE[problem.missing]}"
    return ModelCallError(text, field="x")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
