"""Robustness per class: :func:`class_bias` (boxes per class, or means with an interval).

The report's "robustness bias among classes" figure is this function's ``kind="box"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import frames, style

__all__ = ["class_bias", "class_means"]

#: z of a two-sided 95% normal interval.
_Z95 = 1.959963984540054


def class_means(
    results: Any,
    *,
    sigma: float | Iterable[float] | None = None,
    methods: str | Iterable[str] | None = None,
    by: str | None = None,
) -> pd.DataFrame:
    """Mean p per (sigma, method, class), with a 95% normal interval (mean ± 1.96 SEM).

    Args:
        results: the runner's DataFrame or an Estimate.
        sigma, methods: the levels and methods (default: all present).
        by: the class column (default: ``label``, else ``target``).

    Returns:
        Columns sigma, method, class, n, mean, sem, ci_low, ci_high (principal sample counts).
    """
    frame = frames.as_frame(results)
    chosen_methods = frames.pick_methods(frame, methods)
    sigmas = frames.pick_sigmas(frame, sigma)
    rows = frames.principal(frames.at_sigmas(frame[frame["method"].isin(chosen_methods)], sigmas))
    column = frames.class_column(rows, by)
    keys = ["sigma", "method", column] if "sigma" in rows else ["method", column]
    g = rows.groupby(keys, dropna=False)["p"]
    out = g.agg(n="count", mean="mean", std="std").reset_index().rename(columns={column: "class"})
    out["sem"] = out["std"] / np.sqrt(out["n"])
    out["ci_low"] = out["mean"] - _Z95 * out["sem"].fillna(0.0)
    out["ci_high"] = out["mean"] + _Z95 * out["sem"].fillna(0.0)
    return out.drop(columns="std")


def class_bias(
    results: Any,
    *,
    sigma: float | Iterable[float] | None = None,
    methods: str | Iterable[str] | None = None,
    by: str | None = None,
    kind: str = "box",
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """p per class: one panel per sigma, the classes along x, the methods side by side.

    Args:
        results: the runner's DataFrame (``probust.score``, ``probust.run.read_results``) or an Estimate.
        sigma: the noise level(s) drawn (default: every one present).
        methods: the methods drawn (default: every one present).
        by: the class column: ``label`` (the true class, the default where present) or
            ``prediction`` / ``target``.
        kind: ``"box"`` (quartiles, whiskers 5th-95th percentiles, diamond: mean) or ``"mean"``
            (bars of the mean p, error bars its 95% normal interval, :func:`class_means`).
        class_names: a name per class (default: the class numbers).
        title: the first panel's title.
        ax: draw into these axes (one sigma only); default: a new figure.

    Returns:
        The :class:`~matplotlib.figure.Figure`.

    Raises:
        OptionError: a bad ``kind``, ``ax`` with several sigmas, or a method / sigma / class column
            without rows (named).
    """
    if kind not in ("box", "mean"):
        raise OptionError(f"must be 'box' or 'mean', got {kind!r}", field="kind")
    frame = frames.as_frame(results)
    chosen_methods = frames.pick_methods(frame, methods)
    sigmas = frames.pick_sigmas(frame, sigma)
    if ax is not None and len(sigmas) > 1:
        raise OptionError(f"holds one panel; choose one sigma of {', '.join(f'{s:g}' for s in sigmas)}", field="ax")
    rows = frames.principal(frames.at_sigmas(frame[frame["method"].isin(chosen_methods)], sigmas))
    column = frames.class_column(rows, by)
    classes = sorted(int(c) for c in rows[column].unique())
    names = [class_names[c] if class_names is not None and c < len(class_names) else str(c) for c in classes]
    means = class_means(rows, methods=chosen_methods, by=column) if kind == "mean" else None
    with style.style_context():
        if ax is None:
            fig, axes = style.new_figure(
                len(sigmas), 1, width=max(7.5, 0.75 * len(classes) + 2), height=2.3 * len(sigmas) + 0.8
            )
            panels = [axes[i, 0] for i in range(len(sigmas))]
        else:
            fig, panels = ax.figure, [ax]  # type: ignore[assignment]
        width = 0.8 / max(len(chosen_methods), 2) if kind == "mean" or len(chosen_methods) > 2 else 0.36
        for row, (s, a) in enumerate(zip(sigmas, panels)):
            g = rows if np.isnan(s) else rows[rows["sigma"] == s]
            for k, method in enumerate(chosen_methods):
                pos = np.arange(len(classes)) + (k - (len(chosen_methods) - 1) / 2) * width
                if kind == "box":
                    data = [g.loc[(g[column] == c) & (g["method"] == method), "p"].dropna().to_numpy() for c in classes]
                    keep = [i for i, d in enumerate(data) if d.size]
                    if keep:
                        style.method_boxplot(a, [data[i] for i in keep], pos[keep], width, method)
                    continue
                assert means is not None
                m = means[(means["method"] == method) & ((means["sigma"] == s) if not np.isnan(s) else True)]
                _mean_bars(a, pos, m.set_index("class").reindex(classes), width, method)
            _class_axis(a, names, row == len(sigmas) - 1, column, s)
            if row == 0:
                a.legend(loc="lower right", frameon=True, ncol=len(chosen_methods))
                a.set_title(title or f"p_robust per class ({'true label' if column == 'label' else column})")
        if ax is None:
            fig.tight_layout()
    assert isinstance(fig, Figure)
    return fig


def _class_axis(a: Axes, names: Sequence[str], last: bool, column: str, sigma: float) -> None:
    """The panel's axes: the classes along x (named on the ``last`` panel only), p at ``sigma``
    along y."""
    a.set_xticks(range(len(names)))
    if last:
        a.set_xticklabels(names, rotation=25 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
        a.set_xlabel("class" + ("" if column == "label" else f" ({column})"))
    else:
        a.set_xticklabels([])
    a.set_ylabel("p" if np.isnan(sigma) else f"p at σ={sigma:g}")
    a.set_ylim(-0.03, 1.03)
    a.grid(False, axis="x")


def _mean_bars(a: Axes, pos: np.ndarray, m: Any, width: float, method: str) -> None:
    """Bars of one method's mean p per class at ``pos``, with its 95% interval (``m``: one row
    per class, :func:`class_means`' columns)."""
    a.bar(
        pos,
        m["mean"].to_numpy(),
        width=width * 0.9,
        color=style.method_color(method),
        alpha=0.8,
        label=style.method_label(method),
    )
    a.errorbar(
        pos,
        m["mean"].to_numpy(),
        yerr=np.vstack([m["mean"] - m["ci_low"], m["ci_high"] - m["mean"]]),
        fmt="none",
        ecolor="black",
        capsize=2.5,
        linewidth=1,
    )
