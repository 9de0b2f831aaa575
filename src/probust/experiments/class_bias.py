"""Experiment 7: robustness bias among classes.

The paper's figure 5 and the appendix figure "Local robustness bias among classes": the
distribution of p_robust over the points of each class (by true label), with Monte Carlo and
MMSE side by side, at every sigma; a Kruskal-Wallis test (scipy.stats.kruskal) of whether the
classes' distributions differ; and the least and most robust classes (by mean p).

Outputs: ``class_bias.csv``, one test per (model, sigma, estimator); ``class_bias_per_class.csv``,
per-class statistics; one figure per model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from probust import plots
from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "class_bias"
TITLE = "7. Robustness bias among classes"
DESCRIPTION = (
    "Per class (true label), the distribution of p<sub>σ</sub><sup>robust</sup> estimated by Monte Carlo and by "
    "p<sup>mmse</sup> side by side, at every σ (boxes: quartiles, whiskers: 5th–95th percentiles, diamonds: means). "
    "A Kruskal–Wallis H test asks whether the classes' distributions differ; the least and most robust classes "
    "are those with the lowest and highest mean p."
)
METHODS = ("mc", "mmse")


def class_table(run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-class statistics, Kruskal-Wallis tests) per (sigma, method)."""
    w = run.wide(core=True)
    names = run.classes
    per_class, tests = [], []
    for sigma, g in w.groupby("sigma"):
        for method in METHODS:
            col = f"p_{method}"
            if col not in g:
                continue
            h = g[g[col].notna()]
            if h.empty:
                continue
            groups = {int(c): v[col].to_numpy() for c, v in h.groupby("label")}
            for c, v in groups.items():
                per_class.append(
                    {
                        "model": run.label,
                        "sigma": float(sigma),
                        "method": method,
                        "class": c,
                        "class_name": names[c] if c < len(names) else str(c),
                        "n": int(v.size),
                        "mean": float(v.mean()),
                        "median": float(np.median(v)),
                        "q25": float(np.quantile(v, 0.25)),
                        "q75": float(np.quantile(v, 0.75)),
                        "frac_below_0.5": float((v < 0.5).mean()),
                    }
                )
            usable = [v for v in groups.values() if v.size > 0]
            h_stat, p_value = np.nan, np.nan
            if len(usable) >= 2:
                try:
                    res = stats.kruskal(*usable)
                    h_stat, p_value = float(res.statistic), float(res.pvalue)
                except ValueError:  # every value identical: no evidence of a difference
                    h_stat, p_value = 0.0, 1.0
            means = {c: float(v.mean()) for c, v in groups.items()}
            least, most = min(means, key=lambda c: means[c]), max(means, key=lambda c: means[c])
            tests.append(
                {
                    "model": run.label,
                    "sigma": float(sigma),
                    "method": method,
                    "n_points": int(len(h)),
                    "n_classes": len(usable),
                    "kruskal_h": h_stat,
                    "p_value": p_value,
                    "least_robust_class": names[least] if least < len(names) else str(least),
                    "least_robust_mean_p": means[least],
                    "most_robust_class": names[most] if most < len(names) else str(most),
                    "most_robust_mean_p": means[most],
                }
            )
    return pd.DataFrame(per_class), pd.DataFrame(tests)


def _plot(run: Run, stem: Path) -> Path:
    """The per-class boxes of :func:`probust.plots.class_bias` on the points scored at every sigma."""
    core = run.table[run.table["index"].isin(run.core_indices)]
    fig = plots.class_bias(
        core,
        methods=[m for m in METHODS if run.has(m)],
        class_names=run.classes,
        title=f"{run.label}: p_robust per class (true label)",
    )
    return style.save_figure(fig, stem)[0]


def _reading(tests: pd.DataFrame) -> list[str]:
    out = []
    for model, g in tests.groupby("model", sort=False):
        g = g.sort_values("sigma")
        method = "mc" if (g["method"] == "mc").any() else g["method"].iloc[0]
        m = g[g["method"] == method]
        sig = m[m["p_value"] < 0.05]
        out.append(
            f"<b>{model}</b>: the classes' p<sup>{method}</sup> distributions differ significantly (Kruskal–Wallis, p &lt; 0.05) at "
            f"{len(sig)} of {len(m)} noise levels"
            + (
                f" (largest σ={m['sigma'].iloc[-1]:g}: H = {fmt(m['kruskal_h'].iloc[-1])}, p = {fmt(m['p_value'].iloc[-1])}, "
                f"{int(m['n_points'].iloc[-1])} points)."
                if len(m)
                else "."
            )
        )
        for r in m.itertuples():
            agree = g[(g["method"] != method) & (g["sigma"] == r.sigma)]
            note = ""
            if len(agree):
                a = agree.iloc[0]
                same = a.least_robust_class == r.least_robust_class and a.most_robust_class == r.most_robust_class
                note = (
                    " (p<sup>mmse</sup> agrees)"
                    if same
                    else f" (p<sup>mmse</sup>: least {a.least_robust_class}, most {a.most_robust_class})"
                )
            out.append(
                f"σ={r.sigma:g}: least robust class {r.least_robust_class} (mean p {fmt(r.least_robust_mean_p)}), most robust "
                f"{r.most_robust_class} (mean p {fmt(r.most_robust_mean_p)}){note}."
            )
    return out


class ClassBias(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *, models: list[str] | None = None) -> Output:
        """Per-class distributions and tests for the standard models (or the ``models`` named)."""
        out = Path(out)
        runs = [results.by_label(m) for m in models] if models else results.standard() or list(results)
        runs = [r for r in runs if r.has("mc") or r.has("mmse")]
        if not runs:
            raise ExperimentSkipped("no run holds mc or mmse rows")
        per_class, tests, figures = [], [], []
        for run_ in runs:
            pc, t = class_table(run_)
            if t.empty:
                continue
            per_class.append(pc)
            tests.append(t)
            figures.append(_plot(run_, out / f"{NAME}_{run_.name}"))
        if not tests:
            raise ExperimentSkipped("no class has scored points")
        tests_t = pd.concat(tests, ignore_index=True)
        return self.output(
            out,
            tables={NAME: tests_t, "per_class": pd.concat(per_class, ignore_index=True)},
            figures=figures,
            reading=_reading(tests_t),
            settings={"models": [r.label for r in runs], "grouping": "true label"},
        )

    def display(self, output: Output) -> list[Shown]:
        view = output.tables.get(self.name, pd.DataFrame()).assign(method=lambda f: "p^" + f["method"])
        return [("Kruskal–Wallis test of a class effect, and the least and most robust classes (by mean p)", view)]

    def summary(self, output: Output, results: Results) -> list[Shown]:
        t = output.table
        view = t[t["method"] == "mc"] if (t["method"] == "mc").any() else t
        view = view[
            [
                "model",
                "sigma",
                "method",
                "least_robust_class",
                "least_robust_mean_p",
                "most_robust_class",
                "most_robust_mean_p",
                "p_value",
            ]
        ]
        return [
            (
                "Least and most robust classes (experiment 7; p value: Kruskal–Wallis)",
                view.assign(method=lambda f: "p^" + f["method"]),
            )
        ]


EXPERIMENT = ClassBias()
