"""``probust train``: train one of the paper's models on a data set and save a checkpoint.

Example::

    probust train --data fashion-mnist --arch cnn --epochs 10 --grad-reg 0 --out models/fmnist_cnn.pt
    probust train --data train.parquet --test-data test.parquet --label-column target --arch mlp --out mlp.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from probust.cli import UsageError


def register(subparsers: Any) -> None:
    """Adds the ``train`` sub-command."""
    from probust.cli.flags import add_options
    from probust.data import FileOptions
    from probust.training import DEFAULTS, RobustLossOptions, TrainConfig, TrainOptions, TrainRun

    defaults = ", ".join(
        f"{a}: {d['epochs']} epochs, lr {d['lr']}, batch {d['batch_size']}, wd {d['weight_decay']}"
        for a, d in DEFAULTS.items()
    )
    p = subparsers.add_parser(
        "train",
        help="train a model (optionally gradient-norm regularised) and save a checkpoint",
        description="Train a model with SGD and save a checkpoint (plus <out>.json metadata) after every "
        "epoch. Running the same command again resumes an interrupted run.",
        epilog=f"Defaults per architecture: {defaults}.",
    )
    add_options(p, TrainRun, required=("data", "arch", "out"))
    add_options(p, FileOptions)
    # One flag per field of TrainConfig (declared there with its help); --device defaults to auto here.
    add_options(p, TrainConfig, defaults={"device": "auto"})
    add_options(p, RobustLossOptions)
    add_options(p, TrainOptions)
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """The :class:`~probust.training.TrainConfig`, :class:`~probust.training.RobustLossOptions`,
    :class:`~probust.training.TrainOptions` and :class:`~probust.training.TrainRun` of the flags
    (a built-in data set's name in its canonical spelling)."""
    from probust.cli.flags import message, values
    from probust.data import canonical_name, is_builtin
    from probust.errors import ProbustError
    from probust.training import RobustLossOptions, TrainConfig, TrainOptions, TrainRun

    try:
        job = TrainRun(**values(args, TrainRun))
        config = TrainConfig(**values(args, TrainConfig))
        robust = RobustLossOptions(**values(args, RobustLossOptions))
        options = TrainOptions(**values(args, TrainOptions))
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    if is_builtin(job.data):
        job = dataclasses.replace(job, data=canonical_name(job.data))
        if job.test_data is not None:
            raise UsageError(
                f"{flags()['test_data']}: applies to your own data; a built-in data set brings its test split"
            )
    if options.pretrained is not None and job.arch != "vit":
        raise UsageError(f"{flags()['pretrained']}: applies to {flags()['arch']} vit only")
    if config.device != "auto":
        import torch

        if torch.device(config.device).type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"{flags()['device']} {config.device}: CUDA is not available here; use cpu or auto")
    return config, robust, options, job


def run(args: argparse.Namespace) -> int:
    """Runs ``probust train``; returns the exit status."""
    config, robust, options, job = _settings(args)

    from probust.cli.flags import message
    from probust.data import ProbustDataError, is_builtin
    from probust.errors import ProbustError
    from probust.models import CheckpointError
    from probust.training import train

    if options.pretrained:
        config = dataclasses.replace(
            config, arch_kwargs={**(config.arch_kwargs or {}), "pretrained": options.pretrained}
        )
    try:
        extra_loss = robust.loss()
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    dataset, test_dataset = job.data, None
    if not is_builtin(job.data):
        dataset, test_dataset = _own_data(args, job)
    try:
        result = train(
            dataset=dataset,
            test_dataset=test_dataset,
            arch=job.arch,
            config=config,
            out=job.out,
            resume=options.resume,
            show_progress=job.show_progress,
            root=options.root,
            download=options.download,
            extra_loss=extra_loss,
        )
    except (ProbustDataError, CheckpointError, ImportError, FloatingPointError) as exc:
        # Not usage errors: the command was fine, the data, files or installation are not.
        print(f"probust train: error: {message(exc, flags())}", file=sys.stderr)
        return 1
    except ValueError as exc:  # settings only training can check, e.g. an unknown --arch-kwargs key
        raise UsageError(message(exc, flags())) from None
    if job.show_progress:
        meta = result.meta
        acc = meta.get("test_accuracy")
        acc_text = f"test accuracy {acc:.4f}" if acc is not None else "no test split"
        print(
            f"{result.path}: {meta['arch']} on {meta['dataset']}, lambda={meta['grad_reg']:g}, "
            f"{meta['epochs_completed']} epochs, {acc_text}, {meta.get('train_seconds', 0):.0f} s"
            + (f", extra loss {meta['extra_loss']}" if meta.get("extra_loss") else "")
        )
    return 0


def flags() -> dict[str, str]:
    """Every option of ``probust train`` and its flag (errors name options; see
    :func:`probust.cli.flags.message`)."""
    from probust.cli.flags import flag_map
    from probust.data import FileOptions
    from probust.training import RobustLossOptions, TrainConfig, TrainOptions, TrainRun

    return flag_map(TrainRun, TrainConfig, RobustLossOptions, TrainOptions, FileOptions)


def _own_data(args: argparse.Namespace, job: Any) -> tuple[Any, Any]:
    """The training and test data read from the user's files (``--data``, ``--test-data``)."""
    from probust.cli.flags import message, values
    from probust.data import DATASETS, FileOptions, ProbustDataError, load_file
    from probust.errors import ProbustError

    try:
        options = values(args, FileOptions)
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    read: list[Any] = []
    for flag, path in (("--data", job.data), ("--test-data", job.test_data)):
        if path is None:
            read.append(None)
            continue
        if not Path(path).exists():
            raise UsageError(
                f"{flag}: {path}: no such file or folder, and not a built-in data set (known data sets: "
                f"{', '.join(DATASETS)})"
            )
        try:
            read.append(load_file(path, options))
        except ProbustDataError as exc:
            raise UsageError(f"{flag}: {message(exc, flags())}") from None
        except ValueError as exc:  # an option that does not apply to this kind of file
            raise UsageError(message(exc, flags())) from None
    train_ds, test_ds = read
    if test_ds is not None and (test_ds.input_shape != train_ds.input_shape or test_ds.classes != train_ds.classes):
        raise UsageError(
            f"--test-data: {job.test_data} has input shape {list(test_ds.input_shape)} and classes "
            f"{test_ds.classes}, --data {list(train_ds.input_shape)} and {train_ds.classes}"
        )
    return train_ds, test_ds
