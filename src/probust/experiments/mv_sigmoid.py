"""Experiment 4: mv-sigmoid against mvn-cdf on the same z.

The paper's figures "Correlation of mvn-cdf(z) and mv-sigmoid(z)" and "mv-sigmoid's
approximation of mvn-cdf over sigma".

Inputs: runs holding p^taylor and p^taylor_mvs, or p^mmse and p^mmse_mvs at the same N: each pair
applies the two maps to the same standardised margins z (see docs/experiments.md).

Outputs: ``mv_sigmoid.csv``, one row per (model, linearisation, sigma): mean, maximum and signed
difference, share of points where mv-sigmoid is below, Pearson r; ``mv_sigmoid_points.csv``, the
paired values per point; one figure (scatter at one sigma, mean difference over sigma).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "mv_sigmoid"
TITLE = "4. mv-sigmoid against mvn-cdf on the same z"
DESCRIPTION = (
    "mv-sigmoid(z) = 1 / (1 + Σ<sub>i</sub> exp(−z<sub>i</sub>)) against the multivariate normal CDF of the same "
    "standardised margins z (the rows p<sup>taylor_mvs</sup> vs p<sup>taylor</sup>, and p<sup>mmse_mvs</sup> vs "
    "p<sup>mmse</sup> at the same N, which share z). Left: one point per data point at one σ; right: the mean absolute "
    "difference over σ."
)
PAIRS = (("taylor", "taylor_mvs"), ("mmse", "mmse_mvs"))


def pairs_frame(run: Run) -> pd.DataFrame:
    """One row per (index, sigma, pair): the mvn-cdf and mv-sigmoid values on the same z."""
    frames = []
    t = run.table
    for mvn, mvs in PAIRS:
        if not (run.has(mvn) and run.has(mvs)):
            continue
        n = cast(int, run.principal_n(mvs))  # the run has rows of mvs
        a = t[(t["method"] == mvn) & (t["n_samples"] == n)].set_index(["index", "sigma"])["p"]
        b = t[(t["method"] == mvs) & (t["n_samples"] == n)].set_index(["index", "sigma"])["p"]
        both = pd.concat({"mvn_cdf": a, "mv_sigmoid": b}, axis=1, join="inner").reset_index()
        both = both[both["index"].isin(run.core_indices)]
        if both.empty:
            continue
        both.insert(0, "model", run.label)
        both.insert(1, "linearisation", mvn)
        both["n_samples"] = int(n)
        frames.append(both)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summary(pairs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (model, lin, sigma), g in pairs.groupby(["model", "linearisation", "sigma"], sort=False):
        a, b = g["mvn_cdf"].to_numpy(), g["mv_sigmoid"].to_numpy()
        d = b - a
        r = float(np.corrcoef(a, b)[0, 1]) if len(g) > 2 and a.std() > 0 and b.std() > 0 else np.nan
        rows.append(
            {
                "model": model,
                "linearisation": lin,
                "sigma": float(sigma),
                "n_samples": int(g["n_samples"].iloc[0]),
                "n_points": int(len(g)),
                "mean_abs_diff": float(np.abs(d).mean()),
                "max_abs_diff": float(np.abs(d).max()),
                "mean_signed_diff": float(d.mean()),
                "frac_mvs_below": float((d < 0).mean()),
                "pearson_r": r,
            }
        )
    return pd.DataFrame(rows)


def _plot(pairs: pd.DataFrame, table: pd.DataFrame, runs: list[Run], sigma: float, stem: Path) -> Path:
    with style.style_context():
        fig, axes = style.new_figure(1, len(runs) + 1, width=4.0 * (len(runs) + 1) + 0.8, height=4.0)
        for k, run in enumerate(runs):
            ax = axes[0, k]
            g = pairs[(pairs["model"] == run.label) & (pairs["sigma"] == sigma)]
            for lin, mvs in PAIRS:
                h = g[g["linearisation"] == lin]
                if h.empty:
                    continue
                ax.scatter(
                    h["mvn_cdf"],
                    h["mv_sigmoid"],
                    s=9,
                    alpha=0.6,
                    color=style.method_color(mvs),
                    label=f"{style.method_label(mvs)} vs {style.method_label(lin)}",
                )
            ax.plot([0, 1], [0, 1], color="#444444", linewidth=1, linestyle=":", label="y = x")
            ax.set_xlim(-0.02, 1.02)
            ax.set_ylim(-0.02, 1.02)
            ax.set_aspect("equal")
            ax.set_xlabel("mvn-cdf(z)  (probability)")
            ax.set_ylabel("mv-sigmoid(z)  (probability)")
            ax.set_title(f"{run.label}, σ={sigma:g}")
            ax.legend(loc="upper left", frameon=False)
        ax = axes[0, -1]
        styles = {"taylor": "-", "mmse": "--"}
        colors = dict(zip([r.label for r in runs], _colors(len(runs))))
        for run in runs:
            for lin, _ in PAIRS:
                g = table[(table["model"] == run.label) & (table["linearisation"] == lin)].sort_values("sigma")
                if g.empty:
                    continue
                ax.plot(
                    g["sigma"],
                    g["mean_abs_diff"],
                    color=colors[run.label],
                    linestyle=styles[lin],
                    marker="o",
                    label=f"{run.label}, {lin}",
                )
        style.sigma_axis(ax, table["sigma"].unique())
        ax.set_ylabel("mean |mv-sigmoid − mvn-cdf|")
        ax.set_title("difference over σ")
        ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _colors(n: int) -> list:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def _reading(table: pd.DataFrame) -> list[str]:
    out = []
    for (model, lin), g in table.groupby(["model", "linearisation"], sort=False):
        g = g.sort_values("sigma")
        lo, hi = g.iloc[0], g.iloc[-1]
        direction = "below" if g["mean_signed_diff"].mean() < 0 else "above"
        out.append(
            f"<b>{model}</b>, {lin} z: mean |mv-sigmoid − mvn-cdf| is {fmt(lo['mean_abs_diff'])} at σ={lo['sigma']:g} and "
            f"{fmt(hi['mean_abs_diff'])} at σ={hi['sigma']:g} (max {fmt(g['max_abs_diff'].max())}); mv-sigmoid lies {direction} "
            f"the CDF on average (below for {fmt(100 * g['frac_mvs_below'].mean())}% of points), Pearson r between "
            f"{fmt(g['pearson_r'].min())} and {fmt(g['pearson_r'].max())}."
        )
    return out


class MvSigmoid(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *, sigma: float | None = None) -> Output:
        """Compare the two maps on every run holding a (mvn, mv-sigmoid) pair.

        Args:
            sigma: the noise level of the scatter plots (default: the middle of the scored ones).
        """
        out = Path(out)
        frames = [pairs_frame(r) for r in results]
        frames = [f for f in frames if not f.empty]
        if not frames:
            raise ExperimentSkipped("no run holds both taylor and taylor_mvs (or mmse and mmse_mvs) rows")
        pairs = pd.concat(frames, ignore_index=True)
        table = summary(pairs)
        labels = list(dict.fromkeys(pairs["model"]))
        runs = [r for r in results if r.label in labels and r.is_standard] or [r for r in results if r.label in labels]
        sigmas = sorted(pairs["sigma"].unique())
        chosen = float(sigma) if sigma is not None else float(sigmas[len(sigmas) // 2])
        fig = _plot(pairs, table, runs, chosen, out / NAME)
        return self.output(
            out,
            tables={NAME: table, "points": pairs},
            figures=[fig],
            reading=_reading(table[table["model"].isin([r.label for r in runs])]),
            settings={"scatter_sigma": chosen},
        )

    def display(self, output: Output) -> list[Shown]:
        return [("mv-sigmoid vs mvn-cdf on the same z", output.tables.get(self.name, pd.DataFrame()))]


EXPERIMENT = MvSigmoid()
