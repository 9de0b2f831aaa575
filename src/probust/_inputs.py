"""What a user passes, read and checked in one place: the points, their labels, sigma.

Every entry point calls this module (``probust.score`` / ``probust estimate``, ``probust.find_issues``
/ ``probust issues``, ``probust.certify`` / ``predict``, the estimators' own check of ``x``), so the
same input gets the same answer or the same named error everywhere; a new check is written here
once, with its row in ``tests/test_bad_inputs.py``. The model's output contract and what its first
layer takes are :mod:`probust._user_model`'s.

Points are read as :func:`as_dataset` says: tensors or arrays ``x`` [N, *S] or ``(x, labels)``, a
map-style Dataset whose items are ``(x, label)`` or dicts (the keys of :data:`X_KEYS` and
:data:`LABEL_KEYS`, as torchvision and Hugging Face ``datasets`` name them, or ``keys=`` the user
names), or a DataLoader over one. Each cause of refusal is one :class:`InputError` subclass whose
``field`` is the argument (``x``, ``data``, ``sigma``, ``weights``); its fix reads as Python or as
the shell's flags (:class:`probust.errors.Phrase`, :class:`probust.errors.Setting`).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
    default_convert,
)

from probust.errors import ConfigError, Phrase, ProbustError, first_line, user_stacklevel

__all__ = [
    "LABEL_KEYS",
    "MISSING_CHANNEL",
    "NO_LABEL",
    "X_KEYS",
    "InputDtypeError",
    "InputError",
    "InputTypeError",
    "ItemError",
    "LabelError",
    "NonFiniteInputError",
    "SigmaError",
    "TensorPoints",
    "UntrainedModelError",
    "InputProblem",
    "ModelCallError",
    "call_error",
    "first_layer",
    "input_problem",
    "points_problem",
    "as_dataset",
    "batch",
    "check_labels",
    "check_target",
    "check_sigma",
    "check_x",
    "loader_dataset",
    "pixel_note",
    "warn_pixels",
]


class InputError(ConfigError):
    """A user's points, labels, sigma or model refused before any work (``field`` names the argument)."""


class InputTypeError(InputError, TypeError):
    """``x`` is not a tensor of a batch of points."""


class InputDtypeError(InputError):
    """Integer inputs (uint8 images): the noise is added in the inputs' own units."""


class NonFiniteInputError(InputError):
    """NaN or inf in the inputs."""


class LabelError(InputError):
    """Labels that are not one class index in [0, C) per point."""


class ItemError(InputError):
    """A data set's items cannot be read as ``(x, label)``."""


class SigmaError(InputError):
    """sigma is not one positive number."""


class UntrainedModelError(InputError):
    """A model built from code without weights, not said to be meant."""


#: The label of a point whose data came without labels (:class:`TensorPoints`).
NO_LABEL = -1
#: A dict item's inputs and label, under the names torchvision, Hugging Face ``datasets`` and
#: common code give them (the first key found is read).
X_KEYS = ("image", "pixel_values", "img", "x", "input", "inputs")
LABEL_KEYS = ("label", "labels", "y", "target", "targets")
#: The inputs a data set's first points may span and still read as [0, 1] pixels.
PIXEL_RANGE = (-0.5, 1.5)

_TO_FLOAT = Phrase(
    "fix",
    python="x.float() / 255 (or transforms.ToTensor() in a Dataset's transform)",
    shell="store them as float32 scaled to [0, 1] (x / 255)",
)

#: How to add the channel dimension that grey images [N, H, W] lack.
MISSING_CHANNEL = Phrase(
    "fix",
    python="x.unsqueeze(1) for tensors x [N, H, W] (x.unsqueeze(0) per item in a Dataset's transform)",
    shell="store the inputs as [N, 1, H, W]",
)


def integer_inputs(dtype: Any, field: str, where: str = "x") -> InputDtypeError:
    """The one refusal of integer inputs (e.g. uint8 images), with the fix."""
    name = str(dtype).removeprefix("torch.")
    return InputDtypeError(
        f"the inputs ({where}) are {name}, not floating point: the noise N(0, sigma^2 I) is added to the inputs "
        "in their own units, so sigma would count integer steps (e.g. 0..255) and the model would see them "
        "unscaled; give float inputs in the units sigma is meant in, for images in [0, 1]: ",
        _TO_FLOAT,
        field=field,
    )


def check_x(x: Any, field: str = "x", first: int | np.ndarray = 0) -> Tensor:
    """A batch of inputs ``x`` [B, ...]: a floating tensor, at least 2-D, not empty, finite;
    returned unchanged (``first``: the data-set index of row 0, or of every row, for the message).

    Raises:
        InputTypeError, InputError, InputDtypeError, NonFiniteInputError: naming ``field``.
    """
    if not isinstance(x, Tensor):
        raise InputTypeError(f"must be a torch.Tensor of shape [B, ...], got {type(x).__name__}", field=field)
    if x.ndim < 2:
        raise InputError(
            f"must have a batch dimension and at least one input dimension [B, ...], got shape {list(x.shape)}; "
            "for a single input pass x.unsqueeze(0)",
            field=field,
        )
    if x.shape[0] == 0:
        raise InputError("is an empty batch (shape[0] == 0)", field=field)
    if not x.is_floating_point():
        raise integer_inputs(x.dtype, field, field)
    finite = torch.isfinite(x.flatten(1)).all(1)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten()
        shown = [int(first[i]) for i in bad[:5]] if isinstance(first, np.ndarray) else (bad[:5] + first).tolist()
        raise NonFiniteInputError(
            f"holds NaN or inf at {len(bad)} point(s) (data-set indices {shown}{'...' if len(bad) > 5 else ''}): "
            "no noise level or prediction is defined there; drop or repair those points",
            field=field,
        )
    return x


def check_labels(
    labels: Any,
    n: int,
    classes: int | None = None,
    field: str = "data",
    indices: Any = None,
    missing: bool = False,
) -> Tensor:
    """The given labels (or targets) as int64 [n] on their device: integer class indices >= 0,
    below ``classes`` where it is known (``indices``: the points' data-set indices, for the
    message; default 0 to n - 1; ``missing``: -1, :data:`NO_LABEL`, marks a point without one).

    Raises:
        LabelError: naming ``field``, with the fix (``labels.long()``, ``.argmax(1)``, ...).
    """
    y = torch.as_tensor(labels)
    shape = list(y.shape)
    if y.ndim == 2 and y.shape[0] == n:
        fix = "labels.squeeze(1)" if y.shape[1] == 1 else "labels.argmax(1)"
        kind = "" if y.shape[1] == 1 else " (one-hot or scores?)"
        raise LabelError(
            f"the labels have shape {shape}{kind}, expected one class index per point [{n}]: pass {fix}", field=field
        )
    if shape != [n]:
        raise LabelError(f"expected one label per point, [{n}], got labels of shape {shape}", field=field)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        whole = y.is_floating_point() and bool((y == y.round()).all())
        fix = ": pass labels.long()" if whole else ""
        raise LabelError(
            f"expected integer class indices, got {str(y.dtype).removeprefix('torch.')} labels{fix}", field=field
        )
    y = y.to(torch.int64)
    outside = (y < 0) & (y != NO_LABEL) if missing else y < 0
    if classes is not None:
        outside |= y >= classes
    if bool(outside.any()):
        at = int(outside.nonzero()[0])
        kind = (
            f"a class of the model's {classes} outputs (labels are 0 to {classes - 1})"
            if classes is not None
            else "a class index (>= 0)"
        )
        raise LabelError(
            f"label {int(y[at])} of point {at if indices is None else int(indices[at])} is not {kind}; "
            f"{int(outside.sum())} such label(s) in all",
            field=field,
        )
    return y


def check_target(target: Tensor | None, logits: Tensor) -> Tensor:
    """The class whose survival is measured: given (checked by :func:`check_labels`, field
    ``target``), or the clean prediction (ties refused).

    The one policy for ties, shared with ``probust estimate``: p_robust of the prediction is
    undefined where the two largest clean logits are exactly equal, so such a point is refused
    (here naming its rows in the batch; the runner names data-set indices) unless a target is
    given explicitly."""
    batch, classes = logits.shape
    if target is not None:
        return check_labels(target, batch, classes, field="target").to(logits.device)
    top2 = logits.topk(2, dim=1).values
    tied = (top2[:, 0] == top2[:, 1]).nonzero().flatten()
    if len(tied):
        rows = tied[:5].tolist()
        raise ValueError(
            f"the prediction is tied between two classes at rows {rows}{'...' if len(tied) > 5 else ''}: "
            "p_robust is undefined there; pass target= to choose the class"
        )
    return logits.argmax(dim=1)


def check_sigma(sigma: Any, field: str = "sigma") -> float:
    """One positive, finite noise level, as a float.

    Raises:
        SigmaError: a list (this call takes one: call it once per sigma), a string, <= 0, NaN or inf.
    """
    if isinstance(sigma, Tensor) and sigma.numel() == 1:
        sigma = sigma.item()
    if isinstance(sigma, (Sequence, np.ndarray, Tensor)) and not isinstance(sigma, str):
        raise SigmaError(
            f"takes one noise level, got {np.asarray(sigma).reshape(-1).tolist()}: call once per sigma "
            "(probust.score takes a list)",
            field=field,
        )
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.number)):
        raise SigmaError(f"must be a positive number, got {sigma!r}", field=field)
    value = float(sigma)
    if not (math.isfinite(value) and value > 0):
        raise SigmaError(f"must be a positive finite number, got {sigma!r}", field=field)
    return value


def pixel_note(x: Tensor, normalizing: bool = False) -> str | None:
    """A warning when images ``x`` [B, C, H, W] are visibly not [0, 1] pixels, else None.

    The noise is added to the tensors the model receives, so sigma is in their units. Only
    image-shaped, finite inputs are looked at (tables and flat inputs have units of their own).
    The rule: any value below -0.5 or above 1.5 (:data:`PIXEL_RANGE`; ImageNet's normalisation
    maps [0, 1] to about [-2.1, 2.6], a mean of 0.5 and std of 0.5 to [-1, 1]).

    Args:
        x: the first points.
        normalizing: whether the run normalises the inputs again (``mean`` / ``std`` given).
    """
    if x.ndim != 4 or not x.numel() or not bool(torch.isfinite(x).all()):
        return None
    lo, hi = float(x.min()), float(x.max())
    if PIXEL_RANGE[0] <= lo and hi <= PIXEL_RANGE[1]:
        return None
    seen = f"the inputs range from {lo:.3g} to {hi:.3g} over the first {x.shape[0]} points, not [0, 1]"
    if lo >= 0:  # e.g. 0..255 as floats
        return (
            f"{seen}: sigma is measured in those units (e.g. steps of 0..255); to have it in [0, 1] pixel units, "
            "scale the images to [0, 1] (x / 255, or transforms.ToTensor)"
        )
    again = " and mean/std normalise them once more, so the model sees them normalised twice" if normalizing else ""
    return (
        f"{seen}: they look normalised (e.g. by a transforms.Normalize in the Dataset's transform){again}, so "
        "sigma is measured in those normalised units (one unit there is std in pixel units, e.g. 0.229 for "
        "ImageNet's red channel); to keep sigma in [0, 1] pixel units, drop the normalisation from the data and "
        "give it to the model: --mean/--std on the command line, mean= and std= in Python, or "
        "probust.with_normalization(model, mean=..., std=...)"
    )


def warn_pixels(x: Tensor) -> None:
    """Warn, at the user's line, where images ``x`` [B, ...] (its first 8 are looked at) are visibly
    not [0, 1] pixels (:func:`pixel_note`)."""
    note = pixel_note(x[:8]) if isinstance(x, Tensor) and x.is_floating_point() else None
    if note is not None:
        warnings.warn(note, UserWarning, stacklevel=user_stacklevel())


_Points = TypeVar("_Points", bound="TensorPoints")


class TensorPoints(Dataset):
    """Tensors as a data set: ``ds[i] -> (x float32 [*S], label int)``, for data given as
    tensors (``x`` [N, *S], or ``(x, y)``) rather than a data set.

    Attributes:
        name: "tensors"; ``split`` "all".
        labelled: whether labels were given; without them every label is -1 (:data:`NO_LABEL`).
        stored_dtype: the dtype ``x`` was given in when it is not floating point (served as
            float32 in its units, and refused by every entry point, as a file's integer inputs are).
        source: "the tensor x", for messages.
    """

    def __init__(self, x: Any, y: Any = None) -> None:
        x = torch.as_tensor(x)
        if x.ndim < 2 or x.shape[0] == 0:
            raise InputError(
                f"expected inputs x [N, ...] with N >= 1, got a tensor of shape {list(x.shape)}", field="data"
            )
        self.labelled = y is not None
        y = torch.full((x.shape[0],), NO_LABEL, dtype=torch.int64) if y is None else check_labels(y, x.shape[0])
        self.stored_dtype = None if x.is_floating_point() else str(x.dtype).removeprefix("torch.")
        self._x, self._y = x.to(torch.float32), y
        self.name, self.split, self.source = "tensors", "all", "the tensor x"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._x.shape[1:])

    @property
    def targets(self) -> Tensor:
        return self._y

    def __len__(self) -> int:
        return int(self._x.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self._x[index], int(self._y[index])

    def tensors(self) -> tuple[Tensor, Tensor]:
        """``(x float32 [N, *S], y int64 [N])``."""
        return self._x, self._y

    def subset(self: _Points, indices: Sequence[int] | Tensor) -> _Points:
        """The points ``indices`` (int64 [k]), with this data set's attributes."""
        part = copy.copy(self)
        idx = torch.as_tensor(indices, dtype=torch.int64)
        part._x, part._y = self._x[idx], self._y[idx]
        return part


class ItemPoints(Dataset):
    """A data set whose items are dicts, read as ``ds[i] -> (item[x_key], item[label_key])``
    (the data set's ``classes``, ``name`` and ``targets`` kept where it has them)."""

    def __init__(self, ds: Any, x_key: Any, label_key: Any) -> None:
        self.dataset, self.x_key, self.label_key = ds, x_key, label_key
        for name in ("classes", "name", "split", "targets"):
            if hasattr(ds, name):
                setattr(self, name, getattr(ds, name))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        item = self.dataset[index]
        return item[self.x_key], item[self.label_key]


def _item_keys(item: Mapping, keys: Sequence[Any] | None) -> tuple[Any, Any]:
    """The keys of a dict item's inputs and label: ``keys`` where given, else the first of
    :data:`X_KEYS` and :data:`LABEL_KEYS` the item holds."""
    found = list(item.keys())
    shown = ", ".join(repr(k) for k in found[:8]) + (", ..." if len(found) > 8 else "")
    if keys is not None:
        if isinstance(keys, str) or len(keys) != 2:
            raise ItemError(f"keys must be two names, (the inputs' key, the label's key), got {keys!r}", field="keys")
        missing = [k for k in keys if k not in item]
        if missing:
            raise ItemError(f"ds[0] has no key {missing[0]!r}; its keys: {shown}", field="keys")
        return keys[0], keys[1]
    x_key = next((k for k in X_KEYS if k in item), None)
    label_key = next((k for k in LABEL_KEYS if k in item), None)
    if x_key is None or label_key is None:
        lacking = "inputs" if x_key is None else "label"
        raise ItemError(
            f"its items are dicts (keys {shown}) with no {lacking} under the names read by default "
            f"(inputs: {', '.join(X_KEYS)}; label: {', '.join(LABEL_KEYS)}): name them with keys=(INPUTS_KEY, "
            "LABEL_KEY)",
            field="data",
        )
    return x_key, label_key


def as_dataset(data: Any, keys: Sequence[Any] | None = None) -> Any:
    """The map-style data set ``data`` stands for: a DataLoader's (:func:`loader_dataset`);
    :class:`TensorPoints` for a tensor or array ``x`` [N, ...], a pair ``(x, y)`` or a
    one-tensor ``TensorDataset``; a data set of dict items read through their keys
    (:class:`ItemPoints`); anything else as it is (a data set, a name, a path).

    Raises:
        InputError: (field ``data``) a DataLoader whose points cannot be read one by one as it
            reads them, tensors of the wrong shapes, labels that are not class indices.
        ItemError: items that are neither ``(x, label)`` nor dicts with known (or given) keys.
    """
    if isinstance(data, DataLoader):
        return as_dataset(loader_dataset(data), keys)
    if isinstance(data, (Tensor, np.ndarray)):
        return TensorPoints(data)
    pair = isinstance(data, (tuple, list)) and 1 <= len(data) <= 2
    if pair and all(isinstance(d, (Tensor, np.ndarray)) for d in data):
        return TensorPoints(*data)
    if isinstance(data, TensorDataset) and len(data.tensors) == 1:
        return TensorPoints(data.tensors[0])
    if isinstance(data, (str, bytes)) or not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        return data
    if isinstance(data, (TensorPoints, ItemPoints)) or len(data) == 0:
        return data
    try:
        item = data[0]
    except Exception as exc:
        raise ItemError(f"cannot read ds[0] ({type(exc).__name__}: {first_line(exc)})", field="data") from None
    if isinstance(item, Mapping):
        return ItemPoints(data, *_item_keys(item, keys))
    if keys is not None:
        raise ItemError("apply to a data set whose items are dicts; its items are " + type(item).__name__, field="keys")
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise ItemError(
            f"cannot read ds[0] as (x, label): it is a {type(item).__name__}; give a Dataset of (x, label) pairs or "
            "of dicts, or the tensors (x, labels)",
            field="data",
        )
    return data


def loader_dataset(loader: DataLoader) -> Any:
    """The data set a DataLoader reads, when reading it point by point (``ds[i]`` for every
    i, in order) gives the points the loader gives.

    Each point's random stream derives from its index in the data set, and the work is cut into
    blocks of its own size, so the loader's batch size and ``drop_last`` do not matter (every
    point is scored) and nor does ``num_workers`` (points are read in this process). Refused,
    with the reason: an ``IterableDataset`` (its points have no index), a shuffled loader or
    any sampler but the sequential one (the points it picks would not be those scored), and a
    ``collate_fn`` other than torch's default (what it does to a batch would be bypassed).

    Raises:
        InputError: (field ``data``) naming what to change.
    """
    ds = loader.dataset
    if isinstance(ds, IterableDataset):
        raise InputError(
            f"the DataLoader reads an IterableDataset ({type(ds).__name__}): its points have no index, from "
            "which each point's random stream is derived; give a map-style Dataset (ds[i] -> (x, label)) or "
            "the tensors (x, y)",
            field="data",
        )
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        raise InputError(
            "the DataLoader is shuffled (shuffle=True): its data set is read by index, in order (each "
            "point's random stream derives from its index), so the rows would not follow the loader's order; "
            "pass a loader with shuffle=False, or the data set itself (every row carries its point's index)",
            field="data",
        )
    batches = loader.batch_sampler
    if not isinstance(sampler, SequentialSampler) or (
        batches is not None and (type(batches) is not BatchSampler or batches.sampler is not sampler)
    ):
        picker = type(sampler if not isinstance(sampler, SequentialSampler) else batches).__name__
        raise InputError(
            f"the DataLoader picks its points with a {picker}: every point of loader.dataset is scored, in "
            "index order, so its choice would be ignored; choose the points with indices (or a "
            "torch.utils.data.Subset) and a loader without a sampler",
            field="data",
        )
    if loader.collate_fn not in (default_collate, default_convert):
        name = getattr(loader.collate_fn, "__name__", type(loader.collate_fn).__name__)
        raise InputError(
            f"the DataLoader has its own collate_fn ({name}): points are read from loader.dataset one by "
            "one (ds[i] -> (x, label)), which would bypass it; do what it does in the data set's transform "
            "(or in the model), or give the tensors (x, y)",
            field="data",
        )
    return ds


def _item_x(value: Any, index: int) -> Tensor:
    if isinstance(value, (Tensor, np.ndarray, int, float, list, tuple)):
        return torch.as_tensor(np.asarray(value) if isinstance(value, (list, tuple)) else value)
    raise ItemError(
        f"ds[{index}]'s inputs are a {type(value).__module__}.{type(value).__name__}, not a tensor: convert them in "
        "the data set's transform (e.g. transforms.ToTensor() for images, or a Hugging Face dataset's "
        'with_format("torch"))',
        field="data",
    )


def batch(ds: Any, indices: np.ndarray, field: str = "data") -> tuple[Tensor, Tensor]:
    """Points ``indices`` of ``ds``: (x float32 [B, *S], labels int64 [B]).

    Raises:
        InputDtypeError: integer inputs (a data set's items, or a file or tensors stored so).
        ItemError: inputs that are not tensors.
    """
    stored = getattr(ds, "stored_dtype", None)
    if stored is not None and np.dtype(stored).kind in "biu":
        raise integer_inputs(stored, field, getattr(ds, "source", None) or "the file")
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(torch.from_numpy(np.asarray(indices, dtype=np.int64))).tensors()
    # A generic torch Dataset can only be read item by item.
    items = [ds[int(i)] for i in indices]
    xs = [_item_x(item[0], int(i)) for item, i in zip(items, indices)]
    if xs and not xs[0].is_floating_point():
        raise integer_inputs(xs[0].dtype, field, f"ds[{int(indices[0])}]")
    x = torch.stack(xs).to(torch.float32)
    y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
    return x, y


# --- what about x the model's first layer does not take ----------------------------------------


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
