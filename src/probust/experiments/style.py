"""The look shared by every experiment figure: estimator names and colours, fonts, saving.

The names, colours, line styles, markers and rc settings are :mod:`probust.plots.style`'s (the
figures of ``probust.plots`` and of the report are drawn by the same code); this module adds
what only the report needs: the Agg backend (no display), axes helpers and saving PNG + SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=True)

# (imported after choosing the backend, which must come before pyplot: hence E402)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from probust._io import atomic_write  # noqa: E402
from probust.plots.style import (  # noqa: E402
    MC_BAND_COLOR,
    METHOD_COLORS,
    METHOD_HTML,
    METHOD_LABELS,
    METHOD_LINESTYLES,
    METHOD_MARKERS,
    METHOD_ORDER,
    METHOD_STYLES,
    METHOD_TEXT,
    RC,
    MethodStyle,
    lambda_colors,
    lambda_label,
    method_boxplot,
    method_color,
    method_html,
    method_label,
    method_linestyle,
    method_marker,
    order_methods,
    sigma_label,
    style_context,
)

__all__ = [
    "MC_BAND_COLOR",
    "METHOD_COLORS",
    "METHOD_HTML",
    "METHOD_LABELS",
    "METHOD_LINESTYLES",
    "METHOD_MARKERS",
    "METHOD_ORDER",
    "METHOD_STYLES",
    "METHOD_TEXT",
    "MethodStyle",
    "html_names",
    "lambda_colors",
    "lambda_label",
    "log_floor",
    "log_x",
    "log_y",
    "mathtext",
    "method_boxplot",
    "method_color",
    "method_html",
    "method_label",
    "method_linestyle",
    "method_marker",
    "new_figure",
    "order_methods",
    "save_figure",
    "sigma_axis",
    "sigma_label",
    "style_context",
]


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float | None = None, height: float | None = None, **kwargs: Any
):
    """``plt.subplots`` (call it inside :func:`style_context`); each panel about 4 x 3 inches."""
    return plt.subplots(
        nrows,
        ncols,
        figsize=(width or 4.2 * ncols + 0.6, height or 3.2 * nrows + 0.4),
        squeeze=False,
        **kwargs,
    )


def sigma_axis(ax, sigmas: Sequence[float]) -> None:
    """A log x axis labelled with the noise levels actually used."""
    sigmas = sorted(set(float(s) for s in sigmas))
    if len(sigmas) > 1 and sigmas[0] > 0 and sigmas[-1] / sigmas[0] >= 2.5:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(sigmas)
    ax.set_xticklabels([f"{s:g}" for s in sigmas])
    ax.set_xlabel(sigma_label())


def log_y(ax, bottom: float | None = None) -> None:
    """A log y axis with plain tick labels at 1, 2 and 5 times powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    if bottom is not None:
        ax.set_ylim(bottom=bottom)
    low, high = ax.get_ylim()
    decades = math.log10(high / low) if low > 0 and high > low else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def log_x(ax) -> None:
    """A log x axis with plain tick labels (sample counts)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def log_floor(values, default: float = 1e-4) -> float:
    """A sensible lower y limit for a log axis showing ``values`` (ignores zeros)."""
    positive = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not positive:
        return default
    return min(positive) / 1.8


def mathtext(text: str) -> str:
    """Plain-text estimator names (``p^mmse``) in ``text`` as mathtext, for figure labels."""
    for m in sorted(METHOD_ORDER, key=len, reverse=True):
        text = text.replace(f"p^{m}", METHOD_LABELS[m])
    return text


def html_names(text: str) -> str:
    """Plain-text estimator names (``p^mmse``) in ``text`` as HTML."""
    for m in sorted(METHOD_ORDER, key=len, reverse=True):
        text = text.replace(f"p^{m}", METHOD_HTML[m])
    return text


def save_figure(fig: Figure, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` (each whole or not at all, replacing a file or link of
    its name rather than writing through it) and close the figure.

    Returns:
        [png path, svg path].
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    with matplotlib.rc_context(RC):
        atomic_write(paths[0], lambda f: fig.savefig(f, format="png", metadata={"Software": None}), durable=False)
        atomic_write(
            paths[1], lambda f: fig.savefig(f, format="svg", metadata={"Date": None, "Creator": None}), durable=False
        )
    plt.close(fig)
    return paths
