"""Experiment 5: softmax confidence against p_robust, for models of increasing robustness.

The paper's figure "Relationship between p_robust and p_softmax".

Inputs: runs holding softmax and p^mmse (or p^mc) rows; a family of models trained with
increasing gradient-norm regularisation lambda where there is one.

Outputs: ``softmax_correlation.csv``, one row per (model, sigma, estimator of p_robust): Pearson
(values, computed with numpy) and Spearman (average ranks) correlation between the softmax
probability of the prediction and p_robust, with the means; one figure (scatters, and the
correlation against lambda or sigma).
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

NAME = "softmax_correlation"
TITLE = "5. Softmax probability against p_robust"
DESCRIPTION = (
    "Pearson (linear) and Spearman (rank) correlation, over the scored points, between p<sup>softmax</sup> "
    "(the softmax probability of the predicted class) and p<sub>σ</sub><sup>robust</sup> estimated by p<sup>mmse</sup> "
    "(and p<sup>mc</sup>), at each σ, for every model; for a family of models trained with increasing gradient-norm "
    "regularisation λ, the correlation as a function of λ, with scatter plots for the least and most regularised."
)


def pearson(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        return np.nan
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / np.sqrt((a @ a) * (b @ b)))


def spearman(a, b) -> float:
    ra = pd.Series(np.asarray(a, dtype=np.float64)).rank(method="average").to_numpy()
    rb = pd.Series(np.asarray(b, dtype=np.float64)).rank(method="average").to_numpy()
    return pearson(ra, rb)


def correlation_table(run: Run) -> pd.DataFrame:
    """Per (sigma, estimator of p_robust): correlations with softmax on the run's core points."""
    w = run.wide(core=True)
    rows = []
    for sigma, g in w.groupby("sigma"):
        for method in ("mmse", "mc"):
            col = f"p_{method}"
            if col not in g:
                continue
            h = g[g[col].notna()]
            if len(h) < 3:
                continue
            rows.append(
                {
                    "model": run.label,
                    "dataset": run.dataset,
                    "arch": run.arch,
                    "grad_reg": run.grad_reg,
                    "test_accuracy": run.test_accuracy,
                    "sigma": float(sigma),
                    "p_robust": method,
                    "n_samples": int(cast(int, run.principal_n(method))),  # the run has rows of method
                    "n_points": int(len(h)),
                    "pearson": pearson(h["softmax"], h[col]),
                    "spearman": spearman(h["softmax"], h[col]),
                    "mean_softmax": float(h["softmax"].mean()),
                    "mean_p": float(h[col].mean()),
                }
            )
    return pd.DataFrame(rows)


def _scatter(ax, run: Run, sigma: float) -> None:
    w = run.wide(core=True)
    g = w[(w["sigma"] == sigma) & w["p_mmse"].notna()] if "p_mmse" in w else w.iloc[:0]
    ax.scatter(g["softmax"], g["p_mmse"], s=9, alpha=0.6, color=style.method_color("mmse"))
    ax.plot([0, 1], [0, 1], color="#444444", linewidth=1, linestyle=":")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"{style.method_label('softmax')} (softmax probability)")
    ax.set_ylabel(f"{style.method_label('mmse')} at σ={sigma:g} (probability)")
    r = pearson(g["softmax"], g["p_mmse"]) if len(g) else np.nan
    rho = spearman(g["softmax"], g["p_mmse"]) if len(g) else np.nan
    ax.set_title(f"{run.label}\nPearson {r:.2f}, Spearman {rho:.2f}")


def _plot(table: pd.DataFrame, results: Results, family: list[Run] | None, sigma: float, stem: Path) -> Path:
    with style.style_context():
        if family:
            fig, axes = style.new_figure(1, 3, width=13.2, height=4.3)
            _scatter(axes[0, 0], family[0], sigma)
            _scatter(axes[0, 2], family[-1], sigma)
            ax = axes[0, 1]
            t = table[table["model"].isin([r.label for r in family]) & (table["p_robust"] == "mmse")]
            lambdas = [r.grad_reg for r in family]
            x = {lam: i for i, lam in enumerate(lambdas)}
            sig = sorted(t["sigma"].unique())
            cmap = __import__("matplotlib.pyplot", fromlist=["get_cmap"]).get_cmap("plasma")
            for k, s in enumerate(sig):
                g = t[t["sigma"] == s].sort_values("grad_reg")
                c = cmap(0.1 + 0.75 * k / max(len(sig) - 1, 1))
                ax.plot([x[v] for v in g["grad_reg"]], g["pearson"], color=c, marker="o", label=f"σ={s:g} Pearson")
                ax.plot(
                    [x[v] for v in g["grad_reg"]],
                    g["spearman"],
                    color=c,
                    marker="s",
                    linestyle="--",
                    label=f"σ={s:g} Spearman",
                )
            ax.set_xticks(range(len(lambdas)))
            ax.set_xticklabels([style.lambda_label(v) for v in lambdas])
            ax.set_xlabel("gradient-norm regularisation λ (training)")
            ax.set_ylabel(f"correlation of {style.method_label('softmax')} and {style.method_label('mmse')}")
            ax.set_title("correlation vs model robustness")
            ax.legend(frameon=False, fontsize=7.5, ncol=2)
        else:
            runs = [r for r in results if (table["model"] == r.label).any()][:3]
            fig, axes = style.new_figure(1, len(runs) + 1, height=4.3)
            for k, run in enumerate(runs):
                _scatter(axes[0, k], run, sigma)
            ax = axes[0, -1]
            for run in runs:
                g = table[(table["model"] == run.label) & (table["p_robust"] == "mmse")].sort_values("sigma")
                line = ax.plot(g["sigma"], g["pearson"], marker="o", label=f"{run.label} Pearson")[0]
                ax.plot(
                    g["sigma"],
                    g["spearman"],
                    marker="s",
                    linestyle="--",
                    color=line.get_color(),
                    label=f"{run.label} Spearman",
                )
            style.sigma_axis(ax, table["sigma"].unique())
            ax.set_ylabel("correlation")
            ax.set_title("correlation over σ")
            ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame, family: list[Run] | None, sigma: float) -> list[str]:
    out = []
    t = table[table["p_robust"] == "mmse"]
    for model, g in t.groupby("model", sort=False):
        g = g.sort_values("sigma")
        out.append(
            f"<b>{model}</b>: Pearson {fmt(g['pearson'].min())} to {fmt(g['pearson'].max())}, Spearman {fmt(g['spearman'].min())} "
            f"to {fmt(g['spearman'].max())} between p<sup>softmax</sup> and p<sup>mmse</sup> over σ ∈ [{g['sigma'].min():g}, {g['sigma'].max():g}]."
        )
    if family:
        g = t[t["model"].isin([r.label for r in family]) & (t["sigma"] == sigma)].sort_values("grad_reg")
        if len(g) >= 2:
            trend = np.sign(np.diff(g["spearman"].to_numpy()))
            shape = "rises" if (trend > 0).all() else "falls" if (trend < 0).all() else "does not change monotonically"
            out.append(
                f"At σ={sigma:g}, the Spearman correlation {shape} with λ: "
                + ", ".join(f"{fmt(r.spearman)} at {style.lambda_label(r.grad_reg)}" for r in g.itertuples())
                + " (the paper: it rises with robustness but stays mild)."
            )
    strongest = t["spearman"].max() if len(t) else np.nan
    if np.isfinite(strongest):
        strength = "weak" if strongest < 0.4 else "moderate" if strongest < 0.7 else "strong"
        out.append(f"The strongest rank correlation anywhere is {fmt(strongest)} ({strength}).")
    return out


class SoftmaxCorrelation(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *, sigma: float | None = None) -> Output:
        """Correlations for every run with softmax and MMSE (or MC) rows.

        Args:
            sigma: the noise level of the scatter plots and the family comparison (default: the
                middle of the scored ones).
        """
        out = Path(out)
        parts = [correlation_table(r) for r in results]
        parts = [p for p in parts if not p.empty]
        if not parts:
            raise ExperimentSkipped("no run holds p_robust (mmse or mc) rows for at least 3 points")
        table = pd.concat(parts, ignore_index=True)
        families = [f for f in results.families() if all((table["model"] == r.label).any() for r in f)]
        family = families[0] if families else None
        sigmas = sorted(table["sigma"].unique())
        chosen = float(sigma) if sigma is not None else float(sigmas[len(sigmas) // 2])
        fig = _plot(table, results, family, chosen, out / NAME)
        return self.output(
            out,
            tables={NAME: table},
            figures=[fig],
            reading=_reading(table, family, chosen),
            settings={"scatter_sigma": chosen, "family": [r.label for r in family] if family else None},
        )

    def display(self, output: Output) -> list[Shown]:
        main = output.tables.get(self.name, pd.DataFrame())
        view = main[
            ["model", "grad_reg", "sigma", "p_robust", "n_points", "pearson", "spearman", "mean_softmax", "mean_p"]
        ]
        return [("Correlation of p<sup>softmax</sup> with p<sup>robust</sup>", view)]


EXPERIMENT = SoftmaxCorrelation()
