"""``probust train``: train one of the paper's models on a data set and save a checkpoint.

Example::

    probust train --data fashion-mnist --arch cnn --epochs 10 --grad-reg 0 --out models/fmnist_cnn.pt
    probust train --data train.parquet --test-data test.parquet --label-column target --arch mlp --out mlp.pt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from probust.cli import UsageError


def register(subparsers: Any) -> None:
    """Adds the ``train`` sub-command."""
    from probust.data import DATASETS
    from probust.models import ARCHS
    from probust.training import DEFAULTS, SCHEDULES

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
    own = p.add_argument_group("your own data (a file or folder as --data)")
    own.add_argument("--test-data", metavar="PATH", help="the test split, read like --data (default: none)")
    own.add_argument("--x-key", metavar="KEY", help="tensor files: name of the inputs (default: x)")
    own.add_argument("--y-key", metavar="KEY", help="tensor files: name of the labels (default: y; .npy: y.npy)")
    own.add_argument("--label-column", metavar="COL", help="tables: the label column (default: label)")
    own.add_argument("--feature-columns", nargs="+", metavar="COL", help="tables: the features (default: all others)")
    own.add_argument("--image-size", nargs="+", type=int, metavar="N", help="image folders: resize to N x N (or H W)")
    own.add_argument("--channels", type=int, choices=(1, 3), help="image folders: 1 (grey) or 3 (RGB)")
    p.add_argument("--arch", required=True, metavar="ARCH", help=f"architecture: {', '.join(ARCHS)}")
    p.add_argument("--out", required=True, metavar="PATH", help="checkpoint to write, e.g. models/fmnist_cnn.pt")
    p.add_argument("--epochs", type=int, help="number of epochs (default per architecture)")
    p.add_argument("--lr", type=float, help="initial learning rate (default per architecture)")
    p.add_argument("--batch-size", type=int, help="batch size (default per architecture)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, help="weight decay (default per architecture)")
    p.add_argument(
        "--schedule", default="cosine", metavar="NAME", help=f"lr schedule: {', '.join(SCHEDULES)} (default cosine)"
    )
    p.add_argument(
        "--grad-reg",
        type=float,
        default=0.0,
        metavar="LAMBDA",
        help="gradient-norm regularisation weight lambda; the paper uses 0, 1e-4, 1e-3, 1e-2 (default 0)",
    )
    p.add_argument(
        "--robust-loss",
        type=float,
        default=0.0,
        metavar="MU",
        help="weight mu of the average-case robustness term mu * mean(-log p_robust(x)) added to the "
        "cross-entropy (probust.RobustLoss; needs --robust-sigma; default 0: off)",
    )
    p.add_argument("--robust-sigma", type=float, metavar="S", help="noise sigma of --robust-loss, in pixel units")
    p.add_argument(
        "--robust-cdf",
        default="mv-sigmoid",
        choices=("mv-sigmoid", "mvn"),
        help="probability map of --robust-loss: mv-sigmoid (default) or mvn (slower)",
    )
    p.add_argument(
        "--robust-warmup",
        type=int,
        default=500,
        metavar="STEPS",
        help="steps over which the --robust-loss weight ramps up from 0 (default 500; from scratch "
        "the full term at once can collapse the model to a constant classifier)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for initialisation and shuffling (default 0)")
    aug = p.add_mutually_exclusive_group()
    aug.add_argument(
        "--augment", dest="augment", action="store_true", default=None, help="random crop + flip (default: CIFAR only)"
    )
    aug.add_argument("--no-augment", dest="augment", action="store_false", help="no data augmentation")
    p.add_argument("--root", metavar="DIR", help="data folder (default $PROBUST_DATA_DIR or ~/.cache/probust/data)")
    p.add_argument("--download", action="store_true", help="download the data set if it is not found locally")
    p.add_argument(
        "--pretrained", metavar="NAME_OR_DIR", help="vit only: pretrained Hugging Face checkpoint to fine-tune"
    )
    p.add_argument(
        "--arch-kwargs",
        metavar="JSON",
        default="{}",
        help="architecture options as a JSON object, e.g. '{\"pool\": false}' or '{\"dropout\": 0.25}' for cnn, "
        '\'{"config": {"hidden_size": 192}}\' for vit',
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default auto)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default torch's choice)")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="start over even if --out holds a run")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from probust.data import canonical_name, is_builtin
    from probust.models import check_arch
    from probust.training import SCHEDULES

    try:
        if is_builtin(args.data):
            args.data = canonical_name(args.data)
            if args.test_data is not None:
                raise ValueError("--test-data applies to your own data; a built-in data set brings its test split")
        check_arch(args.arch)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.schedule not in SCHEDULES:
        raise UsageError(f"--schedule: unknown schedule {args.schedule!r}; known schedules: {', '.join(SCHEDULES)}")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--lr", args.lr),):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be a positive number, got {value}")
    for flag, value in (("--grad-reg", args.grad_reg), ("--weight-decay", args.weight_decay)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be >= 0, got {value}")
    if not (args.robust_loss >= 0 and math.isfinite(args.robust_loss)):
        raise UsageError(f"--robust-loss must be >= 0, got {args.robust_loss}")
    if args.robust_loss > 0 and args.robust_sigma is None:
        raise UsageError("--robust-loss needs --robust-sigma S, the noise level whose p_robust is trained")
    if args.robust_sigma is not None and not (args.robust_sigma > 0 and math.isfinite(args.robust_sigma)):
        raise UsageError(f"--robust-sigma must be a positive number, got {args.robust_sigma}")
    if args.robust_warmup < 0:
        raise UsageError(f"--robust-warmup must be >= 0, got {args.robust_warmup}")
    if not 0 <= args.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), got {args.momentum}")
    if args.pretrained is not None and args.arch != "vit":
        raise UsageError("--pretrained applies to --arch vit only")
    try:
        args.arch_kwargs = json.loads(args.arch_kwargs)
    except ValueError as exc:
        raise UsageError(f"--arch-kwargs is not valid JSON: {exc}") from None
    if not isinstance(args.arch_kwargs, dict):
        raise UsageError(f"--arch-kwargs must be a JSON object, got {args.arch_kwargs!r}")
    if args.device != "auto":
        import torch

        try:
            dev = torch.device(args.device)
        except (RuntimeError, ValueError):
            raise UsageError(f"--device: not a device: {args.device!r}; use cpu, cuda, cuda:N or auto") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: CUDA is not available here; use cpu or auto")


def run(args: argparse.Namespace) -> int:
    """Runs ``probust train``; returns the exit status."""
    _check(args)
    from probust.data import ProbustDataError, is_builtin
    from probust.models import CheckpointError
    from probust.training import train

    arch_kwargs = dict(args.arch_kwargs)
    if args.pretrained:
        arch_kwargs["pretrained"] = args.pretrained
    extra_loss = None
    if args.robust_loss > 0:
        from probust.training import RobustLoss

        extra_loss = RobustLoss(
            args.robust_sigma, args.robust_loss, cdf=args.robust_cdf, warmup_steps=args.robust_warmup
        )
    dataset, test_dataset = args.data, None
    if not is_builtin(args.data):
        dataset, test_dataset = _own_data(args)
    try:
        result = train(
            dataset=dataset,
            test_dataset=test_dataset,
            arch=args.arch,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            grad_reg=args.grad_reg,
            seed=args.seed,
            out=args.out,
            resume=args.resume,
            device=args.device,
            show_progress=not args.quiet,
            momentum=args.momentum,
            weight_decay=args.weight_decay,
            schedule=args.schedule,
            augment=args.augment,
            root=args.root,
            download=args.download,
            arch_kwargs=arch_kwargs,
            num_threads=args.threads,
            extra_loss=extra_loss,
        )
    except (ProbustDataError, CheckpointError, ImportError, FloatingPointError) as exc:
        # Not usage errors: the command was fine, the data, files or installation are not.
        print(f"probust train: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # settings only training can check, e.g. an unknown --arch-kwargs key
        raise UsageError(str(exc)) from None
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


def _own_data(args: argparse.Namespace) -> tuple[Any, Any]:
    """The training and test data read from the user's files (``--data``, ``--test-data``)."""
    from probust.cli.messages import cli_message
    from probust.data import DATASETS, ProbustDataError, load_file

    options = {
        "x_key": args.x_key,
        "y_key": args.y_key,
        "label_column": args.label_column,
        "feature_columns": args.feature_columns,
        "image_size": args.image_size,
        "channels": args.channels,
    }
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
            raise UsageError(cli_message(f"{flag}: {exc}")) from None
        except ValueError as exc:  # an option that does not apply to this kind of file
            raise UsageError(cli_message(str(exc))) from None
    train_ds, test_ds = read
    if test_ds is not None and (test_ds.input_shape != train_ds.input_shape or test_ds.classes != train_ds.classes):
        raise UsageError(
            f"--test-data: {args.test_data} has input shape {list(test_ds.input_shape)} and classes "
            f"{test_ds.classes}, --data {list(train_ds.input_shape)} and {train_ds.classes}"
        )
    return train_ds, test_ds
