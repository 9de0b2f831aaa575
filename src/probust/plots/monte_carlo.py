"""Each estimator against Monte Carlo, point by point: :func:`against_monte_carlo`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from probust.errors import OptionError
from probust.plots import frames, style

__all__ = ["against_monte_carlo", "monte_carlo_pairs"]


def monte_carlo_pairs(
    results: Any,
    *,
    methods: str | Iterable[str] | None = None,
    sigma: float | Iterable[float] | None = None,
) -> pd.DataFrame:
    """Every point scored by Monte Carlo and by another method at the same sigma.

    Returns:
        Columns sigma, method, index, p (the method's), p_mc, mc_ci_low, mc_ci_high (NaN where the
        results hold no interval), error (p - p_mc); principal sample counts.

    Raises:
        OptionError: (field ``results``) no ``mc`` rows; (``methods``, ``sigma``) none of those rows.
    """
    frame = frames.as_frame(results)
    present = frames.methods_of(frame)
    if "mc" not in present:
        raise OptionError(
            f"hold no Monte Carlo ('mc') rows to compare with (methods: {', '.join(present)}); "
            "score the same points with method 'mc' too",
            field="results",
        )
    chosen = [m for m in frames.pick_methods(frame, methods) if m != "mc"] if methods is not None else None
    if chosen is None:
        chosen = [m for m in present if m != "mc"]
    if not chosen:
        raise OptionError("name no method besides 'mc' to compare with it", field="methods")
    sigmas = frames.pick_sigmas(frame, sigma)
    w = frames.wide(frames.at_sigmas(frame[frame["method"].isin(["mc", *chosen])], sigmas))
    parts = []
    for method in chosen:
        both = w[w["p_mc"].notna() & w[f"p_{method}"].notna()]
        part = pd.DataFrame(
            {
                "sigma": both["sigma"] if "sigma" in both else np.nan,
                "method": method,
                "index": both["index"],
                "p": both[f"p_{method}"],
                "p_mc": both["p_mc"],
                "mc_ci_low": both["mc_ci_low"] if "mc_ci_low" in both else np.nan,
                "mc_ci_high": both["mc_ci_high"] if "mc_ci_high" in both else np.nan,
            }
        )
        parts.append(part)
    pairs = pd.concat(parts, ignore_index=True)
    if pairs.empty:
        raise OptionError(f"score no point with 'mc' and {', '.join(chosen)} at the same sigma", field="results")
    pairs["error"] = pairs["p"] - pairs["p_mc"]
    return pairs.sort_values(["sigma", "method", "index"], key=_method_key).reset_index(drop=True)


def _method_key(column: pd.Series) -> pd.Series:
    if column.name != "method":
        return column
    order = {m: i for i, m in enumerate(style.METHOD_ORDER)}
    return column.map(lambda m: order.get(m, len(order)))


def against_monte_carlo(
    results: Any,
    *,
    methods: str | Iterable[str] | None = None,
    sigma: float | Iterable[float] | None = None,
    title: str | None = None,
) -> Figure:
    """p of each estimator (y) against Monte Carlo's (x), one point per input, one panel per
    (method, sigma); the diagonal is agreement.

    Horizontal bars are Monte Carlo's own confidence interval (where the results hold it): a
    point whose bar crosses the diagonal is within Monte Carlo's noise. Each panel's title gives
    the mean |p - p_mc| over its points.

    Args:
        results: the runner's DataFrame (``probust.score``, ``probust.run.read_results``) with
            ``mc`` rows and at least one other method on the same points.
        methods: the methods compared (default: every one besides ``mc``).
        sigma: the noise level(s) (default: every one present).
        title: the figure's title.

    Returns:
        The :class:`~matplotlib.figure.Figure`: rows are methods, columns noise levels.

    Raises:
        OptionError: no ``mc`` rows (field ``results``), or no rows of ``methods`` / ``sigma``.
    """
    pairs = monte_carlo_pairs(results, methods=methods, sigma=sigma)
    chosen = list(dict.fromkeys(pairs["method"]))
    sigmas = sorted(pairs["sigma"].unique()) if pairs["sigma"].notna().any() else [np.nan]
    with style.style_context():
        fig, axes = style.new_figure(
            len(chosen), len(sigmas), width=3.1 * len(sigmas) + 0.8, height=2.9 * len(chosen) + 0.7
        )
        for i, method in enumerate(chosen):
            for j, s in enumerate(sigmas):
                ax = axes[i, j]
                g = pairs[(pairs["method"] == method) & ((pairs["sigma"] == s) if not np.isnan(s) else True)]
                ax.plot([0, 1], [0, 1], color="#888888", linewidth=1, linestyle=":", zorder=1)
                if g["mc_ci_low"].notna().any():
                    ax.errorbar(
                        g["p_mc"],
                        g["p"],
                        xerr=np.vstack([g["p_mc"] - g["mc_ci_low"], g["mc_ci_high"] - g["p_mc"]]).clip(min=0),
                        fmt="none",
                        ecolor=style.MC_BAND_COLOR,
                        linewidth=0.8,
                        zorder=2,
                    )
                ax.scatter(
                    g["p_mc"],
                    g["p"],
                    s=12,
                    color=style.method_color(method),
                    marker=style.method_marker(method),
                    alpha=0.8,
                    zorder=3,
                    label=style.method_label(method),
                )
                ax.set_xlim(-0.03, 1.03)
                ax.set_ylim(-0.03, 1.03)
                ax.set_aspect("equal")
                at = "" if np.isnan(s) else f"σ={s:g}: "
                ax.set_title(f"{at}mean |error| {np.abs(g['error']).mean():.3g} ({len(g)} pts)", fontsize=9)
                if i == len(chosen) - 1:
                    ax.set_xlabel(style.method_label("mc"))
                if j == 0:
                    ax.set_ylabel(style.method_label(method))
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
    return fig
