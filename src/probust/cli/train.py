"""``probust train``: train one of the paper's models on a data set and save a checkpoint.

Example::

    probust train --data fashion-mnist --arch cnn --epochs 10 --grad-reg 0 --out models/fmnist_cnn.pt
    probust train --data train.parquet --test-data test.parquet --label-column target --arch mlp --out mlp.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from probust.cli import UsageError


def register(subparsers: Any) -> None:
    """Adds the ``train`` sub-command."""
    from probust.cli.flags import add_options
    from probust.data import DATASETS, FileOptions
    from probust.models import ARCHS
    from probust.training import DEFAULTS, RobustLossOptions, TrainConfig, TrainOptions

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
    p.add_argument(
        "--data",
        required=True,
        metavar="NAME|PATH",
        help=f"data set: {', '.join(DATASETS)}; or your own training data, a tensor file, a table or a folder of "
        "images (as for probust estimate; e.g. --arch mlp for a table)",
    )
    own = add_options(p, FileOptions)
    own.add_argument("--test-data", metavar="PATH", help="the test split, read like --data (default: none)")
    p.add_argument("--arch", required=True, metavar="ARCH", help=f"architecture: {', '.join(ARCHS)}")
    p.add_argument("--out", required=True, metavar="PATH", help="checkpoint to write, e.g. models/fmnist_cnn.pt")
    # One flag per field of TrainConfig (declared there with its help); --device defaults to auto here.
    add_options(p, TrainConfig, defaults={"device": "auto"})
    add_options(p, RobustLossOptions)
    add_options(p, TrainOptions)
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> Any:
    """The data set name checked and the :class:`~probust.training.TrainConfig` of the flags."""
    return _settings(args)[0]


def _settings(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The data set name checked, and the :class:`~probust.training.TrainConfig`,
    :class:`~probust.training.RobustLossOptions` and :class:`~probust.training.TrainOptions` of the flags."""
    from probust.cli.flags import message, values
    from probust.data import canonical_name, is_builtin
    from probust.errors import ProbustError
    from probust.models import check_arch
    from probust.training import RobustLossOptions, TrainConfig, TrainOptions

    try:
        if is_builtin(args.data):
            args.data = canonical_name(args.data)
            if args.test_data is not None:
                raise ValueError("--test-data applies to your own data; a built-in data set brings its test split")
        check_arch(args.arch)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        config = TrainConfig(**values(args, TrainConfig))
        robust = RobustLossOptions(**values(args, RobustLossOptions))
        options = TrainOptions(**values(args, TrainOptions))
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    if options.pretrained is not None and args.arch != "vit":
        raise UsageError(f"{flags()['pretrained']}: applies to --arch vit only")
    if config.device != "auto":
        import torch

        if torch.device(config.device).type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {config.device}: CUDA is not available here; use cpu or auto")
    return config, robust, options


def run(args: argparse.Namespace) -> int:
    """Runs ``probust train``; returns the exit status."""
    config, robust, options = _settings(args)
    import dataclasses

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
    dataset, test_dataset = args.data, None
    if not is_builtin(args.data):
        dataset, test_dataset = _own_data(args)
    try:
        result = train(
            dataset=dataset,
            test_dataset=test_dataset,
            arch=args.arch,
            config=config,
            out=args.out,
            resume=options.resume,
            show_progress=not args.quiet,
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
    if not args.quiet:
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
    from probust.training import RobustLossOptions, TrainConfig, TrainOptions

    return flag_map(TrainConfig, RobustLossOptions, TrainOptions, FileOptions)


def _own_data(args: argparse.Namespace) -> tuple[Any, Any]:
    """The training and test data read from the user's files (``--data``, ``--test-data``)."""
    from probust.cli.flags import message, values
    from probust.data import DATASETS, FileOptions, ProbustDataError, load_file
    from probust.errors import ProbustError

    try:
        options = values(args, FileOptions)
    except ProbustError as exc:
        raise UsageError(message(exc, flags())) from None
    read: list[Any] = []
    for flag, path in (("--data", args.data), ("--test-data", args.test_data)):
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
            f"--test-data: {args.test_data} has input shape {list(test_ds.input_shape)} and classes "
            f"{test_ds.classes}, --data {list(train_ds.input_shape)} and {train_ds.classes}"
        )
    return train_ds, test_ds
