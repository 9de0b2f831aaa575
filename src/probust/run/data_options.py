"""What a run scores: the data, the model, the points and the noise levels (:class:`SourceOptions`,
shared by ``probust estimate`` and ``probust certify``), and the data's own options
(:class:`DataOptions`). Declared as :mod:`probust.run.settings` declares the other groups."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import nn

from probust._options import option
from probust.estimators import (
    DEFAULT_COPIES,
    DEFAULT_DRAWS,
    METHODS,
    PAPER_METHODS,
)
from probust.run import option_checks as checks
from probust.run.methods import DEFAULT_METHODS


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The model and how it is loaded: one group of flags for every command that loads a model
    (``probust estimate``, ``certify`` and ``issues``)."""

    TITLE: ClassVar[str] = "the model"

    model: str | os.PathLike | nn.Module = option(
        help="probust checkpoint, TorchScript file or torch.export (.pt2) file; package.module:function "
        "returning an nn.Module (called with --model-arg's keyword arguments; the current folder is searched "
        "first); or hf:FOLDER, a Hugging Face image classifier saved with save_pretrained (probust[hf]); from "
        "Python also an nn.Module mapping [B, C, H, W] to logits [B, num_classes] (its state_dict's sha256 "
        "identifies it)",
        metavar="FILE",
        check=checks.model,
    )
    model_args: Mapping[str, Any] = option(
        None,
        help="a keyword argument of the function of --model package.module:function, as KEY=VALUE (VALUE read "
        "as a JSON literal: 3, 0.5, true, null, [1, 2], else as text), e.g. num_classes=3; repeat for several. "
        "Recorded in config.json, part of the folder's identity",
        default_help="",
        flag="--model-arg",
        metavar="KEY=VALUE",
        repeat=True,
        parse=checks.model_argument,
        check=checks.model_args,
        record="model_args",
        implied={},
    )
    weights: str | os.PathLike | None = option(
        None,
        help="state_dict file loaded into the model built by --model package.module:function",
        default_help="",
        metavar="FILE",
        check=checks.path(True, "a state_dict file"),
    )
    allow_pickle: bool = option(
        False,
        help="accept model and weights files that run code when loaded (torch.save(model), a torch.export "
        "archive with pickled parts); see docs/security.md",
        check=checks.boolean,
    )
    mean: Sequence[float] | None = option(
        None,
        help="the per-channel means of the normalisation the model expects (e.g. ImageNet's 0.485 0.456 0.406, "
        "a timm model's pretrained_cfg): the model is scored on (x - mean) / std, so the data and sigma stay "
        "in pixel units; one value per channel, or one for all. Recorded in config.json",
        default_help="0",
        metavar="M",
        many=True,
        check=checks.statistics(False),
        record="mean",
        implied=None,
    )
    std: Sequence[float] | None = option(
        None,
        help="the per-channel standard deviations of that normalisation (e.g. ImageNet's 0.229 0.224 0.225); "
        "positive. Recorded in config.json",
        default_help="1",
        metavar="S",
        many=True,
        check=checks.statistics(True),
        record="std",
        implied=None,
    )
    untrained: bool = option(
        False,
        help="score a model built by --model package.module:function without --weights (refused otherwise: "
        "its weights are then random)",
        check=checks.boolean,
    )


@dataclass(frozen=True, kw_only=True)
class SourceOptions(ModelOptions):
    """What is scored: the data, the model, the points and the noise levels (``probust estimate``
    and ``probust certify`` alike)."""

    TITLE: ClassVar[str] = "what to score"

    data: str | Any = option(
        help="a built-in data set (mnist, fashion-mnist, cifar10, cifar100, digits), or your own: a tensor file "
        "(.npz, .pt, .npy: inputs [N, ...] and integer labels [N]), a table (.parquet, .csv: one row per point) "
        "or a folder of images in one subfolder per class; from Python also a Dataset with "
        "ds[i] -> (x float32 [C, H, W], label)",
        metavar="NAME|PATH",
        check=checks.data,
    )
    sigmas: Sequence[float] = option(
        help="noise standard deviations per input coordinate, in the units of x (pixel units, [0, 1] scale for images)",
        flag="--sigma",
        metavar="S",
        many=True,
        check=checks.sigmas,
    )
    split: str = option(
        "test",
        help="data set split (a built-in data set): train or test",
        choices=("train", "test"),
        check=checks.split,
    )
    limit: int | None = option(
        None,
        help="score only the first N selected points",
        default_help="",
        metavar="N",
        parse=int,
        check=checks.integer(1, True),
    )
    indices: Sequence[int] | None = option(
        None,
        help="points to score: N, A-B (inclusive), A-B:STEP, comma- or space-separated",
        default_help="all",
        metavar="SPEC",
        many=True,
        check=checks.indices,
    )
    data_root: str | os.PathLike | None = option(
        None,
        help="folder holding the data sets",
        default_help="$PROBUST_DATA_DIR or ~/.cache/probust/data",
        metavar="DIR",
        check=checks.path(True),
    )
    download: bool = option(False, help="download the data set if it is not on this machine", check=checks.boolean)
    data_options: Mapping[str, Any] | None = option(
        None,
        help="how to read data when it is a file or folder: the fields of probust.data.FileOptions (x_key, "
        "y_key, label_column, feature_columns, image_size, channels; each its own flag)",
        flag="--data",
        hidden=True,
        check=checks.mapping("a dict of file reading options"),
    )

    @property
    def selected(self) -> np.ndarray | None:
        """``indices`` as int64 [P] (sorted, unique), or None when none were given."""
        return None if self.indices is None else np.asarray(self.indices, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class DataOptions(SourceOptions):
    """What ``probust estimate`` scores: the points, noise levels, methods and sample counts."""

    methods: Sequence[str] = option(
        DEFAULT_METHODS,
        help=f"any of {' '.join(METHODS)}",
        default_help=f"the paper's six, {' '.join(PAPER_METHODS)}",
        metavar="M",
        many=True,
        check=checks.methods,
    )
    mc_samples: Sequence[int] = option(
        (DEFAULT_DRAWS,),
        help=f"Monte Carlo draws per point ({checks.sampled('mc')}); several values give one row each, for "
        "convergence studies",
        metavar="M",
        many=True,
        parse=int,
        check=checks.counts,
    )
    mmse_samples: Sequence[int] = option(
        (DEFAULT_COPIES,),
        help=f"MMSE noisy copies per point; several values give one row each ({checks.sampled('mmse')}); the MMSE "
        f"linearisation of {checks.with_option('mmse_samples')} uses the smallest (to extend a folder holding their rows, "
        "keep it the same)",
        metavar="N",
        many=True,
        parse=int,
        check=checks.counts,
    )


__all__ = ["DataOptions", "ModelOptions", "SourceOptions"]
