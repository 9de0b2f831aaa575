"""Experiment 6: estimation error for a family of models of increasing robustness.

The paper's figure 1b and the appendix figure "Accuracy of p_robust estimators over sigma for
robust models".

Inputs: families of models of one recipe trained with different gradient-norm regularisation
lambda (at least two per family), each with Monte Carlo rows.

Outputs: ``robust_models.csv``, experiment 1's error table for every member, with its family;
one figure per family (errors of p^mmse and p^taylor over sigma per lambda, and mean p^mc).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import error_table, fmt, pct, sort_by_method
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "robust_models"
TITLE = "6. Estimation error for models of increasing robustness (λ)"
DESCRIPTION = (
    "For a family of models trained alike except for the gradient-norm regularisation weight λ, the mean absolute "
    "error against Monte Carlo of p<sup>mmse</sup> and p<sup>taylor</sup> over σ (error bars: ± one standard error), "
    "and the mean p<sup>mc</sup> itself (how robust each model is)."
)


def _family_label(family: list[Run]) -> str:
    r = family[0]
    return r.default_label().split(",")[0]


def _plot(table: pd.DataFrame, family: list[Run], stem: Path) -> Path:
    colors = style.lambda_colors([cast(float, r.grad_reg) for r in family])  # a family member has its λ
    panels = [m for m in ("mmse", "taylor") if (table["method"] == m).any()]
    with style.style_context():
        fig, axes = style.new_figure(1, len(panels) + 1, height=4.0)
        for k, method in enumerate(panels):
            ax = axes[0, k]
            t = table[table["method"] == method]
            floor = style.log_floor(t["mean_abs_error"].tolist() + t["mc_mean_half_width"].tolist())
            for run in family:
                g = t[t["model"] == run.label].sort_values("sigma")
                if g.empty:
                    continue
                acc = f", acc {pct(run.test_accuracy)}" if run.test_accuracy is not None else ""
                ax.errorbar(
                    g["sigma"],
                    g["mean_abs_error"],
                    yerr=g["sem_abs_error"],
                    color=colors[cast(float, run.grad_reg)],
                    marker="o",
                    capsize=2.5,
                    label=f"{style.lambda_label(run.grad_reg)}{acc}",
                )
                ax.plot(
                    g["sigma"],
                    g["mc_mean_half_width"],
                    color=colors[cast(float, run.grad_reg)],
                    linestyle=":",
                    linewidth=1,
                )
            style.log_y(ax, floor)
            style.sigma_axis(ax, t["sigma"].unique())
            ax.set_ylabel(f"mean |{style.method_label(method)} − {style.method_label('mc')}|")
            ax.set_title(f"{style.method_label(method)} error (dotted: MC 95% half-width)")
            ax.legend(frameon=False, fontsize=8)
        ax = axes[0, -1]
        t = table[table["method"] == panels[0]]
        for run in family:
            g = t[t["model"] == run.label].sort_values("sigma")
            ax.plot(
                g["sigma"],
                g["mean_p_mc"],
                color=colors[cast(float, run.grad_reg)],
                marker="s",
                label=style.lambda_label(run.grad_reg),
            )
        style.sigma_axis(ax, t["sigma"].unique())
        ax.set_ylabel(f"mean {style.method_label('mc')} (probability)")
        ax.set_title("robustness of each model")
        ax.legend(frameon=False, fontsize=8)
        fig.suptitle(f"{_family_label(family)}: models trained with increasing λ", y=1.02)
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame, family: list[Run]) -> list[str]:
    out: list[str] = []
    t = table[table["method"] == "mmse"]
    if t.empty:
        return out
    lo, hi = family[0], family[-1]
    sigmas = sorted(t["sigma"].unique())
    e = t.pivot_table(index="sigma", columns="grad_reg", values="mean_abs_error")
    p = t.pivot_table(index="sigma", columns="grad_reg", values="mean_p_mc")
    better = [s for s in sigmas if e.loc[s, hi.grad_reg] < e.loc[s, lo.grad_reg]]
    out.append(
        f"p<sup>mmse</sup>'s mean |error| is lower for {style.lambda_label(hi.grad_reg)} than for {style.lambda_label(lo.grad_reg)} "
        f"at {len(better)} of {len(sigmas)} noise levels; at σ={sigmas[-1]:g}: "
        + ", ".join(f"{fmt(e.loc[sigmas[-1], r.grad_reg])} ({style.lambda_label(r.grad_reg)})" for r in family)
        + "."
    )
    rho = []
    for s in sigmas:
        col = e.loc[s, [r.grad_reg for r in family]].to_numpy()
        rho.append(np.corrcoef(np.arange(len(col)), pd.Series(col).rank().to_numpy())[0, 1] if len(col) > 2 else np.nan)
    out.append(
        f"Mean p<sup>mc</sup> at σ={sigmas[-1]:g} goes from {fmt(p.loc[sigmas[-1], lo.grad_reg])} ({style.lambda_label(lo.grad_reg)}) to "
        f"{fmt(p.loc[sigmas[-1], hi.grad_reg])} ({style.lambda_label(hi.grad_reg)}); test accuracy from "
        f"{pct(lo.test_accuracy)} to {pct(hi.test_accuracy)}."
    )
    rho = [v for v in rho if np.isfinite(v)]
    if rho:
        out.append(
            f"Rank correlation between λ and p<sup>mmse</sup>'s error, averaged over σ: {fmt(float(np.mean(rho)))} "
            f"(negative: more robust models are estimated more accurately, as in the paper)."
        )
    return out


class RobustModels(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path) -> Output:
        """Error tables and figure for each family of models that differ only in lambda."""
        out = Path(out)
        families = [[r for r in f if r.has("mc")] for f in results.families()]
        families = [f for f in families if len(f) >= 2]
        if not families:
            raise ExperimentSkipped(
                "no family of models trained alike with at least two values of λ (and Monte Carlo rows): train e.g. "
                "probust train --grad-reg 0 / 1e-4 / 1e-3 / 1e-2 and score each model"
            )
        tables, figures, reading = [], [], []
        for k, family in enumerate(families):
            t = pd.concat([error_table(r) for r in family], ignore_index=True)
            t.insert(0, "family", _family_label(family))
            tables.append(t)
            figures.append(_plot(t, family, out / (NAME if k == 0 else f"{NAME}_{k + 1}")))
            reading += _reading(t, family)
        table = pd.concat(tables, ignore_index=True)
        return self.output(
            out,
            tables={NAME: table},
            figures=figures,
            reading=reading,
            settings={"families": [[r.label for r in f] for f in families]},
        )

    def display(self, output: Output) -> list[Shown]:
        main = output.tables.get(self.name, pd.DataFrame())
        view = main[main["method"].isin(["mmse", "taylor"])][
            [
                "model",
                "grad_reg",
                "sigma",
                "method",
                "mean_abs_error",
                "sem_abs_error",
                "mean_p_mc",
                "mc_mean_half_width",
            ]
        ]
        return [
            (
                "Errors of p<sup>mmse</sup> and p<sup>taylor</sup> for each λ",
                sort_by_method(view).assign(method=lambda f: "p^" + f["method"]),
            )
        ]


EXPERIMENT = RobustModels()
