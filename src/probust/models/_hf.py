"""Hugging Face image classifiers saved with ``save_pretrained`` (``--model hf:DIR``), offline.

Needs ``transformers`` (``pip install probust[hf]``). The folder is read with
``local_files_only=True``: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from probust._untrusted import refusal, refused_objects
from probust.errors import OptionError, first_line
from probust.models._checkpoint import CheckpointError
from probust.models._stats_sources import PROCESSOR_FILE, hf_stats

#: The prefix that marks a Hugging Face folder as ``--model``.
HF_PREFIX = "hf:"


class HFImageClassifier(nn.Module):
    """A ``transformers`` image classifier as a logits model: ``[B, C, H, W]`` in [0, 1] -> logits.

    The processor's normalisation (``image_mean``, ``image_std`` of ``preprocessor_config.json``,
    when ``do_normalize`` is not false) is applied inside, so inputs and noise stay in [0, 1] pixel
    units; images are not resized (give the data the model's size, e.g. with ``--image-size``).

    Args:
        model: a ``transformers`` image classifier (``model(pixel_values=x).logits``).
        mean, std: the per-channel statistics applied first; None: none (inputs as given).
    """

    def __init__(self, model: nn.Module, mean: list[float] | None = None, std: list[float] | None = None) -> None:
        super().__init__()
        self.model = model
        shape = (1, -1, 1, 1)
        self.register_buffer("mean", None if mean is None else torch.tensor(mean, dtype=torch.float32).view(shape))
        self.register_buffer("std", None if std is None else torch.tensor(std, dtype=torch.float32).view(shape))

    mean: Tensor | None
    std: Tensor | None

    def forward(self, x: Tensor) -> Tensor:
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / self.std
        return self.model(pixel_values=x).logits


def hf_normalization(folder: str | os.PathLike) -> tuple[list[float] | None, list[float] | None, str | None]:
    """How a Hugging Face folder normalises its inputs: ``(mean, std, problem)``.

    ``mean`` and ``std`` are its processor's ``image_mean`` and ``image_std`` (None and None where
    there is none, or where ``do_normalize`` is false: the model then takes [0, 1] pixels as they
    are). ``problem`` says, where the folder does not tell, that the model will run on
    unnormalised [0, 1] inputs and how to give it the statistics; None where the folder tells.
    """
    path = Path(folder)
    processor = path / PROCESSOR_FILE
    consequence = (
        "the model runs on unnormalised [0, 1] inputs, so sigma is in those units but the model may expect "
        "normalised ones; give its statistics (--mean/--std on the command line; in Python mean= and std=, or "
        "probust.with_normalization(model, mean=..., std=...)), or save its image processor into the folder "
        "(processor.save_pretrained)"
    )
    if not processor.is_file():
        return None, None, f"{path} has no {PROCESSOR_FILE}: {consequence}"
    try:
        stats = hf_stats(json.loads(processor.read_text()), "processor")
    except (OptionError, ValueError) as exc:  # a processor without statistics, or a broken file
        reason = exc.reason if isinstance(exc, OptionError) else first_line(exc)
        return None, None, f"{processor}: {reason}: {consequence}"
    return (None, None, None) if stats is None else (*stats, None)


def load_hf_classifier(folder: str | os.PathLike, *, warn: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """The image classifier saved in ``folder`` (``save_pretrained``), in eval mode, and its meta
    (``format``, ``model_type``, ``labels`` from the config's ``id2label``, ``normalize``: whether
    its processor's statistics are applied inside).

    The model takes ``[B, C, H, W]`` pixels in [0, 1]; the folder's ``preprocessor_config.json``
    gives the normalisation applied inside (see :class:`HFImageClassifier`). A folder without one
    (or whose processor normalises without saying with what) runs the model on unnormalised
    inputs: a ``UserWarning`` says so (see :func:`hf_normalization`), unless ``warn`` is false.

    Raises:
        CheckpointError: ``transformers`` is missing, or the folder holds no image classifier.
    """
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: not a Hugging Face model folder (no config.json; save it with save_pretrained)")
    try:
        from transformers import AutoModelForImageClassification
    except ImportError:
        raise CheckpointError(
            f"{path}: a Hugging Face model needs the transformers package: pip install probust[hf]"
        ) from None
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a local folder loads in a moment; keep stderr for probust
    try:
        # No code from the folder runs: no remote code, and transformers reads weights saved with
        # torch.save with weights_only=True (safetensors need no unpickling at all).
        model = AutoModelForImageClassification.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:
        if refused_objects(exc):
            found = "weights saved with pickled Python objects (pytorch_model.bin)"
            advice = "save the model with save_pretrained (safetensors), or its state_dict of tensors"
            raise CheckpointError(*refusal(path, found, advice, allowed=False)) from None
        raise CheckpointError(
            f"{path}: cannot load an image classifier from it ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    mean, std, problem = hf_normalization(path)
    if problem is not None and warn:
        warnings.warn(problem, UserWarning, stacklevel=2)
    config = model.config
    meta = {
        "format": "huggingface",
        "model_type": getattr(config, "model_type", None),
        "labels": [str(config.id2label[i]) for i in sorted(config.id2label)] if config.id2label else [],
        "normalize": mean is not None,
    }
    return HFImageClassifier(model, mean, std).eval(), meta
