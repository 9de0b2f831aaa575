"""How p is distributed over the points at each noise level: :func:`over_sigma`.

The report's "distribution of p_robust over sigma" draws each model's panel with this function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import frames, style

__all__ = ["over_sigma"]


def over_sigma(
    results: Any,
    *,
    methods: str | Iterable[str] | None = None,
    sigma: float | Iterable[float] | None = None,
    kind: str = "box",
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """The distribution of p over the scored points, per noise level, the methods side by side.

    Args:
        results: the runner's DataFrame (``probust.score``, ``probust.run.read_results``) or an Estimate.
        methods: the methods drawn (default: every one present).
        sigma: the noise levels drawn (default: every one present).
        kind: ``"box"`` (quartiles, whiskers 5th-95th percentiles, diamond: mean) or ``"violin"``
            (the density, with the median marked).
        title: the panel's title.
        ax: draw into these axes; default: a new figure.

    Returns:
        The :class:`~matplotlib.figure.Figure`.

    Raises:
        OptionError: a bad ``kind``, or a method / sigma without rows (named).
    """
    if kind not in ("box", "violin"):
        raise OptionError(f"must be 'box' or 'violin', got {kind!r}", field="kind")
    frame = frames.as_frame(results)
    chosen = frames.pick_methods(frame, methods)
    sigmas = frames.pick_sigmas(frame, sigma)
    rows = frames.principal(frames.at_sigmas(frame[frame["method"].isin(chosen)], sigmas))
    own = ax is None
    with style.style_context():
        if ax is None:
            fig, axes = style.new_figure(1, 1, width=max(4.6, 1.1 * len(sigmas) * max(len(chosen), 2) / 2 + 1.5))
            ax = axes[0, 0]
        else:
            fig = ax.figure  # type: ignore[assignment]  # a Figure: the axes are drawn in one
        width = 0.36 if len(chosen) <= 2 else 0.8 / len(chosen)
        for j, method in enumerate(chosen):
            m = rows[rows["method"] == method]
            data = [(m if np.isnan(s) else m[m["sigma"] == s])["p"].dropna().to_numpy() for s in sigmas]
            pos = np.arange(len(sigmas)) + (j - (len(chosen) - 1) / 2) * width
            keep = [i for i, d in enumerate(data) if d.size]
            if not keep:
                continue
            if kind == "box":
                style.method_boxplot(ax, [data[i] for i in keep], pos[keep], width, method)
                continue
            parts = ax.violinplot([data[i] for i in keep], positions=pos[keep], widths=width * 0.9, showmedians=True)
            for body in cast(list, parts["bodies"]):  # a list of PolyCollections, typed loosely
                body.set_facecolor(style.method_color(method))
                body.set_alpha(0.6)
            for key in ("cmedians", "cmins", "cmaxes", "cbars"):
                parts[key].set_color(style.method_color(method))
            ax.plot([], [], color=style.method_color(method), linewidth=6, alpha=0.6, label=style.method_label(method))
        ax.set_xticks(range(len(sigmas)))
        ax.set_xticklabels(["–" if np.isnan(s) else f"{s:g}" for s in sigmas])
        ax.set_xlabel(style.sigma_label())
        ax.set_ylabel("p_robust (probability)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(False, axis="x")
        if title:
            ax.set_title(title, fontsize=10)
        ax.legend(loc="lower left", frameon=True)
        if own:
            fig.tight_layout()
    assert isinstance(fig, Figure)
    return fig
