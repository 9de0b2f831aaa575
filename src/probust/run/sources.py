"""Where a run's points and model come from: the device, the data set, the model, and their hashes.

Everything here runs before any work: a data set or model that cannot be used raises
:class:`~probust.run.ConfigError` with a one-line message naming the argument.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust._checks import eval_mode
from probust._io import sha256_file
from probust._json import jsonable
from probust.errors import Setting, first_parts
from probust.run.distributed import World
from probust.run.errors import ConfigError, first_line

#: The options of :class:`probust.data.FileOptions`: run settings of the same names.

__all__ = [
    "batch",
    "config_value",
    "data_name",
    "data_split",
    "device_type",
    "hash_data",
    "hash_state_dict",
    "input_shape",
    "load_data",
    "load_model",
    "num_classes",
    "resolve_device",
]


def device_type(device: str | torch.device) -> str:
    """The device type the run will use ("auto" resolved), checked to exist on this machine."""
    if str(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"unknown device {device!r}; expected cpu, cuda, cuda:N or auto", field="device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "cuda was asked for but no CUDA GPU is available here (use ",
            Setting("device", "cpu"),
            " or ",
            Setting("device", "auto"),
            ")",
            field="device",
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("mps was asked for but is not available here", field="device")
    return dev.type


def resolve_device(device: str | torch.device, device_type: str, world: World) -> torch.device:
    """The device this process runs on (under torchrun on GPUs: cuda:LOCAL_RANK), made current."""
    if device_type != "cuda":
        return torch.device(device_type)
    dev = torch.device("cuda") if str(device) == "auto" else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", world.local_rank if world.distributed else torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{dev} does not exist here ({torch.cuda.device_count()} GPUs)", field="device")
    torch.cuda.set_device(dev)  # so that code allocating on "cuda" without an index uses this rank's GPU
    return dev


def load_data(data: Any, split: str, root: str | os.PathLike | None, download: bool, options: Any = None) -> Any:
    """The data set: ``data`` itself when it is one, ``probust.data.load`` of a built-in name, else
    ``probust.data.load_file`` of a file or folder with ``options`` (:class:`probust.data.FileOptions`)."""
    from probust import data as pdata

    if isinstance(data, (str, os.PathLike)) and not pdata.is_builtin(data):
        try:
            return pdata.load_file(data, options)
        except pdata.ProbustDataError as exc:
            parts = first_parts(exc)  # the settings it names kept as such (flags on the command line)
            if not Path(data).exists():
                parts = (*parts, f", and not a built-in data set (known data sets: {', '.join(pdata.DATASETS)})")
            raise ConfigError(*parts, field="data") from None
        except ValueError as exc:  # an option that does not apply, or a bad option value
            raise ConfigError(
                first_line(exc) if getattr(exc, "field", None) is None else exc.reason,  # type: ignore[attr-defined]
                field=getattr(exc, "field", None) or "data_options",
            ) from None
    if options:
        given = pdata.FileOptions.of(options).given()
        if given:
            raise ConfigError("applies to data files and folders, not to built-in data sets", field=next(iter(given)))
    if not isinstance(data, (str, os.PathLike)):
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise ConfigError(
                f"must be a data set name or a Dataset with ds[i] -> (x, label), got {type(data).__name__}",
                field="data",
            )
        if len(data) == 0:
            raise ConfigError("the data set is empty", field="data")
        try:
            batch(data, np.arange(1, dtype=np.int64))
        except Exception as exc:
            raise ConfigError(
                f"cannot read ds[0] as (x, label) ({type(exc).__name__}: {first_line(exc)})", field="data"
            ) from None
        return data
    try:
        return pdata.load(str(data), split, root=root, download=download)
    except pdata.ProbustDataError as exc:
        # Its first line, and how to get the data (with the settings it names, kept as such).
        # probust.data's ``root`` is the run's ``data_root``.
        lines = exc.lines()
        hint = next((line for line in lines if line and str(line[0]).startswith("to get it")), ())
        error = ConfigError(*lines[0], *((" (", *hint, ")") if hint else ()), field="data")
        raise error.renamed({"root": "data_root"}) from None
    except FileNotFoundError as exc:
        raise ConfigError(first_line(exc), field="data") from None
    except ValueError as exc:
        raise ConfigError(*first_parts(exc), field="data") from None


def data_name(ds: Any) -> str:
    """The data set's name (its class name when it has none)."""
    return str(getattr(ds, "name", None) or type(ds).__name__)


def data_split(ds: Any, split: str) -> str:
    """The data set's split (``split`` when it does not say)."""
    return str(getattr(ds, "split", None) or split)


def batch(ds: Any, indices: np.ndarray) -> tuple[Tensor, Tensor]:
    """Points ``indices`` of ``ds``: (x float32 [B, *S], labels int64 [B])."""
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(torch.from_numpy(indices)).tensors()
    # A generic torch Dataset can only be read item by item.
    items = [ds[int(i)] for i in indices]
    x = torch.stack([torch.as_tensor(item[0]) for item in items]).to(torch.float32)
    y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
    return x, y


def input_shape(ds: Any) -> tuple[int, ...]:
    """The shape of one point, [C, H, W]."""
    shape = getattr(ds, "input_shape", None)
    if shape is None:
        shape = tuple(torch.as_tensor(ds[0][0]).shape)
    return tuple(int(s) for s in shape)


def num_classes(ds: Any) -> int | None:
    """The number of classes, or None when the data set does not say."""
    n = getattr(ds, "num_classes", None)
    if n is None and getattr(ds, "classes", None) is not None:
        n = len(ds.classes)
    return None if n is None else int(n)


def hash_data(ds: Any, chunk: int = 4096) -> str:
    """sha256 over every point's float32 values and label (so a changed file is noticed)."""
    from probust.data import ProbustDataError

    h = hashlib.sha256()
    for first in range(0, len(ds), chunk):
        try:
            x, y = batch(ds, np.arange(first, min(first + chunk, len(ds)), dtype=np.int64))
        except ProbustDataError as exc:  # an image of a folder that fails to decode
            raise ConfigError(*first_parts(exc), field="data") from None
        h.update(x.contiguous().numpy().tobytes())
        h.update(y.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def hash_state_dict(model: nn.Module) -> str:
    """sha256 over a module's state_dict: names, dtypes, shapes and raw bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def config_value(value: Any) -> Any:
    """JSON types for config.json; an object JSON cannot hold is written as its str()."""
    return jsonable(value, lambda v: v if isinstance(v, (str, int, float, bool)) or v is None else str(v))


def load_model(
    model: Any,
    device: torch.device,
    ds: Any,
    allow_pickle: bool,
    weights: str | os.PathLike | None = None,
    model_args: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """The model on ``device``, a JSON description (with its sha256), and warnings.

    ``model`` is an ``nn.Module``, a model file, ``hf:FOLDER`` (a Hugging Face image classifier
    saved with ``save_pretrained``), or ``package.module:function`` (a factory called with the
    keyword arguments ``model_args``), into which ``weights`` (a state_dict file) are then loaded."""
    shape, classes, notes = input_shape(ds), num_classes(ds), []
    from probust import data as pdata
    from probust import models as pmodels

    factory = isinstance(model, (str, os.PathLike)) and pmodels.is_factory(model)
    if model_args and not factory:
        raise ConfigError("apply to a model given as package.module:function only", field="model_args")
    if weights is not None and not factory:
        raise ConfigError("apply to a model given as package.module:function only", field="weights")
    if isinstance(model, str) and model.startswith(pmodels.HF_PREFIX):
        try:
            module, meta = pmodels.load_hf_classifier(model[len(pmodels.HF_PREFIX) :])
        except pmodels.CheckpointError as exc:
            raise ConfigError(*first_parts(exc), field="model") from None
        info: dict[str, Any] = {
            "source": f"{pmodels.HF_PREFIX}{Path(model[len(pmodels.HF_PREFIX) :]).resolve()}",
            "class": f"{type(module.model).__module__}.{type(module.model).__qualname__}",
            "meta": config_value(meta),
            "sha256": hash_state_dict(module),
        }
        module = module.to(device)
    elif isinstance(model, (str, os.PathLike)) and pmodels.is_factory(model):
        try:
            built = pmodels.build_from_factory(os.fspath(model), model_args)
        except pmodels.CheckpointError as exc:
            raise ConfigError(*first_parts(exc), field="model") from None
        if weights is not None:
            try:
                pmodels.load_weights(built, weights)
            except pmodels.CheckpointError as exc:
                raise ConfigError(*first_parts(exc), field="weights") from None
        info = {
            "source": f"factory:{os.fspath(model)}",
            "class": f"{type(built).__module__}.{type(built).__qualname__}",
            "args": dict(model_args or {}),
            "weights": None if weights is None else str(Path(weights).resolve()),
            "meta": {},
            "sha256": hash_state_dict(built),
        }
        module = built.to(device)
    elif isinstance(model, nn.Module):
        info = {
            "source": "nn.Module",
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "meta": config_value(getattr(model, "probust_spec", {}) or {}),
            "sha256": hash_state_dict(model),
        }
        module = model.to(device)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ConfigError(f"no model file at {path} (nor a factory package.module:function)", field="model")
        try:
            module, meta = pmodels.load_model(
                path,
                map_location=device,
                expect_num_classes=classes,
                expect_input_shape=shape,
                allow_pickle=allow_pickle,
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
            from probust.data import canonical_name

            try:
                same = canonical_name(str(trained_on)) == canonical_name(str(ds.name))
            except ValueError:
                same = str(trained_on) == str(ds.name)
            if not same:
                notes.append(f"the model was trained on {trained_on}, it is scored on {ds.name}")
        info = {"source": str(path.resolve()), "meta": config_value(meta), "sha256": sha256_file(path)}
    else:
        raise ConfigError(
            f"must be a path to a model file or a torch.nn.Module, got {type(model).__name__}", field="model"
        )
    _probe(module, ds, device, shape, classes)
    return module, info, notes


def _probe(model: nn.Module, ds: Any, device: torch.device, shape: tuple[int, ...], classes: int | None) -> None:
    """Run two real points through the model: it must give logits [2, num_classes]."""
    x, _ = batch(ds, np.arange(min(2, len(ds)), dtype=np.int64))
    try:
        with eval_mode(model), torch.no_grad():
            out = model(x.to(device))
    except Exception as exc:
        raise ConfigError(
            f"does not accept inputs of shape {list(shape)} from {data_name(ds)} "
            f"({type(exc).__name__}: {first_line(exc)})",
            field="model",
        ) from None
    from probust.models import output_problem

    problem = output_problem(out, x.shape[0])
    if problem is not None:
        raise ConfigError(f"{problem}", field="model")
    assert isinstance(out, Tensor)
    if classes is not None and out.shape[1] != classes:
        raise ConfigError(f"has {out.shape[1]} classes, the data set {data_name(ds)} has {classes}", field="model")
