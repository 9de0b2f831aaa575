"""A user's own data held in memory: tensor files (``.npz``, ``.pt``, ``.npy``) and tables
(Parquet, CSV), each read into a :class:`TensorDataset`.

Every check here raises :class:`~probust.data.DataFormatError` with a message that names the
file and what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probust._extras import import_extra
from probust._inputs import TensorPoints
from probust._untrusted import numpy_load, torch_load
from probust.data._errors import DataFormatError
from probust.errors import Placeholder, Setting


class TensorDataset(TensorPoints):
    """Inputs and labels held in memory as tensors: ``ds[i] -> (x float32 [*input_shape], label int)``.

    The same interface as :class:`~probust.data.ImageDataset` (``name``, ``split``, ``classes``,
    ``input_shape``, ``num_classes``, ``targets``, ``subset``, ``tensors``, ``mean``, ``std``,
    ``source``), for inputs of any shape. Values are used as they are: noise ``sigma`` is in
    their units.

    Attributes:
        details: what else is known about the source (e.g. a table's feature columns), recorded
            in a results folder's ``config.json`` ("data").
        stored_dtype: the dtype the file stored the inputs in (e.g. "uint8": integer units, such
            as 0..255 pixels, served as float32 and refused by every entry point), or ``x``'s
            dtype where it is not floating point; else None.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        *,
        name: str,
        classes: Sequence[str],
        split: str = "all",
        source: str = "",
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        details: dict[str, Any] | None = None,
        stored_dtype: str | None = None,
    ) -> None:
        super().__init__(x, y)  # checked as any tensors a user passes (probust._inputs)
        self.name = name
        self.split = split
        self.classes = list(classes)
        self.source = source
        self.mean = tuple(mean) if mean is not None else (0.0,) * x.shape[1]
        self.std = tuple(std) if std is not None else (1.0,) * x.shape[1]
        self.details = dict(details or {})
        self.stored_dtype = stored_dtype or self.stored_dtype

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def tensors(self) -> tuple[Tensor, Tensor]:
        """``(X float32 [N, *input_shape], y int64 [N])``, copies."""
        return self._x.clone(), self._y.clone()

    def __repr__(self) -> str:
        return (
            f"TensorDataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, source={self.source!r})"
        )


def labels_and_classes(
    values: np.ndarray, path: Path, what: str, classes: Sequence[str] | None = None
) -> tuple[np.ndarray, list[str]]:
    """Labels as int64 [N] in [0, C) and the C class names.

    Strings (or other objects) are classes by name, sorted; numbers must be whole and >= 0, and
    below ``len(classes)`` when class names are given (else the classes are "0".."max").
    """
    values = np.asarray(values)
    if values.ndim != 1:
        raise DataFormatError(f"{path}: {what} must be one label per point (shape [N]), got shape {list(values.shape)}")
    if values.dtype.kind in "OUS":
        if classes is not None:
            raise DataFormatError(f"{path}: {what} are names, but the file also lists classes; give integer labels")
        if any(v is None or (isinstance(v, float) and np.isnan(v)) for v in values.tolist()):
            raise DataFormatError(f"{path}: {what} has missing values")
        names = sorted({str(v) for v in values.tolist()})
        lookup = {name: i for i, name in enumerate(names)}
        return np.array([lookup[str(v)] for v in values.tolist()], dtype=np.int64), names
    if values.dtype.kind == "b":
        values = values.astype(np.int64)
    if values.dtype.kind not in "iuf":
        raise DataFormatError(f"{path}: {what} must be integers or class names, got dtype {values.dtype}")
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DataFormatError(
                f"{path}: {what} must be whole numbers (class indices); point {first} has {float(values[first]):g} "
                f"({int(bad.sum())} such points)"
            )
    labels = values.astype(np.int64)
    if labels.size and labels.min() < 0:
        first = int(np.flatnonzero(labels < 0)[0])
        raise DataFormatError(f"{path}: {what} out of range: point {first} has label {labels[first]}, expected >= 0")
    if classes is not None:
        names = [str(c) for c in classes]
        if labels.size and labels.max() >= len(names):
            first = int(np.flatnonzero(labels >= len(names))[0])
            raise DataFormatError(
                f"{path}: {what} out of range: point {first} has label {labels[first]}, but the file lists "
                f"{len(names)} classes (labels 0..{len(names) - 1})"
            )
        return labels, names
    return labels, [str(i) for i in range(int(labels.max()) + 1 if labels.size else 0)]


def check_inputs(x: np.ndarray, path: Path, what: str) -> np.ndarray:
    """Inputs as float32 [N, ...]: numeric, at least one coordinate per point, no NaN or infinity."""
    if x.dtype.kind == "O":
        raise DataFormatError(f"{path}: {what} holds Python objects (mixed shapes?); save one numeric array [N, ...]")
    if x.dtype.kind not in "biuf":
        raise DataFormatError(f"{path}: {what} must be numbers, got dtype {x.dtype}")
    if x.ndim < 2:
        raise DataFormatError(f"{path}: {what} must have shape [N, ...] (one row per point), got {list(x.shape)}")
    if x.shape[0] == 0:
        raise DataFormatError(f"{path}: {what} holds no points (shape {list(x.shape)})")
    out = x.astype(np.float32)
    finite = np.isfinite(out.reshape(out.shape[0], -1)).all(axis=1)
    if not finite.all():
        first = int(np.flatnonzero(~finite)[0])
        raise DataFormatError(
            f"{path}: {what} has NaN or infinite values in {int((~finite).sum())} points (first: point {first})"
        )
    return out


def _array(value: Any, path: Path, key: str) -> np.ndarray:
    """A tensor, array or list of equal-shaped tensors as one numpy array."""
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Tensor) for v in value):
        shapes = sorted({tuple(v.shape) for v in value})
        if len(shapes) > 1:
            raise DataFormatError(
                f"{path}: {key!r} holds tensors of mixed shapes ({', '.join(str(list(s)) for s in shapes[:3])}"
                f"{', ...' if len(shapes) > 3 else ''}); every point must have the same shape"
            )
        return torch.stack(list(value)).numpy()
    try:
        return np.asarray(value)
    except ValueError as exc:  # a ragged list
        raise DataFormatError(f"{path}: {key!r} has mixed shapes ({exc})") from None


#: How to save data so that loading it runs no code (ends a refusal's message).
_SAFE_DATA = (
    "save the inputs and labels as arrays (numpy.savez(path, x=x, y=y)) or tensors (torch.save({'x': x, 'y': y}))"
)


def _numpy(path: Path) -> Any:
    """A ``.npy`` array or ``.npz`` archive, never unpickled (:func:`probust._untrusted.numpy_load`)."""
    return numpy_load(path, error=DataFormatError, advice=_SAFE_DATA)


def read_tensor_file(path: Path, x_key: str, y_key: str) -> TensorDataset:
    """A ``.npz``/``.pt`` file holding inputs ``x_key`` [N, ...] and labels ``y_key`` [N]
    (optionally ``classes``, a list of names), or a ``.npy`` of inputs whose labels are the
    ``.npy`` file ``y_key`` (a path, relative to the inputs' folder)."""
    suffix = path.suffix.lower()
    classes: Any = None
    try:
        if suffix == ".npy":
            y_path = Path(y_key) if Path(y_key).is_absolute() else path.parent / y_key
            if y_path.suffix.lower() != ".npy" or not y_path.is_file():
                raise DataFormatError(
                    f"{path}: the labels of a .npy file are another .npy file, named by y_key=FILE, "
                    f"relative to its folder; {y_path} is not one"
                )
            x_raw, y_raw = _numpy(path), _numpy(y_path)
        elif suffix == ".npz":
            with _numpy(path) as f:
                contents = {k: f[k] for k in f.files}
            x_raw, y_raw = _keys(contents, path, x_key, y_key)
            classes = contents.get("classes")
        else:
            obj = torch_load(path, allow_pickle=None, error=DataFormatError, advice=_SAFE_DATA)
            if isinstance(obj, (tuple, list)) and len(obj) == 2:
                x_raw, y_raw = _array(obj[0], path, "x"), _array(obj[1], path, "y")
            elif isinstance(obj, dict):
                x_raw, y_raw = _keys(obj, path, x_key, y_key)
                x_raw, y_raw = _array(x_raw, path, x_key), _array(y_raw, path, y_key)
                classes = obj.get("classes")
            else:
                raise DataFormatError(f"{path}: holds a {type(obj).__name__}; expected a dict {{x_key: x, y_key: y}}")
    except DataFormatError:
        raise
    except Exception as exc:  # unreadable, pickled objects, truncated
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataFormatError(f"{path}: cannot read it as a {suffix} file ({type(exc).__name__}: {text})") from None
    stored = str(np.asarray(x_raw).dtype)
    x = check_inputs(np.asarray(x_raw), path, f"inputs {x_key!r}")
    if classes is not None:
        classes = [str(c) for c in np.asarray(classes).tolist()]
    y, names = labels_and_classes(np.asarray(y_raw), path, f"labels {y_key!r}", classes)
    if y.shape[0] != x.shape[0]:
        raise DataFormatError(f"{path}: {x.shape[0]} inputs but {y.shape[0]} labels")
    if x.shape[0] == 0:
        raise DataFormatError(f"{path}: holds no points")
    return TensorDataset(
        torch.from_numpy(x),
        torch.from_numpy(y),
        name=path.name,
        classes=names,
        source=str(path.resolve()),
        details={"format": suffix[1:], "x_key": x_key, "y_key": y_key},
        stored_dtype=stored,
    )


def _keys(contents: Any, path: Path, x_key: str, y_key: str) -> tuple[Any, Any]:
    missing = [k for k in (x_key, y_key) if k not in contents]
    if missing:
        have = ", ".join(repr(k) for k in contents) or "nothing"
        raise DataFormatError(
            f"{path}: has no {' or '.join(repr(k) for k in missing)} (it holds {have}); name the inputs and "
            "labels with x_key=NAME and y_key=NAME"
        )
    return contents[x_key], contents[y_key]


def read_table(path: Path, label_column: str | None, feature_columns: Sequence[str] | None) -> TensorDataset:
    """A Parquet or CSV table: one row per point, numeric feature columns and a label column."""
    pd = import_extra("pandas", extra="run", feature="reading a table (Parquet, CSV)")

    try:
        frame = pd.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") else pd.read_csv(path)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataFormatError(f"{path}: cannot read it as a table ({type(exc).__name__}: {text})") from None
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    label = label_column if label_column is not None else "label"
    if label not in columns:
        hint: tuple[Any, ...] = (
            ()
            if label_column is not None
            else (" (the default); name it with ", Setting("label_column", Placeholder("NAME")))
        )
        raise DataFormatError(f"{path}: has no label column {label!r}", *hint, f"; its columns: {', '.join(columns)}")
    features = list(feature_columns) if feature_columns is not None else [c for c in columns if c != label]
    unknown = [c for c in features if c not in columns]
    if unknown:
        raise DataFormatError(f"{path}: has no column {unknown[0]!r}; its columns: {', '.join(columns)}")
    if label in features:
        raise DataFormatError(f"{path}: the label column {label!r} cannot also be a feature column")
    if not features:
        raise DataFormatError(f"{path}: no feature columns besides the label column {label!r}")
    non_numeric = [
        c for c in features if not (pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))
    ]
    if non_numeric:
        raise DataFormatError(
            f"{path}: feature columns must be numbers; {', '.join(repr(c) for c in non_numeric[:5])} "
            f"{'is' if len(non_numeric) == 1 else 'are'} not (encode them, or choose the features with ",
            Setting("feature_columns", Placeholder("NAMES")),
            ")",
        )
    values = frame[features].to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        cols = [features[j] for j in np.flatnonzero(bad.any(axis=0))]
        raise DataFormatError(
            f"{path}: NaN or infinite feature values in {int(bad.any(axis=1).sum())} rows (columns "
            f"{', '.join(repr(c) for c in cols[:5])}); fill or drop them first"
        )
    if len(frame) == 0:
        raise DataFormatError(f"{path}: the table has no rows")
    raw = frame[label]
    if raw.isna().any():
        raise DataFormatError(f"{path}: the label column {label!r} has {int(raw.isna().sum())} missing values")
    labels = raw.to_numpy() if pd.api.types.is_numeric_dtype(raw) else raw.astype(str).to_numpy(dtype=object)
    y, names = labels_and_classes(labels, path, f"label column {label!r}")
    x = values.astype(np.float32)
    std = values.std(axis=0)
    return TensorDataset(
        torch.from_numpy(x),
        torch.from_numpy(y),
        name=path.name,
        classes=names,
        source=str(path.resolve()),
        mean=[float(v) for v in values.mean(axis=0)],
        std=[float(v) if v > 0 else 1.0 for v in std],
        details={"format": "table", "label_column": label, "features": features},
    )
