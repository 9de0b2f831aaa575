"""Where a run's points and model come from: the device, the data set, the model, and their hashes.

Everything here runs before any work: a data set or model that cannot be used raises
:class:`~probust.run.ConfigError` with a one-line message naming the argument.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust._checks import eval_mode
from probust._io import sha256_file
from probust._json import jsonable
from probust.run.distributed import World
from probust.run.errors import ConfigError, first_line

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
        raise ConfigError(f"device: unknown device {device!r}; expected cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: cuda was asked for but no CUDA GPU is available here (use device='cpu' or device='auto')"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device: mps was asked for but is not available here")
    return dev.type


def resolve_device(device: str | torch.device, device_type: str, world: World) -> torch.device:
    """The device this process runs on (under torchrun on GPUs: cuda:LOCAL_RANK), made current."""
    if device_type != "cuda":
        return torch.device(device_type)
    dev = torch.device("cuda") if str(device) == "auto" else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", world.local_rank if world.distributed else torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device: {dev} does not exist here ({torch.cuda.device_count()} GPUs)")
    torch.cuda.set_device(dev)  # so that code allocating on "cuda" without an index uses this rank's GPU
    return dev


def load_data(data: Any, split: str, root: str | os.PathLike | None, download: bool) -> Any:
    """The data set: ``data`` itself when it is one, else ``probust.data.load`` of the name."""
    if not isinstance(data, (str, os.PathLike)):
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise ConfigError(
                f"data: must be a data set name or a Dataset with ds[i] -> (x, label), got {type(data).__name__}"
            )
        if len(data) == 0:
            raise ConfigError("data: the data set is empty")
        try:
            batch(data, np.arange(1, dtype=np.int64))
        except Exception as exc:
            raise ConfigError(
                f"data: cannot read ds[0] as (x, label) ({type(exc).__name__}: {first_line(exc)})"
            ) from None
        return data
    from probust import data as pdata

    try:
        return pdata.load(str(data), split, root=root, download=download)
    except (pdata.ProbustDataError, FileNotFoundError) as exc:
        lines = str(exc).strip().splitlines()
        hint = next((line for line in lines if line.startswith("to get it")), "")
        raise ConfigError(f"data: {lines[0] if lines else exc}" + (f" ({hint})" if hint else "")) from None
    except ValueError as exc:
        raise ConfigError(f"data: {first_line(exc)}") from None


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
    h = hashlib.sha256()
    for first in range(0, len(ds), chunk):
        x, y = batch(ds, np.arange(first, min(first + chunk, len(ds)), dtype=np.int64))
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
    model: Any, device: torch.device, ds: Any, allow_pickle: bool
) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """The model on ``device``, a JSON description (with its sha256), and warnings."""
    shape, classes, notes = input_shape(ds), num_classes(ds), []
    if isinstance(model, nn.Module):
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
            raise ConfigError(f"model: no model file at {path}")
        from probust import models as pmodels

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
                f"model: {first_line(exc)} (data set {data_name(ds)}: input shape {list(shape)}, {classes} classes)"
            ) from None
        except (pmodels.CheckpointError, OSError) as exc:
            raise ConfigError(f"model: {first_line(exc)}") from None
        trained_on = meta.get("dataset")
        if trained_on is not None and hasattr(ds, "name"):
            from probust.data import canonical_name

            try:
                same = canonical_name(str(trained_on)) == canonical_name(str(ds.name))
            except ValueError:
                same = str(trained_on) == str(ds.name)
            if not same:
                notes.append(f"the model was trained on {trained_on}, it is scored on {ds.name}")
        info = {"source": str(path.resolve()), "meta": config_value(meta), "sha256": sha256_file(path)}
    else:
        raise ConfigError(f"model: must be a path to a model file or a torch.nn.Module, got {type(model).__name__}")
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
            f"model: does not accept inputs of shape {list(shape)} from {data_name(ds)} "
            f"({type(exc).__name__}: {first_line(exc)})"
        ) from None
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != x.shape[0]:
        desc = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ConfigError(f"model: returns {desc} for a batch of {x.shape[0]}, expected logits [batch, classes]")
    if classes is not None and out.shape[1] != classes:
        raise ConfigError(f"model: has {out.shape[1]} classes, the data set {data_name(ds)} has {classes}")
