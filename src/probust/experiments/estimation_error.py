"""Experiment 1: estimation error of every estimator against Monte Carlo, over sigma.

The paper's figure 1a and the appendix figure "Accuracy of p_robust estimators over sigma":
for each model and noise level, the absolute error |p_hat - p_mc| and the relative error
|p_hat - p_mc| / p_mc of p^taylor, p^mmse, p^taylor_mvs, p^mmse_mvs and p^softmax, averaged
over the scored points. Monte Carlo is itself an estimate: its mean 95% half-width is drawn as a
grey band, and the table gives the fraction of points where each estimator falls inside the
point's Monte Carlo interval, so that a difference smaller than Monte Carlo's own noise is not
read as an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probust.experiments import _style
from probust.experiments._base import ExperimentSkipped, Output, finish, fmt, pct, sem
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "estimation_error"
TITLE = "1. Estimation error against Monte Carlo over σ"
DESCRIPTION = (
    "For every model and noise level σ, the mean absolute error |p̂ − p<sup>mc</sup>| and mean relative error "
    "|p̂ − p<sup>mc</sup>| / p<sup>mc</sup> of each estimator over the scored points (error bars: ± one standard "
    "error over points). Monte Carlo is the reference; its own mean 95% confidence half-width is the grey band: "
    "differences inside it are Monte Carlo noise. Relative errors leave out points with p<sup>mc</sup> = 0."
)
ESTIMATORS = ("taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is")


def error_table(run: Run) -> pd.DataFrame:
    """Per (sigma, estimator): error statistics against Monte Carlo on the points both scored."""
    w = run.wide(core=True)
    if "p_mc" not in w:
        return pd.DataFrame()
    w = w[w["p_mc"].notna()]
    rows = []
    for sigma, group in w.groupby("sigma"):
        half_width = ((group["mc_ci_high"] - group["mc_ci_low"]) / 2).to_numpy()
        for method in ESTIMATORS:
            column = "softmax" if method == "softmax" else f"p_{method}"
            if method != "softmax" and column not in group:
                continue
            if method == "softmax" and not run.has("softmax"):
                continue
            g = group[group[column].notna()]
            if g.empty:
                continue
            p_hat, p_mc = g[column].to_numpy(), g["p_mc"].to_numpy()
            err = p_hat - p_mc
            abs_err = np.abs(err)
            positive = p_mc > 0
            rel = abs_err[positive] / p_mc[positive]
            # (a hair of tolerance: an interval's end computed as 0.999...9 still contains p = 1)
            within = (p_hat >= g["mc_ci_low"].to_numpy() - 1e-9) & (p_hat <= g["mc_ci_high"].to_numpy() + 1e-9)
            rows.append(
                {
                    "model": run.label,
                    "dataset": run.dataset,
                    "arch": run.arch,
                    "grad_reg": run.grad_reg,
                    "sigma": float(sigma),
                    "method": method,
                    "n_samples": int(run.principal_n(method) or 0),
                    "mc_n_samples": int(run.principal_n("mc")),
                    "n_points": int(len(g)),
                    "mean_abs_error": float(abs_err.mean()),
                    "sem_abs_error": sem(abs_err),
                    "median_abs_error": float(np.median(abs_err)),
                    "p90_abs_error": float(np.quantile(abs_err, 0.9)),
                    "max_abs_error": float(abs_err.max()),
                    "mean_signed_error": float(err.mean()),
                    "mean_rel_error": float(rel.mean()) if rel.size else np.nan,
                    "sem_rel_error": sem(rel),
                    "n_points_rel": int(positive.sum()),
                    "frac_within_mc_ci": float(within.mean()),
                    "mc_mean_half_width": float(np.nanmean(half_width)),
                    "mean_p_mc": float(p_mc.mean()),
                    "mean_p": float(p_hat.mean()),
                }
            )
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, runs: list[Run], stem: Path) -> Path:
    with _style.style_context():
        fig, axes = _style.new_figure(2, len(runs), height=6.4)
        for col, run in enumerate(runs):
            t = table[table["model"] == run.label]
            sigmas = sorted(t["sigma"].unique())
            band = t.drop_duplicates("sigma").sort_values("sigma")
            for row, (stat, label) in enumerate(
                (("abs_error", "mean |p̂ − p$^{\\mathrm{mc}}$|"), ("rel_error", "mean |p̂ − p$^{\\mathrm{mc}}$| / p$^{\\mathrm{mc}}$"))
            ):
                ax = axes[row, col]
                values = t[f"mean_{stat}"].tolist()
                floor = _style.log_floor(values + band["mc_mean_half_width"].tolist())
                if stat == "abs_error":
                    ax.fill_between(
                        band["sigma"], floor, band["mc_mean_half_width"], color=_style.MC_BAND_COLOR, alpha=0.5,
                        label=f"{_style.method_label('mc')} mean 95% half-width (n={int(band['mc_n_samples'].iloc[0]):,})",
                    )  # fmt: skip
                else:
                    rel_band = band["mc_mean_half_width"] / band["mean_p_mc"].clip(lower=1e-12)
                    ax.fill_between(band["sigma"], floor, rel_band, color=_style.MC_BAND_COLOR, alpha=0.5)
                for method in _style.order_methods(t["method"].unique()):
                    m = t[t["method"] == method].sort_values("sigma")
                    ax.errorbar(
                        m["sigma"], m[f"mean_{stat}"], yerr=m[f"sem_{stat}"], label=_style.method_label(method),
                        color=_style.method_color(method), linestyle=_style.method_linestyle(method),
                        marker=_style.method_marker(method), capsize=2.5,
                    )  # fmt: skip
                _style.log_y(ax, floor)
                _style.sigma_axis(ax, sigmas)
                ax.set_ylabel(("absolute error" if stat == "abs_error" else "relative error") + "\n" + label)
                if row == 0:
                    ax.set_title(f"{run.label}\n({int(t['n_points'].max())} points)")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False, bbox_to_anchor=(0.5, -0.06))
        fig.tight_layout()
        return _style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame, runs: list[Run]) -> list[str]:
    out = []
    for run in runs:
        t = table[table["model"] == run.label]
        if t.empty:
            continue
        avg = t.groupby("method")["mean_abs_error"].mean().sort_values()
        ranking = ", ".join(f"{_style.method_html(m)} {fmt(v)}" for m, v in avg.items())
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
                parts.append(f"{_style.method_html(method)}'s error {trend} with σ ({fmt(m.iloc[0])} at σ={sigmas[0]:g}, {fmt(m.iloc[-1])} at σ={sigmas[-1]:g})")
            out.append("; ".join(parts) + ".")
        band = t.drop_duplicates("sigma").set_index("sigma")["mc_mean_half_width"]
        b = t[t["method"] == best].set_index("sigma")
        inside = [s for s in sigmas if b.loc[s, "mean_abs_error"] <= band.loc[s]]
        if inside:
            out.append(
                f"At σ ∈ {{{', '.join(f'{s:g}' for s in inside)}}} {_style.method_html(best)}'s mean error is within Monte "
                f"Carlo's own mean 95% half-width: there the difference is not resolved by n={int(t['mc_n_samples'].iloc[0]):,} samples "
                f"({pct(b.loc[inside[0], 'frac_within_mc_ci'])} of points inside their interval at σ={inside[0]:g})."
            )
        else:
            out.append(
                f"{_style.method_html(best)}'s error exceeds Monte Carlo's mean 95% half-width at every σ, so the differences are real, not sampling noise."
            )
        if "softmax" in avg.index and best != "softmax":
            out.append(
                f"{_style.method_html('softmax')} does not depend on σ; its error is {fmt(avg['softmax'] / avg[best])}× that of {_style.method_html(best)} on average."
            )
    return out


def run(results: Results, out: str | Path, *, models: list[str] | None = None) -> Output:
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
    fig = _plot(table, drawn, out / NAME)
    return finish(
        Output(
            name=NAME,
            title=TITLE,
            description=DESCRIPTION,
            tables={NAME: table},
            figures=[fig],
            reading=_reading(table, drawn),
            settings={"models": [r.label for r in drawn]},
        ),
        out,
    )
