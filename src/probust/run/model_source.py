"""Where a run's model comes from: a module, a model file, a Hugging Face folder or a factory,
loaded onto the device, described for ``config.json`` (with its sha256) and probed on two of the
data's points, before any work. A model that cannot be used raises
:class:`~probust.run.ConfigError` naming the argument.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from probust._inputs import MISSING_CHANNEL, UntrainedModelError, input_problem
from probust._io import sha256_file
from probust._user_model import (
    ModelOutputError,
    eval_mode,
    is_low_precision,
    logits_model,
    logits_reading,
    parameter_dtype,
    read_logits,
)
from probust.errors import Placeholder, Setting, first_parts
from probust.run.errors import ConfigError, first_line
from probust.run.sources import batch, config_value, data_name, data_units_note, input_shape, num_classes

__all__ = ["hash_state_dict", "load_model"]

# probust.models and probust.data are imported where a model is loaded: importing probust.run
# does not load the model zoo.


def load_model(
    model: Any,
    device: torch.device,
    ds: Any,
    allow_pickle: bool,
    weights: str | os.PathLike | None = None,
    model_args: Mapping[str, Any] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    untrained: bool = False,
) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """The model on ``device``, a JSON description (with its sha256), and warnings.

    ``model`` is an ``nn.Module``, a model file, ``hf:FOLDER`` (a Hugging Face image classifier
    saved with ``save_pretrained``), or ``package.module:function`` (a factory called with the
    keyword arguments ``model_args``), into which ``weights`` (a state_dict file) are then loaded
    (without them it is refused, :class:`~probust._inputs.UntrainedModelError`, unless ``untrained``).
    With ``mean`` or ``std`` (per-channel statistics; one value or one per channel of the data)
    the model is fed ``(x - mean) / std`` (:class:`probust.Normalize` in front of it; the
    description and its sha256 stay the model's own). The warnings include
    :func:`~probust.run.sources.data_units_note`'s and a Hugging Face folder's that does not say
    how to normalise."""
    from probust import models as pmodels

    shape, classes = input_shape(ds), num_classes(ds)
    notes: list[str] = []
    normalizing = mean is not None or std is not None
    if normalizing:
        _check_statistics_fit(mean, std, shape)
    factory = isinstance(model, (str, os.PathLike)) and pmodels.is_factory(model)
    if model_args and not factory:
        raise ConfigError("apply to a model given as package.module:function only", field="model_args")
    if weights is not None and not factory:
        raise ConfigError("apply to a model given as package.module:function only", field="weights")
    if isinstance(model, str) and model.startswith(pmodels.HF_PREFIX):
        module, info = _hf_folder(model[len(pmodels.HF_PREFIX) :], mean, std, notes)
    elif factory:
        module, info = _factory(os.fspath(model), model_args, weights, allow_pickle)
        if weights is None and not untrained:
            raise UntrainedModelError(
                f"{model} builds a model whose weights are random: give its trained state_dict with ",
                Setting("weights", Placeholder("FILE")),
                ", or ",
                Setting("untrained", True),
                " if an untrained model is meant",
                field="weights",
            )
    elif isinstance(model, nn.Module):
        module, info = (
            model,
            {
                "source": "nn.Module",
                "class": f"{type(model).__module__}.{type(model).__qualname__}",
                "meta": config_value(getattr(model, "probust_spec", {}) or {}),
                "sha256": hash_state_dict(model),
            },
        )
    elif isinstance(model, (str, os.PathLike)):
        module, info = _model_file(Path(model), device, ds, allow_pickle, notes)
    else:
        raise ConfigError(
            f"must be a path to a model file or a torch.nn.Module, got {type(model).__name__}", field="model"
        )
    module = module.to(device)
    if normalizing:
        # The run's one value is for every channel (a number to Normalize; a list is per channel).
        mean_for, std_for = (v[0] if v is not None and len(v) == 1 else v for v in (mean, std))
        module = pmodels.Normalize(mean_for, std_for).to(device).wrap(module)
    module = _probe(module, ds, device, shape, classes)
    note = data_units_note(ds, normalizing)
    if note is not None:
        notes.append(note)
    return module, info, notes


def _hf_folder(
    folder: str, mean: Sequence[float] | None, std: Sequence[float] | None, notes: list[str]
) -> tuple[nn.Module, dict[str, Any]]:
    """A Hugging Face image classifier saved in ``folder``, and its description; refuses
    ``mean``/``std`` where its image processor normalises already, and notes where it does not say."""
    from probust import models as pmodels

    try:
        module, meta = pmodels.load_hf_classifier(folder, warn=False)
    except pmodels.CheckpointError as exc:
        raise ConfigError(*first_parts(exc), field="model") from None
    hf_mean, hf_std, problem = pmodels.hf_normalization(folder)
    normalizing = mean is not None or std is not None
    if normalizing and hf_mean is not None:
        raise ConfigError(
            f"the folder's image processor normalises the inputs already (mean {hf_mean}, std {hf_std}): drop ",
            Setting("mean"),
            " and ",
            Setting("std"),
            " (they would normalise them twice)",
            field="mean" if mean is not None else "std",
        )
    if problem is not None and not normalizing:
        notes.append(problem)
    return module, {
        "source": f"{pmodels.HF_PREFIX}{Path(folder).resolve()}",
        "class": f"{type(module.model).__module__}.{type(module.model).__qualname__}",
        "meta": config_value(meta),
        "sha256": hash_state_dict(module),
    }


def _factory(
    name: str, model_args: Mapping[str, Any] | None, weights: str | os.PathLike | None, allow_pickle: bool
) -> tuple[nn.Module, dict[str, Any]]:
    """The model a ``package.module:function`` factory builds (with ``weights`` loaded), and its description."""
    from probust import models as pmodels

    try:
        built = pmodels.build_from_factory(name, model_args)
    except pmodels.CheckpointError as exc:
        raise ConfigError(*first_parts(exc), field="model") from None
    if weights is not None:
        try:
            pmodels.load_weights(built, weights, allow_pickle=allow_pickle)
        except pmodels.CheckpointError as exc:
            raise ConfigError(*first_parts(exc), field="weights") from None
    return built, {
        "source": f"factory:{name}",
        "class": f"{type(built).__module__}.{type(built).__qualname__}",
        "args": dict(model_args or {}),
        "weights": None if weights is None else str(Path(weights).resolve()),
        "meta": {},
        "sha256": hash_state_dict(built),
    }


def _model_file(
    path: Path, device: torch.device, ds: Any, allow_pickle: bool, notes: list[str]
) -> tuple[nn.Module, dict[str, Any]]:
    """The model in a file (checked against the data's input shape and classes), and its
    description; notes a model trained on another built-in data set."""
    from probust import data as pdata
    from probust import models as pmodels

    shape, classes = input_shape(ds), num_classes(ds)
    if not path.is_file():
        raise ConfigError(f"no model file at {path} (nor a factory package.module:function)", field="model")
    try:
        module, meta = pmodels.load_model(
            path, map_location=device, expect_num_classes=classes, expect_input_shape=shape, allow_pickle=allow_pickle
        )
    except pmodels.CheckpointMismatchError as exc:
        raise ConfigError(
            f"{first_line(exc)} (data set {data_name(ds)}: input shape {list(shape)}, {classes} classes)",
            field="model",
        ) from None
    except (pmodels.CheckpointError, OSError) as exc:
        raise ConfigError(*first_parts(exc), field="model") from None
    trained_on = meta.get("dataset")
    # Between built-in sets only: a user's files are named freely (train.csv, test.csv).
    if trained_on is not None and hasattr(ds, "name") and pdata.is_builtin(str(trained_on)):
        try:
            same = pdata.canonical_name(str(trained_on)) == pdata.canonical_name(str(ds.name))
        except ValueError:
            same = str(trained_on) == str(ds.name)
        if not same:
            notes.append(f"the model was trained on {trained_on}, it is scored on {ds.name}")
    return module, {"source": str(path.resolve()), "meta": config_value(meta), "sha256": sha256_file(path)}


def _check_statistics_fit(mean: Sequence[float] | None, std: Sequence[float] | None, shape: tuple[int, ...]) -> None:
    """Raise :class:`~probust.run.ConfigError` (on ``mean`` or ``std``) unless each has one value,
    or one per channel of inputs of ``shape`` ([C, ...]: C = shape[0])."""
    for name, values in (("mean", mean), ("std", std)):
        if values is None or len(values) == 1:
            continue
        if not shape:
            raise ConfigError(f"the inputs are single numbers: give one value, not {len(values)}", field=name)
        if len(values) != shape[0]:
            raise ConfigError(
                f"has {len(values)} values, the inputs {list(shape)} have {shape[0]} channels (dimension 0 of a "
                "point): give one value per channel, or one for all",
                field=name,
            )


def _probe(model: nn.Module, ds: Any, device: torch.device, shape: tuple[int, ...], classes: int | None) -> nn.Module:
    """Run two real points through the model: it must give logits [2, num_classes] as the model
    contract reads them (:mod:`probust._user_model`, as the estimators do). Returns the module
    the run computes with: ``model``, or a :class:`~probust._user_model.LogitsOf` it where its
    logits are unwrapped (a ModelOutput, a tuple) or its dtype is bfloat16 / float16."""
    x, _ = batch(ds, np.arange(min(2, len(ds)), dtype=np.int64))
    dtype = parameter_dtype(model)
    try:
        with eval_mode(model), torch.no_grad():
            # A bfloat16 / float16 model gets its inputs in its own dtype (LogitsOf casts them so).
            out = model(x.to(device, dtype if is_low_precision(dtype) else x.dtype))
    except Exception as exc:
        # What the model's first layer does not take (the channels, a missing dimension, as in Python).
        problem = input_problem(model, x.shape, "the points", "have")
        cause = f": {problem.text}" if problem is not None else ""
        advice: tuple[Any, ...] = ()
        if problem is not None and problem.missing == "channel":
            advice = ("; add it: ", MISSING_CHANNEL)
        raise ConfigError(
            f"does not accept inputs of shape {list(shape)} from {data_name(ds)}{cause} "
            f"({type(exc).__name__}: {first_line(exc)})",
            *advice,
            field="data" if problem is not None and problem.fewer_dims else "model",
        ) from None
    try:
        reading = logits_reading(out, x.shape[0])
    except ModelOutputError as exc:
        raise ConfigError(exc.reason, field="model") from None
    found = read_logits(out, reading).shape[1]
    if classes is not None and found != classes:
        raise ConfigError(f"has {found} classes, the data set {data_name(ds)} has {classes}", field="model")
    return logits_model(model, reading, dtype)


def hash_state_dict(model: nn.Module) -> str:
    """sha256 over a module's state_dict: names, dtypes, shapes and raw bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
