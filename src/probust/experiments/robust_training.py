"""Experiment 11: training for average-case robustness against gradient-norm regularisation.

Not in the paper: its section 5 suggests training for average-case robustness directly. A model
trained with :class:`probust.RobustLoss` (cross-entropy + mu * mean -log p_robust) is compared
with the plain model and with the gradient-norm family (the same recipe with lambda > 0), all
measured the same way: Monte Carlo p_robust on the same test points at the same sigmas.

A robust model buys robustness with accuracy, so comparing it with one lambda says little; it is
compared with the gradient-norm family *at matched accuracy*: the family's (test accuracy, median
p_robust) points, plain model included, are reduced to its frontier (the members no other member
beats on both accuracy and median: the trade-offs one would choose), sorted by accuracy and
linearly interpolated at the robust model's accuracy (below the frontier's least accurate member
but within the family's range, that member's median: it is more accurate and as robust). Uncertainty: every median carries a bootstrap 95% interval over the
points (seeded); the gain over the plain model and the advantage over the interpolated family
are bootstrapped *paired* (the same resampled points for every model), so the intervals reflect
that the models are scored on the same images. Test accuracies are taken as exact (they come
from the whole test split).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt, pct
from probust.experiments.robust_training_tables import (
    comparisons,
    frontier_mask,
    group_label,
    group_tables,
    short_label,
)
from probust.experiments.runs import Results

NAME = "robust_training"
TITLE = "11. Robust training (RobustLoss) against gradient-norm regularisation at matched accuracy"
DESCRIPTION = (
    "Models trained with the robust loss CE + μ·mean(−log p<sub>robust</sub>) (<code>probust train --robust-loss μ "
    "--robust-sigma σ</code>) against the plain model and the gradient-norm family (the same recipe with λ &gt; 0), on "
    "the same test points: median and mean p<sup>mc</sup> at each σ (error bars: bootstrap 95% interval of the median), "
    "the gain over the plain model and the accuracy cost. At matched accuracy: the family's median p<sup>mc</sup> "
    "linearly interpolated, over the (test accuracy, median) points of its frontier (members no other member beats on both), "
    "at the robust model's accuracy "
    "(dotted in the figure); the intervals of the gain and of the advantage are paired bootstraps over the points."
)

# -- figure ----------------------------------------------------------------------------------------


def _plot(table: pd.DataFrame, matched: pd.DataFrame, group: dict, stem: Path) -> Path:
    sigmas = sorted(table["sigma"].unique())
    ncols = min(4, len(sigmas))
    nrows = math.ceil(len(sigmas) / ncols)
    robust_markers = ["*", "D", "P", "X", "v", "^"]
    robust_colors = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#ff7f0e", "#17becf"]
    with style.style_context():
        fig, axes = style.new_figure(nrows, ncols, width=4.3 * ncols + 0.5, height=3.6 * nrows + 0.6)
        for k, sigma in enumerate(sigmas):
            ax = axes[k // ncols, k % ncols]
            t = table[table["sigma"] == sigma]
            fam = (
                t[t["kind"] != "robust-loss"]
                .dropna(subset=["test_accuracy"])
                .sort_values(["test_accuracy", "grad_reg"])
            )
            yerr = [fam["median_p"] - fam["median_ci_low"], fam["median_ci_high"] - fam["median_p"]]
            ax.errorbar(
                100 * fam["test_accuracy"],
                fam["median_p"],
                yerr=yerr,
                color="#1f77b4",
                marker="o",
                capsize=2.5,
                linestyle="none",
                label="gradient-norm family",
            )
            front = fam[frontier_mask(fam["test_accuracy"], fam["median_p"])]
            ax.plot(
                100 * front["test_accuracy"],
                front["median_p"],
                color="#1f77b4",
                linewidth=1.2,
                label="its frontier (interpolated)",
            )
            span = max(float(100 * (t["test_accuracy"].max() - t["test_accuracy"].min())), 1e-9)
            placed: list[float] = []
            for row in fam.itertuples():
                # labels of points close in accuracy are stacked instead of drawn over each other
                x = 100 * row.test_accuracy
                j = sum(abs(x - other) < 0.06 * span for other in placed)
                placed.append(x)
                ax.annotate(
                    row.short,
                    (x, row.median_p),
                    textcoords="offset points",
                    xytext=(4, -10 - 9 * j),
                    fontsize=7,
                    color="#1f77b4",
                )
            pl = fam[fam["kind"] == "plain"]
            ax.plot(
                100 * pl["test_accuracy"],
                pl["median_p"],
                linestyle="none",
                marker="s",
                markersize=8,
                markerfacecolor="white",
                markeredgecolor="black",
                label="plain model",
                zorder=3,
            )
            rob = t[t["kind"] == "robust-loss"].dropna(subset=["test_accuracy"])
            for i, row in enumerate(rob.itertuples()):
                c, m = robust_colors[i % len(robust_colors)], robust_markers[i % len(robust_markers)]
                ax.errorbar(
                    [100 * row.test_accuracy],
                    [row.median_p],
                    yerr=[[row.median_p - row.median_ci_low], [row.median_ci_high - row.median_p]],
                    color=c,
                    marker=m,
                    markersize=10 if m == "*" else 7,
                    capsize=2.5,
                    linestyle="none",
                    label=row.short,
                    zorder=4,
                )
                ax.annotate(
                    f"μ={row.robust_mu:g}",
                    (100 * row.test_accuracy, row.median_p),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=8,
                    color=c,
                )
                mrow = matched[(matched["model"] == row.model) & (matched["sigma"] == sigma)]
                if len(mrow) and np.isfinite(mrow["matched_median_p"].iloc[0]):
                    y = float(mrow["matched_median_p"].iloc[0])
                    ax.plot([100 * row.test_accuracy] * 2, [row.median_p, y], color=c, linestyle=":", linewidth=1)
                    ax.plot(
                        [100 * row.test_accuracy],
                        [y],
                        marker="o",
                        markerfacecolor="white",
                        markeredgecolor=c,
                        linestyle="none",
                        zorder=4,
                    )
            ax.set_xlabel("test accuracy (%)")
            ax.set_ylabel(f"median {style.method_label('mc')}")
            ax.set_title(f"σ = {sigma:g}")
            if k == 0:
                ax.legend(frameon=False, fontsize=7, loc="best")
        for k in range(len(sigmas), nrows * ncols):
            axes[k // ncols, k % ncols].set_visible(False)
        plain = group["plain"]
        n = int(table["n_points"].iloc[0])
        fig.suptitle(
            f"{group_label(plain)}: median p_robust (Monte Carlo, {n} test points) against test accuracy; "
            "open circles: the family interpolated at the robust model's accuracy",
            y=1.0,
            fontsize=10,
        )
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


# -- reading ---------------------------------------------------------------------------------------


def _points(value: float) -> str:
    return f"{100 * abs(value):.1f} accuracy point{'s' if round(100 * abs(value), 1) != 1 else ''}"


def _reading(table: pd.DataFrame, matched: pd.DataFrame, group: dict) -> list[str]:
    out = []
    plain = group["plain"]
    sigmas = sorted(table["sigma"].unique())
    for r in group["robust"]:
        m = matched[matched["model"] == r.label].set_index("sigma")
        t = table[table["model"] == r.label].set_index("sigma")
        tp = table[table["model"] == plain.label].set_index("sigma")
        # the headline noise level: the one trained for if scored, else the one with the most room
        if r.robust_sigma is not None and any(math.isclose(r.robust_sigma, s) for s in sigmas):
            sigma = next(s for s in sigmas if math.isclose(r.robust_sigma, s))
        else:
            sigma = float(tp["median_p"].idxmin())
        row, mrow, prow = t.loc[sigma], m.loc[sigma], tp.loc[sigma]
        name = short_label(r)
        verb = "raises" if row["gain_median"] > 0 else "lowers" if row["gain_median"] < 0 else "leaves"
        cost = row["accuracy_cost"]
        if not np.isfinite(cost):
            cost_text = "with no test accuracy recorded"
        elif cost > 0:
            cost_text = f"at a cost of {_points(cost)} ({pct(prow['test_accuracy'])} → {pct(row['test_accuracy'])})"
        elif cost < 0:
            cost_text = f"while gaining {_points(cost)} ({pct(prow['test_accuracy'])} → {pct(row['test_accuracy'])})"
        else:
            cost_text = f"at the same accuracy ({pct(row['test_accuracy'])})"
        gain_ci = f"gain {row['gain_median']:+.3f}, 95% CI {row['gain_ci_low']:+.3f} to {row['gain_ci_high']:+.3f}"
        change = (
            f"from {fmt(prow['median_p'])} (plain) to {fmt(row['median_p'])}"
            if verb != "leaves"
            else f"at {fmt(row['median_p'])}, the plain model's value"
        )
        text = (
            f"At σ = {sigma:g}, {name} {verb} the median p<sup>mc</sup> {change} "
            f"({gain_ci}; mean {fmt(prow['mean_p'])} → {fmt(row['mean_p'])}) {cost_text}; "
        )
        if mrow["in_range"]:
            verdict = {
                "robust loss higher": f"the robust loss is ahead by {mrow['advantage']:+.3f}",
                "gradient-norm higher": f"gradient-norm regularisation is ahead by {-mrow['advantage']:+.3f}",
                "no clear difference": f"no clear difference ({mrow['advantage']:+.3f})",
            }[mrow["verdict"]]
            text += (
                f"gradient-norm regularisation at the same accuracy reaches {fmt(mrow['matched_median_p'])} (interpolated between "
                f"{mrow['matched_between']}): {verdict}, 95% CI {mrow['advantage_ci_low']:+.3f} to {mrow['advantage_ci_high']:+.3f}."
            )
        else:
            side = "above" if row["test_accuracy"] > mrow["family_accuracy_max"] else "below"
            text += (
                f"its accuracy lies {side} the range of the gradient-norm family ({pct(mrow['family_accuracy_min'])} to "
                f"{pct(mrow['family_accuracy_max'])}), so there is no matched value; the nearest in accuracy, {mrow['nearest_short']} "
                f"({pct(mrow['nearest_accuracy'])}), reaches {fmt(mrow['nearest_median_p'])}"
            )
            fam = table[(table["sigma"] == sigma) & (table["kind"] != "robust-loss")]
            best = fam.sort_values(["median_p", "test_accuracy"], ascending=False).iloc[0]
            if best["short"] != mrow["nearest_short"]:
                text += f", the most robust, {best['short']} ({pct(best['test_accuracy'])}), {fmt(best['median_p'])}"
            text += "."
        if mrow["dominated_by"]:
            who = mrow["dominated_by"].split("; ")
            verb = "is" if len(who) == 1 else "are each"
            text += (
                f" {' and '.join(who)} {verb} at least as accurate and at least as robust (median) as {name} at this σ."
            )
        elif mrow["dominates_all"]:
            text += f" At this σ {name} is at least as accurate and at least as robust (median) as every model of the family, plain included."
        elif mrow["dominates"]:
            text += f" It is at least as accurate and at least as robust (median) as {', '.join(mrow['dominates'].split('; '))}."
        out.append(text)
        # over every sigma
        verdicts = m["verdict"]
        ahead = [s for s in sigmas if verdicts[s] == "robust loss higher"]
        behind = [s for s in sigmas if verdicts[s] == "gradient-norm higher"]
        level = [s for s in sigmas if verdicts[s] == "no clear difference"]
        outside = [s for s in sigmas if verdicts[s] == "outside the family's accuracy range"]
        if len(sigmas) > 1 and not outside:
            parts = []
            for group_, words in ((ahead, "ahead of"), (behind, "behind"), (level, "level with (interval covering 0)")):
                if group_:
                    parts.append(f"{words} the family at σ = {', '.join(f'{s:g}' for s in group_)}")
            adv = ", ".join(f"{m.loc[s, 'advantage']:+.3f}" for s in sigmas)
            out.append(
                f"Over all σ, {name} is " + "; ".join(parts) + f" (median advantage at matched accuracy, σ = "
                f"{', '.join(f'{s:g}' for s in sigmas)}: {adv})."
            )
        saturated = [s for s in sigmas if min(tp.loc[s, "median_p"], t.loc[s, "median_p"]) >= 0.99]
        if saturated:
            out.append(
                f"At σ = {', '.join(f'{s:g}' for s in saturated)} the median p<sup>mc</sup> is already ≥ 0.99 for the plain and the "
                f"robust model, so the median cannot tell them apart there; the mean (table) still can."
            )
    return out


# -- the experiment --------------------------------------------------------------------------------


class RobustTraining(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *, n_boot: int = 2000, seed: int = 0) -> Output:
        """Tables, figure and reading for every group of a plain model, its gradient-norm family and
        the RobustLoss models trained with the same recipe.

        Args:
            results: the runs.
            out: the folder for ``robust_training.csv``, ``robust_training_matched.csv`` and figures.
            n_boot: bootstrap resamples of the points for the intervals.
            seed: seed of the bootstrap.

        The main table has one row per model and sigma: group, model, short (its name in the group),
        kind (plain / grad-norm / robust-loss), grad_reg, robust_mu, robust_sigma, sigma, n_points
        (the points every model of the group scored at every common sigma), mc_n, test_accuracy,
        accuracy_cost (plain's accuracy minus the model's, as a fraction), median_p, median_ci_low,
        median_ci_high, mean_p, gain_median (over plain) with gain_ci_low/high, gain_mean. The
        ``matched`` table has one row per RobustLoss model and sigma: its accuracy and median, the
        family's accuracy range, in_range, matched_median_p (the family interpolated at the model's
        accuracy) and matched_between (the two family members around it), advantage (model minus
        matched) with its interval, verdict, the nearest family member in accuracy (nearest_*), and
        dominated_by (gradient-norm models at least as accurate and as robust).
        """
        out = Path(out)
        groups = comparisons(results)
        tables, matched_tables, reading = [], [], []
        figures: list[Path] = []
        skipped = []
        for group in groups:
            try:
                table, matched = group_tables(group, n_boot=n_boot, seed=seed)
            except ExperimentSkipped as exc:
                skipped.append(str(exc))
                continue
            tables.append(table)
            matched_tables.append(matched)
            figures.append(_plot(table, matched, group, out / (NAME if not figures else f"{NAME}_{len(figures) + 1}")))
            reading += _reading(table, matched, group)
        if not tables:
            raise ExperimentSkipped("; ".join(skipped))
        return self.output(
            out,
            tables={
                NAME: pd.concat(tables, ignore_index=True),
                "matched": pd.concat(matched_tables, ignore_index=True),
            },
            figures=figures,
            reading=reading,
            settings={
                "groups": [
                    {
                        "plain": g["plain"].label,
                        "grad_norm": [r.label for r in g["grad_norm"]],
                        "robust": [r.label for r in g["robust"]],
                    }
                    for g in groups
                ],
                "n_boot": n_boot,
                "seed": seed,
                "skipped_groups": skipped,
            },
        )

    def display(self, output: Output) -> list[Shown]:
        t = output.tables
        main = t.get(self.name, pd.DataFrame())
        view = main[
            [
                "model",
                "sigma",
                "test_accuracy",
                "accuracy_cost",
                "median_p",
                "median_ci_low",
                "median_ci_high",
                "mean_p",
                "gain_median",
                "gain_ci_low",
                "gain_ci_high",
            ]
        ]
        matched = t.get("matched", pd.DataFrame())
        cols = [
            "model",
            "sigma",
            "test_accuracy",
            "median_p",
            "matched_median_p",
            "matched_between",
            "advantage",
            "advantage_ci_low",
            "advantage_ci_high",
            "verdict",
            "nearest_short",
            "nearest_accuracy",
            "nearest_median_p",
        ]
        return [
            (
                "Median and mean p<sup>mc</sup> of each model, its gain over the plain model (paired bootstrap 95% CI) and its accuracy cost",
                view,
            ),
            (
                "At matched accuracy: the gradient-norm family interpolated at the robust model's accuracy",
                matched[[c for c in cols if c in matched]],
            ),
        ]


EXPERIMENT = RobustTraining()
