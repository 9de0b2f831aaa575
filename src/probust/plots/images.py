"""The most and least robust inputs of each class, as an image grid: :func:`extremes`.

The report's "vulnerable and canonical points" figure draws its panels with :func:`image_panel`
too, so both look alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import frames, style

__all__ = ["Cell", "extremes", "extremes_table", "image_panel", "mosaic", "to_display"]

#: One image of a panel: (image [H, W] or [H, W, 3] in [0, 1], caption, drawn in red).
Cell = tuple[np.ndarray, str, bool]


def to_display(img: Any, *, rescale: bool = True) -> np.ndarray:
    """An image [C, H, W] (or [H, W]) as [H, W] (grey) or [H, W, 3] in [0, 1] for ``imshow``.

    Values are clipped to [0, 1]; with ``rescale``, an image whose values lie far outside (a
    normalised input, or 0..255) is first rescaled from its own minimum and maximum, so that it
    stays visible (without it, e.g. for noisy pixels, only clipped).
    """
    a = np.asarray(img.detach().cpu() if hasattr(img, "detach") else img, dtype=np.float32)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise OptionError(
            f"holds inputs of shape {list(a.shape)}; an image grid needs [C, H, W] or [H, W]", field="data"
        )
    low, high = float(np.nanmin(a)), float(np.nanmax(a))
    if rescale and (low < -0.5 or high > 1.5):  # normalised (or 0..255): show the image's own range
        a = (a - low) / (high - low) if high > low else np.zeros_like(a)
    a = np.clip(a, 0, 1)
    return a[0] if a.shape[0] == 1 else np.transpose(a[:3], (1, 2, 0))


def mosaic(cells: list[list[np.ndarray | None]], gap: int, caption: int) -> np.ndarray:
    """Images [H, W] or [H, W, 3] laid out in rows and columns on a NaN background, with
    ``gap`` pixels between columns and ``caption`` pixels below each row for text."""
    first = next(c for row in cells for c in row if c is not None)
    h, w = first.shape[:2]
    extra = first.shape[2:]
    rows, cols = len(cells), max(len(r) for r in cells)
    out = np.full((rows * (h + caption), cols * (w + gap) - gap, *extra), np.nan, dtype=np.float32)
    for i, row in enumerate(cells):
        for j, img in enumerate(row):
            if img is not None:
                out[i * (h + caption) : i * (h + caption) + h, j * (w + gap) : j * (w + gap) + w] = img
    return out


def image_panel(ax: Axes, rows: Sequence[Sequence[Cell | None]], row_labels: Sequence[str] | None, title: str) -> None:
    """Draw a grid of captioned images on ``ax`` as one mosaic (one ``imshow``).

    Args:
        ax: the axes.
        rows: per row, its cells (None: an empty cell).
        row_labels: a label per row on the left (None: no labels).
        title: the panel's title.
    """
    import matplotlib

    first = next(c[0] for row in rows for c in row if c is not None)
    h, w = first.shape[:2]
    grey = first.ndim == 2
    gap, caption = max(1, w // 8), max(3, int(round(h * 0.42)))
    texts = []
    for i, row in enumerate(rows):
        for j, cell in enumerate(row):
            if cell is not None:
                texts.append((j * (w + gap) + w / 2, i * (h + caption) + h + caption * 0.1, cell[1], cell[2]))
    picture = mosaic([[None if c is None else c[0] for c in row] for row in rows], gap, caption)
    if not grey:
        picture = np.where(np.isnan(picture), 1.0, picture)
    cmap = matplotlib.colormaps["gray"].with_extremes(bad="white") if grey else None
    ax.imshow(picture, cmap=cmap, vmin=0, vmax=1, interpolation="nearest", aspect="equal")
    for x, y, text, flagged in texts:
        ax.text(x, y, text, ha="center", va="top", fontsize=6.5, color="#b03030" if flagged else "black")
    ax.set_xticks([])
    ax.set_yticks([i * (h + caption) + h / 2 for i in range(len(rows))] if row_labels is not None else [])
    if row_labels is not None:
        ax.set_yticklabels(list(row_labels), fontsize=9)
        ax.tick_params(axis="y", length=0)
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title, fontsize=10)


def extremes_table(
    results: Any,
    *,
    k: int = 4,
    method: str | None = None,
    sigma: float | None = None,
    by: str | None = None,
) -> pd.DataFrame:
    """The points :func:`extremes` shows: per class, the ``k`` lowest and ``k`` highest ``p``.

    Args:
        results: the runner's DataFrame, or an Estimate (see :func:`probust.plots.frames.as_frame`).
        k: points per class and end (fewer where a class has fewer).
        method: whose ``p`` ranks the points (default: ``mmse``, else ``mc``, else the first present).
        sigma: the noise level (default: the one with the most rows of ``method``).
        by: the class column (default: ``label``, else ``target``).

    Returns:
        One row per shown point: class, end ("lowest" / "highest"), rank (1 = most extreme),
        index, p, and prediction / label where the results have them. Ties are broken by index.

    Raises:
        OptionError: a bad ``k``, or ``method`` / ``sigma`` / ``by`` without rows (named).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise OptionError(f"must be a positive integer, got {k!r}", field="k")
    frame = frames.as_frame(results)
    present = frames.methods_of(frame)
    if method is None:
        method = next((m for m in ("mmse", "mc") if m in present), present[0])
    frames.pick_methods(frame, method, field="method")
    rows = frame[frame["method"] == method]
    chosen = frames.choose_sigma(rows, sigma)
    rows = frames.principal(frames.at_sigmas(rows, [chosen]))
    column = frames.class_column(rows, by)
    out = []
    for c, group in rows.groupby(column):
        for end in ("lowest", "highest"):
            ordered = group.sort_values(["p", "index"], ascending=[end == "lowest", True]).head(k)
            for rank, r in enumerate(ordered.itertuples(index=False), start=1):
                row = {"class": int(c), "end": end, "rank": rank, "index": int(r.index), "p": float(r.p)}
                for extra in ("label", "prediction", "target"):
                    if extra in group:
                        row[extra] = int(getattr(r, extra))
                out.append(row)
    table = pd.DataFrame(out)
    table.attrs.update(method=method, sigma=chosen, by=column)
    return table


def _image(data: Any, index: int) -> Any:
    """Input ``index`` of ``data``: a Dataset item ``(x, label)`` or ``x``, or a row of a tensor/array."""
    try:
        item = data[index]
    except (IndexError, KeyError) as exc:
        raise OptionError(f"has no input at index {index} (the results' index column)", field="data") from exc
    return item[0] if isinstance(item, (tuple, list)) else item


def extremes(
    results: Any,
    data: Any,
    *,
    k: int = 4,
    method: str | None = None,
    sigma: float | None = None,
    by: str | None = None,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Per class, the ``k`` least and ``k`` most robust inputs, as two image grids.

    Each image is captioned with its ``p``; a red caption with ``*`` marks a point the model
    misclassifies (prediction != label). Images are shown clipped to [0, 1] (a normalised
    input is rescaled from its own range).

    Args:
        results: the runner's DataFrame (``probust.score``, ``probust.run.read_results``) or an
            Estimate; its ``index`` column indexes ``data``.
        data: the inputs: a Dataset (``data[i]`` is ``(x, label)`` or ``x``) or a tensor / array
            [N, C, H, W] (or [N, H, W]).
        k: images per class and end.
        method, sigma, by: see :func:`extremes_table`.
        class_names: a name per class (row labels; default: the class numbers).
        title: the figure's title (default: says what is shown).

    Returns:
        A :class:`~matplotlib.figure.Figure` with two panels ("lowest p", "highest p"), one row per class.

    Example:
        >>> fig = probust.plots.extremes(df, test_set, k=4, method="mmse", sigma=0.1)
        >>> fig.savefig("extremes.png")
    """
    table = extremes_table(results, k=k, method=method, sigma=sigma, by=by)
    method, chosen = table.attrs["method"], table.attrs["sigma"]
    pictures = {i: to_display(_image(data, i)) for i in table["index"].unique().tolist()}
    classes = sorted(table["class"].unique().tolist())
    names = [class_names[c] if class_names is not None and c < len(class_names) else str(c) for c in classes]
    label = style.method_label(method)
    with style.style_context():
        fig, axes = style.new_figure(1, 2, width=2 * k * 0.62 + 1.8, height=len(classes) * 0.66 + 1.1)
        for panel, end in enumerate(("lowest", "highest")):
            rows: list[list[Cell | None]] = []
            for c in classes:
                picks = table[(table["class"] == c) & (table["end"] == end)].sort_values("rank")
                line: list[Cell | None] = []
                for r in picks.itertuples(index=False):
                    wrong = "label" in table and "prediction" in table and int(r.prediction) != int(r.label)
                    line.append((pictures[int(r.index)], f"{r.p:.2f}" + ("*" if wrong else ""), bool(wrong)))
                rows.append(line + [None] * (k - len(line)))
            image_panel(axes[0, panel], rows, names if panel == 0 else None, f"{end} {label}")
        at = "" if np.isnan(chosen) else f" (σ={chosen:g})"
        fig.suptitle(
            title or f"per class, the {k} inputs with the lowest / highest {label}{at}; red *: misclassified",
            fontsize=10,
        )
        fig.tight_layout()
    return fig
