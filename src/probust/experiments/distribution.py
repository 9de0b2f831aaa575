"""Experiment 10: distribution of p_robust over sigma for every model, and the models' table.

The paper's appendix figure "Distribution of p_robust over sigma" (as noise grows p_robust
falls, and p^mmse tracks p^mc) and table "Test set accuracy of models" (data set, architecture,
lambda, test accuracy), read from the checkpoints' metadata recorded with the results.

Outputs: ``distribution.csv``, quantiles of p per (model, sigma, estimator), and
``distribution_models.csv``, one row per model; one figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from probust import plots
from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt, pct
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "distribution"
TITLE = "10. Distribution of p_robust over σ, and the models"
DESCRIPTION = (
    "For every model, the distribution over the scored points of p<sub>σ</sub><sup>robust</sup> estimated by Monte "
    "Carlo and by p<sup>mmse</sup>, side by side at each σ (boxes: quartiles, whiskers: 5th–95th percentiles, "
    "diamonds: means); and the models: data set, architecture, regularisation λ and test accuracy, from each "
    "checkpoint's metadata."
)
METHODS = ("mc", "mmse")


def distribution_table(run: Run) -> pd.DataFrame:
    w = run.wide(core=True)
    rows = []
    for sigma, g in w.groupby("sigma"):
        for method in METHODS:
            col = f"p_{method}"
            if col not in g:
                continue
            v = g[col].dropna().to_numpy()
            if v.size == 0:
                continue
            q = np.quantile(v, [0.05, 0.25, 0.5, 0.75, 0.95])
            rows.append(
                {
                    "model": run.label,
                    "sigma": float(sigma),
                    "method": method,
                    "n_samples": int(cast(int, run.principal_n(method))),  # the run has rows of method
                    "n_points": int(v.size),
                    "mean": float(v.mean()),
                    "q05": q[0],
                    "q25": q[1],
                    "median": q[2],
                    "q75": q[3],
                    "q95": q[4],
                    "frac_below_0.5": float((v < 0.5).mean()),
                    "frac_above_0.99": float((v > 0.99).mean()),
                }
            )
    return pd.DataFrame(rows)


def models_table(results: Results) -> pd.DataFrame:
    rows = []
    for r in results:
        meta = r.meta
        counts = {m: r.sample_counts(m) for m in ("mc", "mmse") if r.has(m)}
        rows.append(
            {
                "model": r.label,
                "dataset": r.dataset,
                "architecture": r.arch,
                "lambda": r.grad_reg,
                "robust_loss_mu": r.robust_loss,
                "robust_loss_sigma": r.robust_sigma,
                "test_accuracy": r.test_accuracy,
                "epochs": meta.get("epochs_completed", meta.get("epochs")),
                "train_size": meta.get("train_size"),
                "seed": meta.get("seed"),
                "points_scored": int(r.table["index"].nunique()),
                "sigmas": " ".join(f"{s:g}" for s in r.sigmas),
                "methods": " ".join(style.order_methods(r.methods)),
                "mc_n": " ".join(str(n) for n in counts.get("mc", [])),
                "mmse_n": " ".join(str(n) for n in counts.get("mmse", [])),
                "checkpoint": r.model_source or "",
                "results": str(r.path),
            }
        )
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, runs: list[Run], stem: Path) -> Path:
    ncols = min(3, len(runs))
    nrows = math.ceil(len(runs) / ncols)
    with style.style_context():
        fig, axes = style.new_figure(nrows, ncols, width=4.6 * ncols + 0.4, height=3.4 * nrows + 0.4)
        for k, run in enumerate(runs):
            ax = axes[k // ncols, k % ncols]
            core = run.table[run.table["index"].isin(run.core_indices)]
            acc = f", acc {pct(run.test_accuracy)}" if run.test_accuracy is not None else ""
            plots.over_sigma(core, methods=[m for m in METHODS if run.has(m)], title=f"{run.label}{acc}", ax=ax)
        for k in range(len(runs), nrows * ncols):
            axes[k // ncols, k % ncols].set_axis_off()
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame, models: pd.DataFrame) -> list[str]:
    out = []
    for model, g in table.groupby("model", sort=False):
        mc = g[g["method"] == "mc"].sort_values("sigma")
        mm = g[g["method"] == "mmse"].sort_values("sigma")
        ref = mc if len(mc) else mm
        name = "p<sup>mc</sup>" if len(mc) else "p<sup>mmse</sup>"
        falling = bool(np.all(np.diff(ref["mean"].to_numpy()) <= 1e-12))
        text = (
            f"<b>{model}</b>: mean {name} {'falls' if falling else 'changes'} from {fmt(ref['mean'].iloc[0])} at σ={ref['sigma'].iloc[0]:g} "
            f"to {fmt(ref['mean'].iloc[-1])} at σ={ref['sigma'].iloc[-1]:g}"
        )
        if len(mc) and len(mm):
            gap = np.abs(mc.set_index("sigma")["mean"] - mm.set_index("sigma")["mean"]).max()
            text += f"; p<sup>mmse</sup>'s mean differs from p<sup>mc</sup>'s by at most {fmt(gap)}"
        out.append(text + ".")
    acc = models.dropna(subset=["test_accuracy"])
    if len(acc):
        out.append("Test accuracy: " + ", ".join(f"{r.model} {pct(r.test_accuracy)}" for r in acc.itertuples()) + ".")
    return out


class Distribution(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path) -> Output:
        out = Path(out)
        parts = [distribution_table(r) for r in results]
        parts = [p for p in parts if not p.empty]
        models = models_table(results)
        if not parts:
            raise ExperimentSkipped("no run holds mc or mmse rows")
        table = pd.concat(parts, ignore_index=True)
        runs = [r for r in results if (table["model"] == r.label).any()]
        fig = _plot(table, runs, out / NAME)
        return self.output(
            out,
            tables={NAME: table, "models": models},
            figures=[fig],
            reading=_reading(table, models),
        )

    def display(self, output: Output) -> list[Shown]:
        t = output.tables
        main = t.get(self.name, pd.DataFrame())
        models = t.get("models", pd.DataFrame()).drop(columns=["checkpoint", "results"], errors="ignore")
        return [
            ("The models (from the checkpoints' metadata)", models),
            ("Distribution of p over the scored points", main.assign(method=lambda f: "p^" + f["method"])),
        ]


EXPERIMENT = Distribution()
