"""The most suspect labels of each class, as image grids: :func:`suspects`.

One row per given class: probust's picks (lowest ``label_score``) on the left, cleanlab's
(lowest ``self_confidence``, cleanlab's default label-quality score, on the same model's
predictions) on the right; each image captioned "given > predicted" and its score, in red where
:func:`probust.find_issues` flagged it.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import style
from probust.plots.images import Cell, image_panel, to_display

__all__ = ["suspects"]


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
