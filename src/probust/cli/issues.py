"""``probust issues``: suspect labels, atypical and memorised points of a data set
(:func:`probust.find_issues`) into a resumable folder, with an HTML page of the points each score
ranks first (:func:`probust.plots.issues.issue_grid` draws the same grids)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

_EPILOG = """\
examples:
  probust issues --data fashion-mnist --split train --model cnn.pt --out issues/
  probust issues --data points.npz --fold m0.pt held0.txt --fold m1.pt held1.txt --out issues/

--model scores every point no --fold holds out (in sample); each --fold MODEL INDICES scores the
points listed in INDICES (.npy, or a text file of integers) with MODEL, which did not train on
them (out of sample). Writes OUT/issues.csv (one row per point, probust.find_issues' columns),
OUT/issues.html (the most suspect labels, cleanlab's picks, the most atypical and the most likely
memorised points: each image with its index, given > predicted label and score) and the chunks it is computed from: run the same command again to resume.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``issues`` sub-command."""
    from probust.cli.flags import add_options
    from probust.run.data_options import ModelOptions

    p = subparsers.add_parser(
        "issues",
        help="rank suspect labels, atypical and memorised points by p_robust (probust.find_issues)",
        description="Find what is wrong with a labelled data set: per point, the probability that its given\n"
        "label survives Gaussian noise (low: a suspect label), the flags of the estimated label errors,\n"
        "an outlier and a memorisation score (docs/issues.md).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, help="a built-in data set name, or a file or folder of points")
    p.add_argument("--split", default="test", choices=("train", "test"), help="of a built-in data set (default test)")
    p.add_argument("--data-root", help="where to look for a built-in data set")
    p.add_argument(
        "--fold",
        nargs=2,
        action="append",
        metavar=("MODEL", "INDICES"),
        default=[],
        help="a model and the indices it did not train on (repeatable)",
    )
    p.add_argument(
        "--sigma", type=float, help="noise standard deviation per input coordinate (default: the inputs' RMS spread)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=24, help="images per section of the page (default 24)")
    p.add_argument("--out", required=True, help="the folder to write (resumable)")
    p.add_argument(
        "--quiet", "--no-progress", dest="show_progress", action="store_false", help="no progress bar or summary"
    )
    # The model as every command takes it (--model, --weights, --model-arg, --allow-pickle, --mean, --std).
    add_options(p, ModelOptions)
    p.set_defaults(func=run)


def _indices(path: str):
    import numpy as np

    from probust.cli import UsageError

    file = Path(path)
    try:
        values = (
            np.load(file, allow_pickle=False) if file.suffix == ".npy" else np.loadtxt(file, dtype=np.int64, ndmin=1)
        )
    except (OSError, ValueError) as exc:
        raise UsageError(f"--fold: {path}: not a .npy file or a text file of integer indices ({exc})") from None
    return values


def run(args: argparse.Namespace) -> int:
    """Run ``probust issues``; returns the exit status."""
    import torch

    from probust._options import MISSING, declared
    from probust.cli import UsageError
    from probust.cli.flags import flag_map, message, values
    from probust.errors import ProbustError
    from probust.issues import find_issues
    from probust.run.data_options import ModelOptions
    from probust.run.model_source import load_model
    from probust.run.sources import load_data

    given = values(args, ModelOptions)
    if "model" not in given and not args.fold:
        raise UsageError("give --model, or --fold MODEL INDICES for every fold")
    flags = {**flag_map(ModelOptions), "data": "--data", "folds": "--fold", "sigma": "--sigma", "out": "--out"}

    def loaded(model, weights=None, model_args=None):
        return load_model(
            model, torch.device("cpu"), ds, o["allow_pickle"], weights, model_args, o["mean"], o["std"], o["untrained"]
        )[0]

    try:
        # Checked as estimate and certify check them.
        o: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f, _ in declared(ModelOptions)}
        for f, c in declared(ModelOptions):
            if f.name in given and c.check is not None:
                o[f.name] = c.check(given[f.name], f.name)
        ds = load_data(args.data, args.split, args.data_root, False)
        model = None if o["model"] is None else loaded(o["model"], o["weights"], o["model_args"])
        folds = [(loaded(m), _indices(i)) for m, i in args.fold]
        frame = find_issues(
            model,
            ds,
            folds=folds or None,
            sigma=args.sigma,
            seed=args.seed,
            out=args.out,
            show_progress=args.show_progress,
        )
    except ProbustError as exc:  # named by its flag, in the shell's words
        text = message(exc, flags)
        raise UsageError(text if exc.field is not None or text.startswith("--") else f"--model: {text}") from None
    out = Path(args.out)
    frame.to_csv(out / "issues.csv", index=False)
    page = _write_page(frame, ds, out / "issues.html", args.top)
    flagged = int(frame["is_label_issue"].sum())
    print(
        f"{len(frame)} points, sigma {frame['sigma'].iloc[0]:.4g}: {flagged} flagged as label issues", file=sys.stderr
    )
    print(frame.sort_values("label_score").head(10).to_string(index=False))
    print(f"wrote {out / 'issues.csv'} and {page}", file=sys.stderr)
    return 0


def _write_page(frame, ds, path: Path, top: int) -> Path:
    """One HTML page: per ranking (:data:`probust.plots.issues.SECTIONS`: suspect labels, cleanlab's
    picks, atypical and memorised points) a grid of small images that wraps to the page's width,
    each captioned with its data-set index, "given > predicted" and its score (distinct digits
    where the values differ); then the table of the flagged points."""
    import html

    from probust.plots.issues import SECTIONS, issue_cells

    count = max(1, min(len(frame), top))
    flagged = frame[frame["is_label_issue"]].sort_values("label_score")
    sigma = float(frame["sigma"].iloc[0])
    parts = [
        f"<h1>Label issues</h1><p>{len(frame)} points scored at sigma {sigma:.4g}; {len(flagged)} flagged as label "
        "issues (per given class, the estimated number of label errors, lowest label_score first; their captions "
        "are red). label_score is the probability that the model's prediction under the noise is the given label; "
        "cleanlab's picks rank by self_confidence, the clean softmax of the given label; outlier_score is "
        "1 - p_robust; memorisation_score is high where the model holds the given label at the point but not "
        "under the noise. Each image: #data-set index, given &gt; predicted label, score.</p>"
    ]
    for column, highest, heading in SECTIONS:
        if column not in frame:
            continue
        figures = []
        for cell in issue_cells(frame, ds, column, count, highest):
            caption = (
                f"<b>#{cell.index}</b><br>{html.escape(cell.given)} &gt; {html.escape(cell.predicted)}"
                f"<br>{html.escape(cell.score)}"
            )
            figures.append(
                f'<figure{" class=flag" if cell.flagged else ""}><img alt="#{cell.index}" '
                f'src="data:image/png;base64,{_png(cell.image)}"><figcaption>{caption}</figcaption></figure>'
            )
        parts.append(f'<h2 id="{column}">{html.escape(heading)}</h2><div class="grid">{"".join(figures)}</div>')
    table = flagged.to_html(index=False, float_format=lambda v: f"{v:.4g}")
    parts.append(f"<h2>Flagged points</h2><div class=table>{table}</div>")
    style = (
        "body{font-family:sans-serif;margin:1em;max-width:100%}"
        ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(112px,1fr));gap:10px}"
        "figure{margin:0;text-align:center;font-size:12px;overflow-wrap:anywhere}"
        "figure img{width:96px;height:96px;image-rendering:pixelated;border:1px solid #ccc}"
        "figure.flag figcaption{color:#b03030}"
        ".table{overflow-x:auto}table{border-collapse:collapse;font-size:12px}td,th{padding:2px 6px}"
    )
    page = (
        f"<!doctype html><meta charset='utf-8'><meta name=viewport content='width=device-width'>"
        f"<title>{html.escape('probust issues')}</title><style>{style}</style><body>{''.join(parts)}</body>"
    )
    path.write_text(page, encoding="utf-8")
    return path


def _png(image) -> str:
    """An image [H, W] or [H, W, 3] in [0, 1] as a base64 PNG of its own pixels."""
    import base64
    import io

    from matplotlib import image as mpimg

    buffer = io.BytesIO()
    mpimg.imsave(buffer, image, cmap="gray", vmin=0, vmax=1, format="png")
    return base64.b64encode(buffer.getvalue()).decode()
