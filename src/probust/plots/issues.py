"""The most suspect labels of each class, as image grids: :func:`suspects`, and one captioned
grid of the points a score ranks first: :func:`issue_grid` (what ``probust issues``' page shows).

One row per given class: probust's picks (lowest ``label_score``) on the left, cleanlab's
(lowest ``self_confidence``, cleanlab's default label-quality score, on the same model's
predictions) on the right; each image captioned "given > predicted" and its score, in red where
:func:`probust.find_issues` flagged it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import style
from probust.plots.images import Cell, image_panel, to_display

__all__ = ["SECTIONS", "IssueCell", "issue_cells", "issue_grid", "score_labels", "suspects"]

#: The rankings of a find_issues frame worth a look, as (score column, highest first, heading).
SECTIONS: tuple[tuple[str, bool, str], ...] = (
    ("label_score", False, "Most suspect labels (lowest label_score)"),
    ("self_confidence", False, "cleanlab's picks (lowest self_confidence)"),
    ("outlier_score", True, "Most atypical points (highest outlier_score)"),
    ("memorisation_score", True, "Most likely memorised labels (highest memorisation_score)"),
)


@dataclass(frozen=True)
class IssueCell:
    """One point of a grid: its data-set index, image (for imshow), given and predicted label
    names, its score as text (:func:`score_labels`) and whether it is flagged as a label issue."""

    index: int
    image: np.ndarray
    given: str
    predicted: str
    score: str
    flagged: bool


def score_labels(values: Any) -> list[str]:
    """The values as text with the fewest significant digits (3 to 6) that tell apart every two
    that differ at 6 digits (a label score may be 1e-7 beside 3e-7: never "0.00" for both); values
    that differ only past 6 digits (float rounding) read the same."""
    values = [float(v) for v in values]
    distinct = len({f"{v:.6g}" for v in values})
    for digits in range(3, 7):
        texts = [f"{v:.{digits}g}" for v in values]
        if len(set(texts)) == distinct:
            return texts
    return texts


def issue_cells(
    frame: Any, data: Any, by: str = "label_score", count: int = 24, highest: bool = False
) -> list[IssueCell]:
    """The ``count`` points of :func:`probust.find_issues`' ``frame`` that ``by`` ranks first
    (lowest first; ``highest``: highest first; ties by index), with their images from ``data``."""
    if by not in frame:
        raise OptionError(f"names no column of the frame; it has {', '.join(map(str, frame.columns))}", field="by")
    if count < 1:
        raise OptionError(f"must be at least 1, got {count}", field="count")
    ranked = frame.sort_values([by, "index"], ascending=[not highest, True]).head(count)
    given, predicted = _names(ranked, "label"), _names(ranked, "prediction")
    scores = score_labels(ranked[by])
    flagged = ranked["is_label_issue"] if "is_label_issue" in ranked else [False] * len(ranked)
    return [
        IssueCell(int(i), to_display(data[int(i)][0]), g, p, s, bool(f))
        for i, g, p, s, f in zip(ranked["index"], given, predicted, scores, flagged, strict=True)
    ]


def issue_grid(
    frame: Any, data: Any, by: str = "label_score", count: int = 24, *, highest: bool = False, columns: int = 8
) -> Figure:
    """The points ``by`` ranks first, one captioned image each: "#index", "given > predicted" and
    the score (distinct digits where the values differ), in red where flagged as a label issue.

    Args:
        frame: :func:`probust.find_issues`' DataFrame.
        data: the data set it scored, ``data[i] -> (image [C, H, W], label)``.
        by: the column to rank by (``label_score``, ``outlier_score``, ``memorisation_score``,
            ``self_confidence``).
        count: how many points.
        highest: rank the highest first (``outlier_score``, ``memorisation_score``).
        columns: images per row.

    Returns:
        A matplotlib Figure, one axes per image.
    """
    cells = issue_cells(frame, data, by, count, highest)
    columns = max(1, min(columns, len(cells)))
    rows = -(-len(cells) // columns)
    with style.style_context():
        fig = Figure(figsize=(1.35 * columns, 1.75 * rows + 0.3), layout="constrained")
        axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
        for ax in axes:
            ax.set_axis_off()
        for ax, cell in zip(axes, cells, strict=False):
            ax.imshow(cell.image, cmap="gray" if cell.image.ndim == 2 else None, vmin=0, vmax=1)
            names = textwrap.shorten(f"{cell.given} > {cell.predicted}", width=24, placeholder="...")
            ax.set_title(
                f"#{cell.index}\n{names}\n{by.split('_')[0]} {cell.score}",
                fontsize=6.5,
                color="#b03030" if cell.flagged else "black",
            )
        fig.suptitle(f"{'highest' if highest else 'lowest'} {by}", fontsize=9)
    return fig


def _names(frame: Any, column: str) -> list[str]:
    named = f"{column}_name"
    if named in frame:
        return [str(v) for v in frame[named]]
    return [str(v) for v in frame[column]]


def _picks(frame: Any, data: Any, score: str, top: int) -> list[list[Cell | None]]:
    given, predicted = _names(frame, "label"), _names(frame, "prediction")
    rows: list[list[Cell | None]] = []
    for label in sorted(frame["label"].unique()):
        members = frame[frame["label"] == label].sort_values([score, "index"]).head(top)
        row: list[Cell | None] = []
        for position, item in members.iterrows():
            image = data[int(item["index"])][0]
            caption = f"{given[position][:9]} > {predicted[position][:9]}\n{item[score]:.2f}"
            row.append((to_display(image), caption, bool(item["is_label_issue"])))
        rows.append(row + [None] * (top - len(row)))
    return rows


def suspects(frame: Any, data: Any, top: int = 8) -> Figure:
    """The ``top`` most suspect points of each given class, probust's beside cleanlab's.

    Args:
        frame: :func:`probust.find_issues`' DataFrame.
        data: the data set it scored, ``data[i] -> (image [C, H, W], label)``.
        top: images per class and panel.

    Returns:
        A matplotlib Figure with two panels.
    """
    if top < 1:
        raise OptionError(f"must be at least 1, got {top}", field="top")
    classes = sorted(frame["label"].unique())
    labels = [_names(frame[frame["label"] == c], "label")[0] for c in classes]
    with style.style_context():
        fig = Figure(figsize=(2 * 0.75 * top + 1.5, 0.95 * len(classes) + 0.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        image_panel(left, _picks(frame, data, "label_score", top), labels, "probust: lowest label_score (p_label)")
        image_panel(right, _picks(frame, data, "self_confidence", top), None, "cleanlab: lowest self_confidence")
    return fig
