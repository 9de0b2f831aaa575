"""Experiment 1: estimation error of every estimator against Monte Carlo, over sigma.

The paper's figure 1a and the appendix figure "Accuracy of p_robust estimators over sigma":
for each model and noise level, the absolute error |p_hat - p_mc| and the relative error
|p_hat - p_mc| / p_mc of p^taylor, p^mmse, p^taylor_mvs, p^mmse_mvs and p^softmax, averaged
over the scored points. Monte Carlo is itself an estimate: its mean 95% half-width is drawn as a
grey band, and the table gives the fraction of points where each estimator falls inside the
point's Monte Carlo interval, so that a difference smaller than Monte Carlo's own noise is not
read as an error.

Outputs: ``estimation_error.csv``, one row per (model, sigma, estimator) (see
:func:`probust.experiments.common.error_table` for the columns); one figure of the standard models,
and one of the first of them point by point (:func:`probust.plots.against_monte_carlo`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from probust import plots
from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import error_table, fmt, pct, sort_by_method
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "estimation_error"
TITLE = "1. Estimation error against Monte Carlo over σ"
DESCRIPTION = (
    "For every model and noise level σ, the mean absolute error |p̂ − p<sup>mc</sup>| and mean relative error "
    "|p̂ − p<sup>mc</sup>| / p<sup>mc</sup> of each estimator over the scored points (error bars: ± one standard "
    "error over points). Monte Carlo is the reference; its own mean 95% confidence half-width is the grey band: "
    "differences inside it are Monte Carlo noise. Relative errors leave out points with p<sup>mc</sup> = 0. "
    "The second figure shows the first model point by point: each estimate against p<sup>mc</sup> (grey bars: "
    "Monte Carlo's interval; the dotted diagonal is agreement)."
)


def error_summary(table: pd.DataFrame, models: Iterable[str] | None = None) -> pd.DataFrame:
    """Mean |error| against Monte Carlo: one row per (model, estimator), one column per sigma.

    Args:
        table: this experiment's main table.
        models: the labels of the models to keep (default: all).

    Returns:
        Columns model, estimator (``p^<method>``, then ``(MC 95% half-width)`` per model) and
        ``σ=<sigma>`` for each sigma.
    """
    t = table
    if models is not None:
        t = t[t["model"].isin(list(models))]
    order = {m: i for i, m in enumerate(style.METHOD_ORDER)}
    wide = t.pivot_table(index=["model", "method"], columns="sigma", values="mean_abs_error", aggfunc="first")
    half = t.drop_duplicates(["model", "sigma"]).pivot_table(
        index="model", columns="sigma", values="mc_mean_half_width"
    )
    rows = []
    for model in dict.fromkeys(t["model"]):
        block = wide.loc[model]
        block = block.iloc[np.argsort([order.get(m, 99) for m in block.index])]
        for method, values in block.iterrows():
            rows.append({"model": model, "estimator": f"p^{method}", **{f"σ={s:g}": v for s, v in values.items()}})
        rows.append(
            {"model": model, "estimator": "(MC 95% half-width)", **{f"σ={s:g}": v for s, v in half.loc[model].items()}}
        )
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, runs: list[Run], stem: Path) -> Path:
    with style.style_context():
        fig, axes = style.new_figure(2, len(runs), height=6.4)
        for col, run in enumerate(runs):
            t = table[table["model"] == run.label]
            sigmas = sorted(t["sigma"].unique())
            band = t.drop_duplicates("sigma").sort_values("sigma")
            for row, (stat, label) in enumerate(
                (
                    ("abs_error", "mean |p̂ − p$^{\\mathrm{mc}}$|"),
                    ("rel_error", "mean |p̂ − p$^{\\mathrm{mc}}$| / p$^{\\mathrm{mc}}$"),
                )
            ):
                ax = axes[row, col]
                values = t[f"mean_{stat}"].tolist()
                floor = style.log_floor(values + band["mc_mean_half_width"].tolist())
                if stat == "abs_error":
                    ax.fill_between(
                        band["sigma"],
                        floor,
                        band["mc_mean_half_width"],
                        color=style.MC_BAND_COLOR,
                        alpha=0.5,
                        label=f"{style.method_label('mc')} mean 95% half-width (n={int(band['mc_n_samples'].iloc[0]):,})",
                    )
                else:
                    rel_band = band["mc_mean_half_width"] / band["mean_p_mc"].clip(lower=1e-12)
                    ax.fill_between(band["sigma"], floor, rel_band, color=style.MC_BAND_COLOR, alpha=0.5)
                for method in style.order_methods(t["method"].unique()):
                    m = t[t["method"] == method].sort_values("sigma")
                    ax.errorbar(
                        m["sigma"],
                        m[f"mean_{stat}"],
                        yerr=m[f"sem_{stat}"],
                        label=style.method_label(method),
                        color=style.method_color(method),
                        linestyle=style.method_linestyle(method),
                        marker=style.method_marker(method),
                        capsize=2.5,
                    )
                style.log_y(ax, floor)
                style.sigma_axis(ax, sigmas)
                ax.set_ylabel(("absolute error" if stat == "abs_error" else "relative error") + "\n" + label)
                if row == 0:
                    ax.set_title(f"{run.label}\n({int(t['n_points'].max())} points)")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False, bbox_to_anchor=(0.5, -0.06)
        )
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


#: The estimators of the point-by-point figure (the others are in the table and the curves).
POINTS_METHODS = ("taylor", "mmse", "softmax")


def _points_figure(run: Run, stem: Path) -> Path:
    """:func:`probust.plots.against_monte_carlo` for one run, on its points scored at every sigma."""
    core = run.table[run.table["index"].isin(run.core_indices)]
    methods = [m for m in POINTS_METHODS if run.has(m)] or None
    fig = plots.against_monte_carlo(core, methods=methods, title=f"{run.label}: each point against Monte Carlo")
    return style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame, runs: list[Run]) -> list[str]:
    out = []
    for run in runs:
        t = table[table["model"] == run.label]
        if t.empty:
            continue
        avg = t.groupby("method")["mean_abs_error"].mean().sort_values()
        ranking = ", ".join(f"{style.method_html(m)} {fmt(v)}" for m, v in avg.items())
        out.append(f"<b>{run.label}</b>: mean |error| against Monte Carlo averaged over σ, best first: {ranking}.")
        # the paper's comparison is between the analytical estimators (and softmax)
        analytic = avg[[m for m in avg.index if not m.startswith("mc")]]
        if analytic.empty:
            continue
        best = analytic.index[0]
        sigmas = sorted(t["sigma"].unique())
        if len(sigmas) > 1:
            parts = []
            for method in (best, "taylor") if best != "taylor" and "taylor" in avg.index else (best,):
                m = t[t["method"] == method].set_index("sigma")["mean_abs_error"]
                trend = "grows" if m.iloc[-1] > m.iloc[0] else "does not grow"
                parts.append(
                    f"{style.method_html(method)}'s error {trend} with σ ({fmt(m.iloc[0])} at σ={sigmas[0]:g}, {fmt(m.iloc[-1])} at σ={sigmas[-1]:g})"
                )
            out.append("; ".join(parts) + ".")
        band = t.drop_duplicates("sigma").set_index("sigma")["mc_mean_half_width"]
        b = t[t["method"] == best].set_index("sigma")
        inside = [s for s in sigmas if b.loc[s, "mean_abs_error"] <= band.loc[s]]
        if inside:
            out.append(
                f"At σ ∈ {{{', '.join(f'{s:g}' for s in inside)}}} {style.method_html(best)}'s mean error is within Monte "
                f"Carlo's own mean 95% half-width: there the difference is not resolved by n={int(t['mc_n_samples'].iloc[0]):,} samples "
                f"({pct(b.loc[inside[0], 'frac_within_mc_ci'])} of points inside their interval at σ={inside[0]:g})."
            )
        else:
            out.append(
                f"{style.method_html(best)}'s error exceeds Monte Carlo's mean 95% half-width at every σ, so the differences are real, not sampling noise."
            )
        if "softmax" in avg.index and best != "softmax":
            out.append(
                f"{style.method_html('softmax')} does not depend on σ; its error is {fmt(avg['softmax'] / avg[best])}× that of {style.method_html(best)} on average."
            )
    return out


class EstimationError(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *, models: list[str] | None = None) -> Output:
        """Error tables for every run with Monte Carlo rows; the figure for the standard models.

        Args:
            results: the runs.
            out: folder for ``estimation_error.csv`` and the figure.
            models: labels of the runs to draw (default: the standard, lambda = 0, models).
        """
        out = Path(out)
        runs = [r for r in results if r.has("mc")]
        if not runs:
            raise ExperimentSkipped("no Monte Carlo rows: score with method mc to have a reference")
        table = pd.concat([error_table(r) for r in runs], ignore_index=True)
        if table.empty:
            raise ExperimentSkipped("no estimator was scored on the same points and σ as Monte Carlo")
        if models is not None:
            drawn = [results.by_label(m) for m in models]
        else:
            drawn = [r for r in runs if r.is_standard] or runs
        drawn = [r for r in drawn if (table["model"] == r.label).any()]
        figures = [_plot(table, drawn, out / NAME)]
        if drawn:
            figures.append(_points_figure(drawn[0], out / f"{NAME}_points"))
        return self.output(
            out,
            tables={NAME: table},
            figures=figures,
            reading=_reading(table, drawn),
            settings={"models": [r.label for r in drawn]},
        )

    def display(self, output: Output) -> list[Shown]:
        main = output.tables.get(self.name, pd.DataFrame())
        view = main[
            [
                "model",
                "sigma",
                "method",
                "n_points",
                "mean_abs_error",
                "sem_abs_error",
                "mean_rel_error",
                "frac_within_mc_ci",
                "mc_mean_half_width",
            ]
        ]
        view = sort_by_method(view).assign(method=lambda f: "p^" + f["method"])
        return [
            (
                "Mean |p̂ − p<sup>mc</sup>| ± SEM, mean relative error, share of points inside Monte Carlo's 95% interval",
                view,
            )
        ]

    def summary(self, output: Output, results: Results) -> list[Shown]:
        errors = error_summary(output.table, [r.label for r in results.standard()] or None)
        return [("Mean |p̂ − p<sup>mc</sup>| of each estimator against Monte Carlo, per σ (experiment 1)", errors)]


EXPERIMENT = EstimationError()
