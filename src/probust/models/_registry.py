"""Architectures by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from probust.models._mlp import MLP
from probust.models._resnet import ResNet18
from probust.models._small import LinearClassifier, SmallCNN


def _vit(**kwargs: Any) -> nn.Module:
    from probust.models._vit import ViTClassifier  # imports transformers: only when asked for

    return ViTClassifier(**kwargs)


#: Architecture name -> constructor ``(num_classes, input_shape, **kwargs) -> nn.Module``.
ARCHS: dict[str, Callable[..., nn.Module]] = {
    "linear": LinearClassifier,
    "cnn": SmallCNN,
    "resnet18": ResNet18,
    "vit": _vit,
    "mlp": MLP,
}

#: Architectures that take inputs of any shape (flattened); the others need (channels, height, width).
FLAT_ARCHS = ("mlp",)

_SPEC_ATTR = "probust_spec"


def check_arch(arch: str) -> str:
    """Returns ``arch`` if known; raises ValueError listing the known names otherwise."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known architectures: {', '.join(ARCHS)}")
    return arch


def build(
    arch: str,
    num_classes: int = 10,
    input_shape: Sequence[int] = (1, 28, 28),
    **kwargs: Any,
) -> nn.Module:
    """Builds a freshly initialised model.

    Args:
        arch: one of :data:`ARCHS`: ``"linear"``, ``"cnn"``, ``"resnet18"``, ``"vit"``, ``"mlp"``.
        num_classes: number of logits C.
        input_shape: ``(C_in, H, W)`` of one input; any shape for ``"mlp"`` (e.g. ``(13,)``
            for 13 table features).
        **kwargs: architecture options: ``mean``/``std`` (per-channel input normalisation, a
            layer inside the model, pixel units) for all (per feature for ``mlp``); ``pretrained``
            and ``config`` for ``vit``; ``hidden`` (layer widths) for ``mlp``.

    Returns:
        A module mapping float32 ``[B, *input_shape]`` in [0, 1] to logits ``[B, num_classes]``.
        Its ``probust_spec`` attribute records how to rebuild it (used by ``save_checkpoint``).

    Raises:
        ValueError: unknown ``arch`` (the message lists the known ones) or a bad shape.
        ImportError: ``vit`` without ``transformers`` installed.
    """
    check_arch(arch)
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    shape = tuple(int(s) for s in input_shape)
    if arch in FLAT_ARCHS:
        if not shape or min(shape) < 1:
            raise ValueError(f"input_shape must be a non-empty shape of positive sizes, got {tuple(input_shape)}")
    elif len(shape) != 3 or min(shape) < 1:
        flat = f"; {' or '.join(FLAT_ARCHS)} takes flat inputs such as table rows" if len(shape) != 3 else ""
        raise ValueError(f"input_shape must be (channels, height, width) for {arch!r}, got {tuple(input_shape)}{flat}")
    model = ARCHS[arch](num_classes=int(num_classes), input_shape=shape, **kwargs)
    rebuild_of = getattr(model, "rebuild_kwargs", None)
    rebuild = rebuild_of() if callable(rebuild_of) else _jsonable(kwargs)
    setattr(
        model,
        _SPEC_ATTR,
        {"arch": arch, "num_classes": int(num_classes), "input_shape": list(shape), "arch_kwargs": rebuild},
    )
    return model


def spec_of(model: nn.Module) -> dict[str, Any] | None:
    """What :func:`build` recorded about ``model`` (arch, num_classes, input_shape, arch_kwargs)."""
    return getattr(model, _SPEC_ATTR, None)


def _jsonable(kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
        elif isinstance(v, (list, tuple)):
            out[k] = [float(e) if not isinstance(e, (str, bool)) else e for e in v]
        else:
            out[k] = v  # save_checkpoint reports anything json cannot write
    return out
