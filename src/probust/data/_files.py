"""A user's own data: which reader a path goes to, and the options the readers take."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from probust._options import option
from probust.data._errors import DataFormatError, ProbustDataError
from probust.data._folder import ImageFolderDataset, read_image_folder
from probust.data._tensors import TensorDataset, read_table, read_tensor_file
from probust.errors import OptionError

#: File endings of tensor files and of tables.
TENSOR_SUFFIXES = (".npz", ".pt", ".pth", ".npy")
TABLE_SUFFIXES = (".parquet", ".pq", ".csv")


@dataclass(frozen=True)
class FileOptions:
    """How to read a user's data file or folder (each option applies to one kind of source; an
    option given for another kind is refused, naming it). Each field is declared once with its help.
    """

    TITLE: ClassVar[str] = "your own data (a file or folder as --data)"

    x_key: str = option("x", help="tensor files: name of the inputs [N, ...] in .npz/.pt", metavar="KEY")
    y_key: str | None = option(
        None,
        help="tensor files: name of the labels [N] in .npz/.pt; for .npy, the labels' .npy file, relative to "
        "the inputs' folder",
        default_help="y; .npy: y.npy",
        metavar="KEY",
    )
    label_column: str | None = option(
        None,
        help="tables: the label column; integers are class indices, strings class names (sorted)",
        default_help="label",
        metavar="COL",
    )
    feature_columns: tuple[str, ...] | None = option(
        None,
        help="tables: the feature columns, in this order",
        default_help="every other column",
        metavar="COL",
        many=True,
    )
    image_size: int | tuple[int, ...] | None = option(
        None,
        help="image folders: resize to N x N (or H W)",
        default_help="the images' own size, which must then be the same for all",
        metavar="N",
        many=True,
        parse=int,
    )
    channels: int | None = option(
        None,
        help="image folders: 1 (grey) or 3 (RGB)",
        default_help="3 if any image is in colour",
        choices=(1, 3),
    )

    @classmethod
    def of(cls, options: FileOptions | Mapping[str, Any] | None) -> FileOptions:
        """``options`` as a FileOptions (a mapping's keys must be field names)."""
        if options is None:
            return cls()
        if isinstance(options, FileOptions):
            return options
        if not isinstance(options, Mapping):
            raise OptionError(f"must be a dict of {', '.join(f.name for f in fields(cls))}", field="data_options")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionError(
                f"unknown file option {unknown[0]!r}; known: {', '.join(sorted(known))}", field="data_options"
            )
        values = {k: v for k, v in options.items() if v is not None}
        if "feature_columns" in values:
            values["feature_columns"] = tuple(str(c) for c in values["feature_columns"])
        if isinstance(values.get("image_size"), Sequence):
            values["image_size"] = tuple(values["image_size"])
        return cls(**values)

    def given(self) -> dict[str, Any]:
        """The options set to something other than their default."""
        default = FileOptions()
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)
        }


def load_file(
    path: str | os.PathLike, options: FileOptions | Mapping[str, Any] | None = None
) -> TensorDataset | ImageFolderDataset:
    """A user's own data set, read from a file or folder (see :class:`FileOptions`).

    * a folder: images in one subfolder per class (:func:`~probust.data.read_image_folder`);
    * ``.npz``, ``.pt``/``.pth``, ``.npy``: inputs [N, ...] and integer labels [N];
    * ``.parquet``/``.pq``, ``.csv``: a table, one row per point.

    Returns:
        A data set with the interface of :class:`~probust.data.ImageDataset` (``classes``,
        ``input_shape``, ``tensors()``, ``subset()``); its ``split`` is "all".

    Raises:
        ProbustDataError: no such file or folder, or an unknown file type.
        DataFormatError: the data are not usable (the message names the file and the problem).
        ValueError: an unknown option.
    """
    opts = FileOptions.of(options)
    p = Path(path).expanduser()
    if not p.exists():
        raise ProbustDataError(f"{p}: no such file or folder")
    _check_applicable(p, opts)
    if p.is_dir() and (p / "dataset_info.json").is_file() and (p / "state.json").is_file():
        # Reading these needs the `datasets` package, which this version does not use.
        raise DataFormatError(
            f"{p}: a Hugging Face datasets folder (save_to_disk) is not read by this version of probust; "
            "export it to Parquet (ds.to_parquet('data.parquet')) for a table, or to a .npz of x and y"
        )
    if p.is_dir():
        return read_image_folder(p, opts.image_size, opts.channels)
    suffix = p.suffix.lower()
    if suffix in TENSOR_SUFFIXES:
        return read_tensor_file(p, opts.x_key, opts.y_key or ("y.npy" if suffix == ".npy" else "y"))
    if suffix in TABLE_SUFFIXES:
        return read_table(p, opts.label_column, opts.feature_columns)
    raise DataFormatError(
        f"{p}: unknown kind of data file {suffix or '(no ending)'}; expected a folder of images in class "
        f"subfolders, a tensor file ({', '.join(TENSOR_SUFFIXES)}) or a table ({', '.join(TABLE_SUFFIXES)})"
    )


def _check_applicable(p: Path, opts: FileOptions) -> None:
    """Refuse options that the kind of source does not read (so that a typo is not silently ignored)."""
    suffix = "folder" if p.is_dir() else p.suffix.lower()
    kinds = {
        "x_key": TENSOR_SUFFIXES,
        "y_key": TENSOR_SUFFIXES,
        "label_column": TABLE_SUFFIXES,
        "feature_columns": TABLE_SUFFIXES,
        "image_size": ("folder",),
        "channels": ("folder",),
    }
    for name in opts.given():
        if suffix not in kinds[name]:
            what = "an image folder" if suffix == "folder" else f"a {suffix} file"
            raise OptionError(f"does not apply to {what} ({p})", field=name)
