"""``probust estimate``: score a data set into a resumable results table (see probust.run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import cast

from probust.cli.messages import cli_message

_EPILOG = """\
examples:
  probust estimate --data fashion-mnist --model cnn.pt --sigma 0.05 0.1 0.2 \\
      --methods mc taylor mmse taylor_mvs mmse_mvs softmax --out results/
  probust estimate --data digits --model m.pt --sigma 0.1 --methods mc --mc-samples 100 1000 10000 \\
      --indices 0-99 --out convergence/
  probust estimate --data digits --model m.pt --sigma 0.02 --methods taylor mc_is --p-fail --out tails/
  probust estimate --data photos/ --image-size 32 --model net.ts --sigma 0.05 --methods mc taylor --out r/
  probust estimate --data wine.parquet --label-column target --model mlp.pt --sigma 0.1 \
      --noise-scale std --out wine_results/
  probust estimate --data x.npz --model mypkg.nets:make_net --weights w.pt --sigma 0.1 --noise laplace \
      --methods mc taylor --out r/
  torchrun --standalone --nproc-per-node 4 -m probust estimate ... --device cuda --out results/

Run the same command again to resume an interrupted run: only missing rows are computed
(with the same probust version: see --allow-version-change). With --target prediction a point
whose clean prediction is tied between two classes stops the run before any estimate, naming it.
Read the table with probust.run.read_results(OUT) (also while the run is going).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` sub-command."""
    from probust.estimators import METHODS, PAPER_METHODS, REGISTRY, methods_with

    def named(methods: Iterable[str]) -> str:
        return ", ".join(methods)

    mc_methods = [name for name, spec in REGISTRY.items() if spec.samples == "mc"]
    mmse_methods = [name for name, spec in REGISTRY.items() if spec.samples == "mmse"]
    linearised = [name for name, spec in REGISTRY.items() if spec.linearised]

    p = subparsers.add_parser(
        "estimate",
        help="score a data set's points with estimators of p_robust into a results table",
        description="Estimate p_robust, the probability that a prediction survives Gaussian noise of\n"
        "standard deviation sigma per input coordinate (or the noise of --noise), for every selected point,\n"
        "noise level, method and sample count, into a Parquet results folder that survives interruption.\n"
        "The data may be a built-in data set, a tensor file, a table or a folder of images (docs/estimate.md).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Numbers are read as strings and checked by the runner, so that a bad value gets the same
    # one-line message (exit status 2) from the CLI and from Python.
    what = p.add_argument_group("what to score")
    what.add_argument(
        "--data",
        required=True,
        metavar="NAME|PATH",
        help="a built-in data set (mnist, fashion-mnist, cifar10, cifar100, digits), or your own: a tensor file "
        "(.npz, .pt, .npy: inputs [N, ...] and integer labels [N]), a table (.parquet, .csv: one row per point) "
        "or a folder of images in one subfolder per class",
    )
    what.add_argument("--split", default="test", choices=("train", "test"), help="data set split (default: test)")
    what.add_argument(
        "--model",
        required=True,
        metavar="FILE",
        help="probust checkpoint, TorchScript file or torch.export (.pt2) file; package.module:function "
        "returning an nn.Module (called with no arguments; the current folder is searched first); or hf:FOLDER, "
        "a Hugging Face image classifier saved with save_pretrained (probust[hf])",
    )
    what.add_argument(
        "--weights", metavar="FILE", help="state_dict file loaded into the model of --model package.module:function"
    )
    what.add_argument(
        "--sigma",
        required=True,
        nargs="+",
        metavar="S",
        help="noise standard deviations per input coordinate, in pixel units ([0, 1] scale)",
    )
    what.add_argument(
        "--methods",
        nargs="+",
        default=list(PAPER_METHODS),
        metavar="M",
        help=f"any of {' '.join(METHODS)} (default: the paper's six, {' '.join(PAPER_METHODS)})",
    )
    what.add_argument(
        "--mc-samples",
        nargs="+",
        default=["10000"],
        metavar="M",
        help=f"Monte Carlo draws per point ({named(mc_methods)}); several values for convergence studies "
        "(default: 10000)",
    )
    what.add_argument(
        "--mmse-samples",
        nargs="+",
        default=["5"],
        metavar="N",
        help=f"MMSE noisy copies per point; several values give one row each ({named(mmse_methods)}); the MMSE "
        f"linearisation of {named(linearised)} uses the smallest (default: 5)",
    )
    what.add_argument("--limit", metavar="N", help="score only the first N selected points")
    what.add_argument(
        "--indices",
        nargs="+",
        metavar="SPEC",
        help="points to score: N, A-B (inclusive), A-B:STEP, comma- or space-separated",
    )
    what.add_argument(
        "--target",
        default="prediction",
        choices=("prediction", "label"),
        help="class whose survival is measured (default: the clean prediction)",
    )

    own = p.add_argument_group("your own data (a file or folder as --data)")
    own.add_argument("--x-key", metavar="KEY", help="tensor files: name of the inputs in .npz/.pt (default: x)")
    own.add_argument(
        "--y-key",
        metavar="KEY",
        help="tensor files: name of the labels in .npz/.pt (default: y); for .npy, the labels' .npy file, "
        "relative to the inputs' folder (default: y.npy)",
    )
    own.add_argument(
        "--label-column", metavar="COL", help="tables: the label column (default: label); names or integers"
    )
    own.add_argument(
        "--feature-columns", nargs="+", metavar="COL", help="tables: the feature columns (default: all others)"
    )
    own.add_argument(
        "--image-size",
        nargs="+",
        metavar="N",
        help="image folders: resize to N x N (or H W) (default: the images' size, which must then agree)",
    )
    own.add_argument(
        "--channels", choices=("1", "3"), help="image folders: 1 (grey) or 3 (RGB) (default: 3 if any is in colour)"
    )

    noise = p.add_argument_group("noise (default: Gaussian, standard deviation sigma per coordinate)")
    noise.add_argument(
        "--noise",
        default="gaussian",
        choices=("gaussian", "uniform", "laplace"),
        help="the noise at each sigma, with standard deviation sigma per coordinate (default: gaussian; mc_cv and "
        "mc_is need gaussian)",
    )
    noise.add_argument(
        "--noise-std",
        metavar="FILE.npy",
        help="per-coordinate multipliers m (broadcast to one input's shape): coordinate j gets standard deviation "
        "sigma * m[j] (Gaussian)",
    )
    noise.add_argument(
        "--noise-cov",
        metavar="FILE.npy",
        help="covariance C [d, d] over the flattened input: the noise is N(0, sigma^2 C)",
    )
    noise.add_argument(
        "--noise-scale",
        default="absolute",
        choices=("absolute", "std"),
        help="std: sigma times each coordinate's standard deviation over the data set (for tables: sigma in "
        "units of each feature's spread; Gaussian, diagonal); default absolute",
    )

    how = p.add_argument_group("how")
    how.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:N or auto (default); under torchrun each rank uses cuda:LOCAL_RANK",
    )
    how.add_argument("--seed", default="0", metavar="S", help="seed of the per-point random streams (default: 0)")
    how.add_argument(
        "--batch-size", default="256", metavar="B", help="points per work unit and part file (default: 256)"
    )
    how.add_argument(
        "--eval-batch-size",
        metavar="R",
        help="most inputs per pass through the model inside the estimators (default: measured per model)",
    )
    how.add_argument(
        "--mc-half-width",
        metavar="W",
        help=f"adaptive Monte Carlo ({named(methods_with('target_half_width'))}): stop a point once its "
        "interval's half-width is at most W "
        "(column n_drawn: the draws used); default: always --mc-samples draws",
    )
    how.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="most memory an estimator holds at once, e.g. 4GB (default: half the free memory)",
    )
    how.add_argument(
        "--channels-last",
        default="auto",
        choices=("auto", "on", "off"),
        help="channels_last memory format for convolutional models: measured (auto, default), on or off",
    )
    how.add_argument(
        "--jacobian",
        default="auto",
        choices=("auto", "loop", "vmap", "forward"),
        help="how taylor/mmse get input gradients: measured per model (auto, default), one backward pass "
        "per class (loop), torch.func vmap, or forward mode (for inputs with fewer coordinates than classes)",
    )
    how.add_argument(
        "--prune",
        default="auto",
        choices=("auto", "on", "off"),
        help="taylor/mmse: skip the decision boundaries that cannot matter (their exact distance through the "
        "model's linear head where it has fewer features than classes, else a forward-mode sketch bounds it; what "
        "they could cost is added to cdf_error; column boundaries_kept): where it pays (auto, default: by the head, "
        "or by the sketch from 1,000 classes on), always (on) or never (off: every margin's own backward pass)",
    )
    how.add_argument(
        "--temperature", default="1.0", metavar="T", help="softmax temperature of method softmax (default: 1)"
    )
    how.add_argument(
        "--tol", default="1e-4", metavar="TOL", help="absolute error tolerance of the mvn-cdf (default: 1e-4)"
    )
    how.add_argument(
        "--confidence", default="0.95", metavar="LEVEL", help="level of the Monte Carlo interval (default: 0.95)"
    )
    how.add_argument(
        "--interval",
        default="wilson",
        choices=("wilson", "clopper-pearson"),
        help="Monte Carlo interval (default: wilson)",
    )
    how.add_argument(
        "--mmse-sampling", default="centred", choices=("centred", "iid"), help="MMSE noise draws (default: centred)"
    )
    how.add_argument(
        "--p-fail",
        action="store_true",
        help=f"also compute p_fail = 1 - p directly, with relative accuracy, for {named(methods_with('p_fail'))} "
        "(columns p_fail, p_fail_error; up to C-1 extra mvn integrals per point for the mvn-cdf methods)",
    )

    io = p.add_argument_group("input and output")
    io.add_argument(
        "--out", required=True, metavar="DIR", help="results folder (created); holds config.json and Parquet files"
    )
    io.add_argument("--overwrite", action="store_true", help="replace results of a different run in --out")
    io.add_argument(
        "--extend",
        action="store_true",
        help="add points, sigmas, methods or sample counts to a run in --out with the same data, model and settings",
    )
    io.add_argument(
        "--no-merge",
        dest="merge",
        action="store_false",
        help="keep one Parquet file per work unit instead of merging them into results.parquet at the end",
    )
    io.add_argument(
        "--data-root",
        metavar="DIR",
        help="folder holding the data sets (default: $PROBUST_DATA_DIR or ~/.cache/probust/data)",
    )
    io.add_argument("--download", action="store_true", help="download the data set if it is not on this machine")
    io.add_argument(
        "--allow-pickle", action="store_true", help="accept model files that run code when loaded (torch.save(model))"
    )
    io.add_argument(
        "--allow-version-change",
        action="store_true",
        help="resume or extend --out although another probust version wrote its rows (refused by default: "
        "the rows of two versions could differ; recorded in config.json's history)",
    )
    io.add_argument("--quiet", action="store_true", help="no progress bars or summary (errors only)")
    p.set_defaults(func=run)


def _int(value: str | None, name: str) -> int | None:
    from probust.cli import UsageError

    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{name}: expected an integer, got {value!r}") from None


def _ints(values: list[str], name: str) -> list[int]:
    return [_int(v, name) for v in values]  # type: ignore[misc]


def run(args: argparse.Namespace) -> int:
    """Run ``probust estimate``; returns the exit status."""
    from probust.cli import UsageError
    from probust.run import ConfigError, RunSettings, execute, prepare

    try:
        settings = RunSettings(
            data=args.data,
            model=args.model,
            sigmas=args.sigma,
            methods=args.methods,
            out=args.out,
            split=args.split,
            mc_samples=_ints(args.mc_samples, "--mc-samples"),
            mmse_samples=_ints(args.mmse_samples, "--mmse-samples"),
            limit=_int(args.limit, "--limit"),
            indices=args.indices,
            device=args.device,
            seed=cast(int, _int(args.seed, "--seed")),  # the flag has a default
            batch_size=cast(int, _int(args.batch_size, "--batch-size")),  # the flag has a default
            eval_batch_size=_int(args.eval_batch_size, "--eval-batch-size"),
            memory_budget=args.memory_budget,
            mc_half_width=None if args.mc_half_width is None else _float(args.mc_half_width, "--mc-half-width"),
            jacobian=args.jacobian,
            channels_last={"auto": None, "on": True, "off": False}[args.channels_last],
            temperature=args.temperature,
            target=args.target,
            tol=args.tol,
            ci_level=_float(args.confidence, "--confidence"),
            interval=args.interval,
            mmse_sampling=args.mmse_sampling,
            p_fail=args.p_fail,
            prune=args.prune,
            show_progress=not args.quiet,
            overwrite=args.overwrite,
            extend=args.extend,
            merge=args.merge,
            download=args.download,
            data_root=args.data_root,
            allow_pickle=args.allow_pickle,
            allow_version_change=args.allow_version_change,
            data_options={
                "x_key": args.x_key,
                "y_key": args.y_key,
                "label_column": args.label_column,
                "feature_columns": args.feature_columns,
                "image_size": None if args.image_size is None else _ints(args.image_size, "--image-size"),
                "channels": _int(args.channels, "--channels"),
            },
            weights=args.weights,
            noise=args.noise,
            noise_std=args.noise_std,
            noise_cov=args.noise_cov,
            noise_scale=args.noise_scale,
        )
        plan = prepare(settings, argv=sys.argv[1:] if sys.argv else None)
    except ConfigError as exc:
        raise UsageError(cli_message(str(exc).replace("\n", "; "))) from None
    main = plan.world.is_main
    if not args.quiet and main:
        for note in plan.warnings:
            print(f"probust estimate: warning: {note}", file=sys.stderr)
    try:
        summary = execute(plan)
    except ConfigError as exc:
        # Found by the clean pass before any estimator ran (a tied prediction): a usage error.
        raise UsageError(cli_message(str(exc).replace("\n", "; "))) from None
    except (RuntimeError, ValueError, OSError) as exc:
        # Failures after the checks (a damaged part file, a model returning NaN, a full disk):
        # one line, and the finished work units stay for the next run.
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"probust estimate: error: {type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if main:
            print(
                f"probust estimate: interrupted; finished work units are kept in {args.out}: "
                "run the same command again to compute the rest",
                file=sys.stderr,
            )
        return 130
    if not args.quiet and main:
        where = summary.merged if summary.merged is not None else summary.path / "parts"
        print(
            f"probust estimate: {summary.rows_total} rows in {where} "
            f"({summary.rows_present} already there, {summary.rows_total - summary.rows_present} computed) "
            f"in {summary.seconds:.1f} s",
            file=sys.stderr,
        )
    return 0


def _float(value: str, name: str) -> float:
    from probust.cli import UsageError

    try:
        return float(value)
    except ValueError:
        raise UsageError(f"{name}: expected a number, got {value!r}") from None
