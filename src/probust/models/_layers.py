"""Input normalisation as a layer: the first layer of every probust model, and of the user's.

The noise of p_robust is added to the tensor the model receives, so sigma is in that tensor's
units. Models from timm, torchvision and Hugging Face expect inputs normalised per channel,
``(x - mean) / std``; putting that normalisation inside the model keeps inputs, and so sigma, in
pixel units ([0, 1]). :class:`Normalize` is that layer, :func:`with_normalization` puts it in
front of a model, reading the statistics from what the user has (a timm model's
``pretrained_cfg``, torchvision weights, a Hugging Face image processor).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from probust.errors import OptionError
from probust.models._stats_sources import hf_stats, stats_of, timm_stats, torchvision_stats

__all__ = ["Normalize", "StatisticsError", "with_normalization"]

#: What a statistic may be given as: one number for every channel, or one per channel.
Stat = float | Sequence[float] | Tensor | None


class StatisticsError(OptionError):
    """A bad normalisation statistic; the message names the argument itself (``std must be ...``)."""

    prefixed = False


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_single(value: Stat) -> bool:
    """Whether a statistic was given as one number for every channel (a number, a 0-d tensor or
    array, or None), not as a list of one value per channel."""
    return value is None or isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0


def _values(n: int) -> str:
    return f"{n} value" if n == 1 else f"{n} values"


def _stat(value: Stat, name: str, empty: float) -> Tensor:
    """A statistic as float32 [n] (``empty`` where None)."""
    if value is None:
        return torch.tensor([empty], dtype=torch.float32)
    try:
        t = torch.as_tensor(value.tolist() if isinstance(value, Tensor) else value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise StatisticsError(f"{name} must be a number or a list of numbers, got {value!r}", field=name) from None
    t = t.reshape(-1) if t.ndim == 0 else t
    if t.ndim != 1 or t.numel() == 0 or not torch.isfinite(t).all():
        raise StatisticsError(f"{name} must be finite numbers, one per channel, got {value!r}", field=name)
    return t


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std`` as a model's first layer, so that inputs and sigma stay in
    pixel units.

    timm, torchvision and Hugging Face models expect normalised inputs. Give the model the
    normalisation instead of the data, and sigma is the noise per pixel value in [0, 1]::

        model = nn.Sequential(probust.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]), net)
        model = probust.with_normalization(net)             # a timm model: its pretrained_cfg

    or build the layer from where the statistics are written: :meth:`from_timm`,
    :meth:`from_torchvision`, :meth:`from_hf`. Noise of std ``sigma`` on ``x`` is noise of std
    ``sigma / std[c]`` on channel c of the normalised input.

    Args:
        mean: the per-channel means: a list of C values, or a single number for every channel;
            None: 0.
        std: the per-channel standard deviations, positive: a list of C values, or a single
            number; None: 1. Without ``channels``, two lists give the same C.
        channels: C, when it is not the length of ``mean`` or ``std`` (a list of one value is
            then broadcast to C channels too); by default the longer of the two.

    Attributes:
        mean, std: float32 buffers [1, C, 1, 1] (saved with the model).
        channels: C.

    Raises:
        StatisticsError: (an :class:`~probust.errors.OptionError`, a ``ValueError``) a statistic
            that is not finite, a std that is not positive, or lengths that disagree (``mean`` and
            ``std`` lists of different lengths without ``channels``, e.g. ``Normalize([0.5],
            [0.5, 0.5])``); ``field`` names the argument.

    Shapes:
        ``[B, C, ...]`` -> the same: images ``[B, C, H, W]``, or features ``[B, F]`` (one statistic
        per feature); a single statistic applies to any input.
    """

    mean: Tensor
    std: Tensor

    def __init__(self, mean: Stat = None, std: Stat = None, *, channels: int | None = None) -> None:
        super().__init__()
        mean_t, std_t = _stat(mean, "mean", 0.0), _stat(std, "std", 1.0)
        if channels is not None and (not _is_count(channels) or channels < 1):
            raise StatisticsError(f"channels must be a positive integer, got {channels!r}", field="channels")
        c = int(channels) if channels is not None else max(mean_t.numel(), std_t.numel())
        for label, t in (("mean", mean_t), ("std", std_t)):
            if t.numel() not in (1, c):
                raise StatisticsError(
                    f"{label} must have 1 or {c} values (one per channel), got {t.numel()}", field=label
                )
        if (std_t <= 0).any():
            raise StatisticsError(f"std must be positive, got {std_t.tolist()}", field="std")
        if channels is None and not _is_single(mean) and not _is_single(std) and mean_t.numel() != std_t.numel():
            # Two lists give one value per channel each, so they must agree on the channels (the
            # one-value list is the shorter: other lengths are refused above).
            short, one = ("mean", mean_t) if mean_t.numel() < std_t.numel() else ("std", std_t)
            raise StatisticsError(
                f"mean has {_values(mean_t.numel())} and std {_values(std_t.numel())}, a list gives one value per "
                f"channel: give {c} values to both, or {short} as a single number for every channel "
                f"({short}={one.item():g}, not [{one.item():g}])",
                field=short,
            )
        self.channels = c
        self.register_buffer("mean", mean_t.expand(c).clone().view(1, c, 1, 1))
        self.register_buffer("std", std_t.expand(c).clone().view(1, c, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, ...]`` -> ``[B, C, ...]``, ``(x - mean) / std`` per channel (dimension 1)."""
        if x.dim() == 4:  # images: the buffers' own shape
            mean, std = self.mean, self.std
        else:
            shape = [1, self.mean.shape[1]] + [1] * (x.dim() - 2)
            mean, std = self.mean.reshape(shape), self.std.reshape(shape)
        # torch.jit.trace records shapes as tensors: the check, a constant there, is left to the
        # eager call.
        channels = self.channels
        if channels != 1 and not torch.jit.is_tracing() and (x.dim() < 2 or x.shape[1] != channels):
            raise ValueError(
                f"Normalize: statistics for {channels} channels, but the input has shape {list(x.shape)} "
                f"(expected [B, {channels}, ...])"
            )
        return (x - mean) / std

    @property
    def input_channels(self) -> int | None:
        """The channels this layer takes in dimension 1 of its input; None where one statistic
        applies to any input (how the model contract names a mismatch:
        :func:`probust._inputs.input_problem`)."""
        return None if self.channels == 1 else self.channels

    def extra_repr(self) -> str:
        # float32 buffers: 0.485 is stored as 0.48500001...; 6 significant digits read as given
        mean, std = ([float(f"{v:.6g}") for v in t.flatten().tolist()] for t in (self.mean, self.std))
        return f"mean={mean}, std={std}"

    def wrap(self, model: nn.Module) -> nn.Sequential:
        """``nn.Sequential(self, model)``: ``model`` fed normalised inputs (``[0]`` is this layer,
        ``[1]`` the model)."""
        return nn.Sequential(self, model)

    @classmethod
    def from_timm(cls, model: Any) -> Normalize:
        """The normalisation of a timm model: its ``pretrained_cfg``'s ``mean`` and ``std`` (there
        after ``timm.create_model(name, pretrained=False)`` too; nothing is downloaded), or of such
        a config (a dict or timm's ``PretrainedCfg``).

        Raises:
            OptionError: ``model`` has no such config (``field`` "model").
        """
        return cls(*timm_stats(model, "model"))

    @classmethod
    def from_torchvision(cls, weights: Any) -> Normalize:
        """The normalisation of torchvision weights (``ResNet18_Weights.DEFAULT``: the ``mean`` and
        ``std`` of its ``transforms()``), of a transform with ``mean`` and ``std``
        (``transforms.Normalize``), or of the one normalising step of a ``transforms.Compose``.

        Raises:
            OptionError: nothing there normalises (``field`` "weights").
        """
        return cls(*torchvision_stats(weights, "weights"))

    @classmethod
    def from_hf(cls, processor: Any) -> Normalize:
        """The normalisation of a Hugging Face image processor (``image_mean``, ``image_std``; the
        identity where ``do_normalize`` is false), of its settings (a dict) or of a folder holding
        its ``preprocessor_config.json``.

        Raises:
            OptionError: no processor file in the folder, or no statistics (``field`` "processor").
        """
        stats = hf_stats(processor, "processor")
        return cls() if stats is None else cls(*stats)

    @classmethod
    def of(cls, source: Any) -> Normalize:
        """The normalisation ``source`` records, whichever of the above it is (a :class:`Normalize`
        is returned as it is).

        Raises:
            OptionError: ``source`` is none of these (``field`` "stats").
        """
        if isinstance(source, Normalize):
            return source
        stats = stats_of(source, "stats")
        return cls() if stats is None else cls(*stats)


def with_normalization(model: nn.Module, stats: Any = None, *, mean: Stat = None, std: Stat = None) -> nn.Sequential:
    """``model`` fed ``(x - mean) / std``, so that x and sigma are in pixel units.

    Examples::

        probust.with_normalization(timm.create_model("resnet18"))              # its pretrained_cfg
        probust.with_normalization(resnet18(), ResNet18_Weights.DEFAULT)       # torchvision weights
        probust.with_normalization(vit, AutoImageProcessor.from_pretrained(d))  # a HF processor
        probust.with_normalization(net, mean=[0.5], std=[0.5])                  # the numbers

    Args:
        model: the classifier, taking normalised inputs ``[B, C, ...]``.
        stats: where the statistics are written (see :meth:`Normalize.of`: a timm model or
            config, torchvision weights or transform, a Hugging Face processor or its folder, a
            :class:`Normalize`); None: ``mean`` and ``std``, or else ``model``'s own timm
            ``pretrained_cfg``.
        mean, std: the per-channel statistics, instead of ``stats``.

    Returns:
        ``nn.Sequential(Normalize(...), model)`` (its state_dict holds the statistics), the same
        module as one written by hand.

    Raises:
        OptionError: both ``stats`` and ``mean``/``std``, or no statistics found.
    """
    if not isinstance(model, nn.Module):
        raise OptionError(f"expected a torch.nn.Module, got {type(model).__name__}", field="model")
    given = mean is not None or std is not None
    if stats is not None and given:
        raise OptionError("give either stats or mean and std, not both", field="stats")
    if given:
        layer = Normalize(mean, std)
    elif stats is not None:
        layer = Normalize.of(stats)
    else:
        try:
            layer = Normalize.from_timm(model)
        except OptionError:
            raise OptionError(
                f"{type(model).__name__} does not record its normalisation (a timm model's pretrained_cfg); give "
                "stats (torchvision weights, a Hugging Face image processor) or mean and std",
                field="stats",
            ) from None
    return layer.wrap(model)
