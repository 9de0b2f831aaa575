"""Where a model's input normalisation is written down: timm, torchvision and Hugging Face.

Each reader returns ``(mean, std)``, two lists of floats (one per channel), read from objects the
user already has, with no import of the library itself (duck typing) and no download:

* timm: a model's ``pretrained_cfg`` (or ``default_cfg``), present after
  ``timm.create_model(name, pretrained=False)``;
* torchvision: a weights enum's ``transforms()`` preset (``ResNet18_Weights.DEFAULT``), a
  ``transforms.Normalize``, or a ``Compose`` holding one;
* Hugging Face: an image processor's ``image_mean`` / ``image_std`` (None where ``do_normalize``
  is false: the model takes its inputs as they are), its ``preprocessor_config.json`` as a dict,
  or the folder holding that file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probust.errors import OptionError

__all__ = ["PROCESSOR_FILE", "hf_stats", "stats_of", "timm_stats", "torchvision_stats"]

#: The file of a Hugging Face folder that holds its image processor's settings.
PROCESSOR_FILE = "preprocessor_config.json"

Stats = tuple[list[float], list[float]]


def _floats(values: Any, what: str, field: str) -> list[float]:
    if isinstance(values, (int, float)):
        return [float(values)]
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise OptionError(f"{what} is not a list of numbers: {values!r}", field=field) from None


def timm_stats(source: Any, field: str = "model") -> Stats:
    """The mean and std of a timm model's ``pretrained_cfg`` (or of the config itself: a dict
    or timm's ``PretrainedCfg``).

    Raises:
        OptionError: ``source`` has no such config, or the config has no mean and std.
    """
    cfg = source
    if not isinstance(source, Mapping):
        cfg = getattr(source, "pretrained_cfg", None) or getattr(source, "default_cfg", None) or source
    get = cfg.get if isinstance(cfg, Mapping) else lambda key: getattr(cfg, key, None)
    mean, std = get("mean"), get("std")
    if mean is None or std is None:
        raise OptionError(
            f"{type(source).__name__} has no pretrained_cfg with mean and std (a timm model made by "
            "timm.create_model has one); give mean and std yourself",
            field=field,
        )
    return _floats(mean, "pretrained_cfg's mean", field), _floats(std, "pretrained_cfg's std", field)


def _is_normalize(t: Any) -> bool:
    return hasattr(t, "mean") and hasattr(t, "std") and not isinstance(t, (Mapping, str))


def torchvision_stats(source: Any, field: str = "weights") -> Stats:
    """The mean and std of a torchvision weights enum (its ``transforms()`` preset), of a
    transform with ``mean`` and ``std`` (``transforms.Normalize``, a preset), or of the one
    normalising step of a ``Compose``.

    Raises:
        OptionError: nothing there normalises, or a ``Compose`` normalises more than once.
    """
    transforms = getattr(source, "transforms", None)
    if callable(transforms) and not _is_normalize(source):
        source = transforms()  # a weights enum: its evaluation preset (no download)
        transforms = getattr(source, "transforms", None)
    if not _is_normalize(source) and isinstance(transforms, (list, tuple)):  # a Compose
        steps = [t for t in transforms if _is_normalize(t)]
        if len(steps) != 1:
            what = "no step that normalises" if not steps else f"{len(steps)} steps that normalise"
            raise OptionError(f"the transform {type(source).__name__} has {what}", field=field)
        source = steps[0]
    if not _is_normalize(source):
        raise OptionError(
            f"expected torchvision weights (e.g. ResNet18_Weights.DEFAULT) or a transform with mean and std, got "
            f"{type(source).__name__}",
            field=field,
        )
    return _floats(source.mean, "the transform's mean", field), _floats(source.std, "the transform's std", field)


def hf_stats(source: Any, field: str = "processor") -> Stats | None:
    """The ``image_mean`` and ``image_std`` of a Hugging Face image processor, of its settings (a
    dict, as in ``preprocessor_config.json``) or of a folder holding that file; None where
    ``do_normalize`` is false (the model takes its inputs unnormalised).

    Raises:
        OptionError: the folder has no processor file, or the processor normalises without
            saying with what.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source) / PROCESSOR_FILE
        if not path.is_file():
            raise OptionError(f"{Path(source)} has no {PROCESSOR_FILE}", field=field)
        source = json.loads(path.read_text())
    get = source.get if isinstance(source, Mapping) else lambda key: getattr(source, key, None)
    if get("do_normalize") is False:
        return None
    mean, std = get("image_mean"), get("image_std")
    if mean is None or std is None:
        raise OptionError(
            f"the image processor {type(source).__name__} normalises but has no image_mean and image_std", field=field
        )
    return _floats(mean, "image_mean", field), _floats(std, "image_std", field)


def stats_of(source: Any, field: str = "stats") -> Stats | None:
    """The mean and std that ``source`` records, whichever of the above it is (a timm model or
    config, torchvision weights or a transform, a Hugging Face processor, its dict or folder);
    None for a Hugging Face processor that does not normalise.

    Raises:
        OptionError: ``source`` is none of these.
    """
    if isinstance(source, (str, os.PathLike)):
        return hf_stats(source, field)
    if isinstance(source, Mapping):
        if "image_mean" in source or "do_normalize" in source:
            return hf_stats(source, field)
        return timm_stats(source, field)
    if hasattr(source, "image_mean") or hasattr(source, "do_normalize"):
        return hf_stats(source, field)
    if getattr(source, "pretrained_cfg", None) or getattr(source, "default_cfg", None):
        return timm_stats(source, field)
    if callable(getattr(source, "transforms", None)) or _is_normalize(source) or hasattr(source, "transforms"):
        return torchvision_stats(source, field)
    raise OptionError(
        "expected where the statistics are written: a timm model (its pretrained_cfg), torchvision weights "
        "(ResNet18_Weights.DEFAULT) or a transform with mean and std, or a Hugging Face image processor (or its "
        f"folder); got {type(source).__name__}",
        field=field,
    )
