"""How every probust figure draws: estimator names and colours, the shared rc settings, boxes.

Estimators are always drawn in the same colour and named as in the paper (p^mc, p^taylor,
p^mmse, p^taylor_mvs, p^mmse_mvs, p^softmax); the mvn-cdf estimators are solid, their
mv-sigmoid variants dashed in a lighter shade of the same hue. Nothing here touches pyplot's
global state (no backend is chosen, no figure is registered), so a notebook keeps its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from probust.estimators import REGISTRY


@dataclass(frozen=True)
class MethodStyle:
    """How figures draw one estimator.

    Attributes:
        label: its name in figures (matplotlib mathtext, the paper's ``p^{mmse}``).
        colour: its colour (the mvn-cdf estimators solid, their mv-sigmoid variants dashed in
            a lighter shade of the same colour).
        linestyle: its line style.
        marker: its marker.
    """

    label: str
    colour: str
    linestyle: str
    marker: str


#: Every method of the registry (:data:`probust.estimators.REGISTRY`), keyed by its name: one
#: hue per linearisation (Taylor blue, MMSE red), lighter and dashed for the mv-sigmoid variant.
METHOD_STYLES: Mapping[str, MethodStyle] = MappingProxyType(
    {
        "mc": MethodStyle(r"$p^{\mathrm{mc}}$", "#222222", "-", "s"),
        "taylor": MethodStyle(r"$p^{\mathrm{taylor}}$", "#1f5fa8", "-", "o"),
        "mmse": MethodStyle(r"$p^{\mathrm{mmse}}$", "#c0392b", "-", "D"),
        "taylor_mvs": MethodStyle(r"$p^{\mathrm{taylor\_mvs}}$", "#6fa8dc", "--", "o"),
        "mmse_mvs": MethodStyle(r"$p^{\mathrm{mmse\_mvs}}$", "#f1948a", "--", "D"),
        "softmax": MethodStyle(r"$p^{\mathrm{softmax}}$", "#2e8b57", ":", "^"),
        "mc_cv": MethodStyle(r"$p^{\mathrm{mc\_cv}}$", "#7b4fa0", "-.", "v"),
        "mc_is": MethodStyle(r"$p^{\mathrm{mc\_is}}$", "#a0522d", "-.", "P"),
    }
)

#: Order in which estimators appear in legends and tables (the method registry's).
METHOD_ORDER = tuple(REGISTRY)

#: The paper's names, as matplotlib mathtext.
METHOD_LABELS = {name: style.label for name, style in METHOD_STYLES.items()}

#: The same names as HTML (report tables and text).
METHOD_HTML = {name: f"p<sup>{name}</sup>" for name in METHOD_ORDER}

#: The same names as plain text (terminal and CSV).
METHOD_TEXT = {name: f"p^{name}" for name in METHOD_ORDER}

METHOD_COLORS = {name: style.colour for name, style in METHOD_STYLES.items()}
METHOD_LINESTYLES = {name: style.linestyle for name, style in METHOD_STYLES.items()}
METHOD_MARKERS = {name: style.marker for name, style in METHOD_STYLES.items()}

#: Colour of Monte Carlo's own confidence band.
MC_BAND_COLOR = "#bbbbbb"

RC: dict[Any, Any] = {  # matplotlib types the keys as a Literal of every rc name
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10.5,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "svg.fonttype": "path",
    "svg.hashsalt": "probust",  # identical SVGs for identical numbers
}


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def method_color(method: str) -> str:
    return METHOD_COLORS.get(method, "#7f7f7f")


def method_linestyle(method: str) -> str:
    return METHOD_LINESTYLES.get(method, "-")


def method_marker(method: str) -> str:
    return METHOD_MARKERS.get(method, "o")


def method_html(method: str) -> str:
    return METHOD_HTML.get(method, method)


def order_methods(methods: Sequence[str]) -> list[str]:
    """The given methods in :data:`METHOD_ORDER` (unknown names last, alphabetically)."""
    known = [m for m in METHOD_ORDER if m in methods]
    return known + sorted(set(methods) - set(known))


def lambda_colors(lambdas: Sequence[float]) -> dict[float, tuple]:
    """A sequential colour per gradient-norm regularisation weight (darker = more robust)."""
    cmap = matplotlib.colormaps["viridis_r"]
    values = sorted(set(float(v) for v in lambdas))
    n = len(values)
    return {v: cmap(0.15 + 0.75 * (i / max(n - 1, 1))) for i, v in enumerate(values)}


def lambda_label(lam: float | None) -> str:
    if lam is None:
        return "λ=?"
    return "λ=0" if lam == 0 else f"λ={lam:g}"


def method_boxplot(ax, data: Sequence, positions, width: float, method: str) -> None:
    """Boxes (5-95% whiskers, mean as a diamond) of one estimator, in its colour, with a legend entry."""
    boxes = ax.boxplot(
        data,
        positions=positions,
        widths=width * 0.85,
        whis=(5, 95),
        showfliers=False,
        patch_artist=True,
        showmeans=True,
        meanprops={"marker": "D", "markersize": 3.5, "markerfacecolor": "white", "markeredgecolor": "black"},
        medianprops={"color": "black", "linewidth": 1},
    )
    for box in boxes["boxes"]:
        box.set_facecolor(method_color(method))
        box.set_alpha(0.75)
    ax.plot([], [], color=method_color(method), linewidth=6, alpha=0.75, label=method_label(method))


def sigma_label() -> str:
    return "noise σ (per pixel, pixel values in [0, 1])"


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float | None = None, height: float | None = None, **kwargs: Any
) -> tuple[Figure, Any]:
    """A :class:`~matplotlib.figure.Figure` and its [nrows, ncols] array of axes, outside pyplot
    (call it inside :func:`style_context`); each panel about 4 x 3 inches."""
    fig = Figure(figsize=(width or 4.2 * ncols + 0.6, height or 3.2 * nrows + 0.4))
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kwargs)


def style_context() -> Any:
    """The shared style, for the duration of a ``with`` block (every figure is made in one)."""
    return matplotlib.rc_context(RC)
