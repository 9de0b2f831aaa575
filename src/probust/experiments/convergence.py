"""Experiment 2: convergence of Monte Carlo in its sample count n, and of MMSE in N.

The paper's appendix figures "Convergence of p_mc" and "Convergence of p_mmse".

Inputs: runs holding the same points at several sample counts (``probust estimate --mc-samples
100 1000 ... --mmse-samples 1 5 10 ...``). Reference: the exact p_robust where one is known (a
linear model, whose p^taylor is exact), otherwise Monte Carlo at the largest n scored.

Outputs: ``convergence.csv``, one row per (model, sigma, estimator, sample count): mean absolute
and relative error against the reference with their standard errors, Monte Carlo's expected
error by the binomial law (``theory_abs_error``, derived in docs/experiments.md) and MMSE's mean
change to its largest N; one figure of the errors against n and N.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt, sem
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "convergence"
TITLE = "2. Convergence of Monte Carlo in n and of MMSE in N"
DESCRIPTION = (
    "Mean absolute and relative error of p<sup>mc</sup> as a function of its number of noise samples n, and of "
    "p<sup>mmse</sup> as a function of its number of noisy copies N, on the points scored at every count. The "
    "reference is the exact value where known (the linear model: p<sup>taylor</sup> is exact) and otherwise Monte "
    "Carlo at the largest n. Dashed: the error Monte Carlo should have by the binomial law, √(2/π)·√(p(1−p)/n) "
    "(against an exact reference) or √(2/π)·√(p(1−p)(1/n − 1/n<sub>max</sub>)) (against its own nested n<sub>max</sub> samples)."
)
_SQRT_2_PI = np.sqrt(2 / np.pi)
_FLOOR = 1e-5  # errors below this are drawn at it (an exact estimator's error is QMC round-off)


def _common_points(rows: pd.DataFrame, counts: list[int]) -> pd.DataFrame:
    """p per index (rows) and sample count (columns), on the indices scored at every count."""
    wide = rows.pivot_table(index="index", columns="n_samples", values="p", aggfunc="first")
    return wide[counts].dropna()


def _exact_reference(run: Run, sigma: float, index: pd.Index) -> pd.Series | None:
    if run.arch != "linear" or not run.has("taylor"):
        return None
    t = run.rows("taylor")
    ref = t[t["sigma"] == sigma].set_index("index")["p"].reindex(index)
    return None if ref.isna().any() else ref


def _mc_reference(run: Run, sigma: float, index: pd.Index) -> tuple[pd.Series, int] | None:
    mc = run.table[(run.table["method"] == "mc") & (run.table["sigma"] == sigma)]
    for n in sorted(mc["n_samples"].unique(), reverse=True):
        ref = mc[mc["n_samples"] == n].set_index("index")["p"].reindex(index)
        if not ref.isna().any():
            return ref, int(n)
    return None


def _row(run: Run, sigma: float, estimator: str, n: int, values: np.ndarray, ref: np.ndarray, reference: str) -> dict:
    abs_err = np.abs(values - ref)
    positive = ref > 0
    rel = abs_err[positive] / ref[positive]
    return {
        "model": run.label,
        "sigma": float(sigma),
        "estimator": estimator,
        "n_samples": int(n),
        "n_points": int(len(values)),
        "reference": reference,
        "mean_abs_error": float(abs_err.mean()),
        "sem_abs_error": sem(abs_err),
        "mean_rel_error": float(rel.mean()) if rel.size else np.nan,
        "sem_rel_error": sem(rel),
    }


def convergence_table(run: Run) -> pd.DataFrame:
    rows = []
    t = run.table
    for sigma in run.sigmas:
        at = t[t["sigma"] == sigma]
        # Monte Carlo in n
        mc = at[at["method"] == "mc"]
        counts = sorted(int(n) for n in mc["n_samples"].unique())
        if len(counts) >= 2:
            wide = _common_points(mc, counts)
            if len(wide) >= 2:
                exact = _exact_reference(run, sigma, wide.index)
                if exact is not None:
                    ref, reference, use = exact.to_numpy(), "exact value (linear model: p^taylor)", counts
                else:
                    ref, reference, use = wide[counts[-1]].to_numpy(), f"p^mc at n={counts[-1]:,}", counts[:-1]
                for n in use:
                    row = _row(run, sigma, "mc", n, wide[n].to_numpy(), ref, reference)
                    var = ref * (1 - ref) * (1 / n - (0 if exact is not None else 1 / counts[-1]))
                    row["theory_abs_error"] = float(np.mean(_SQRT_2_PI * np.sqrt(np.clip(var, 0, None))))
                    rows.append(row)
        # MMSE in N
        mm = at[at["method"] == "mmse"]
        counts = sorted(int(n) for n in mm["n_samples"].unique())
        if len(counts) >= 2:
            wide = _common_points(mm, counts)
            if len(wide) >= 2:
                exact = _exact_reference(run, sigma, wide.index)
                mc_ref = None if exact is not None else _mc_reference(run, sigma, wide.index)
                if exact is not None:
                    ref, reference = exact.to_numpy(), "exact value (linear model: p^taylor)"
                elif mc_ref is not None:
                    ref, reference = mc_ref[0].to_numpy(), f"p^mc at n={mc_ref[1]:,}"
                else:
                    ref, reference = wide[counts[-1]].to_numpy(), f"p^mmse at N={counts[-1]}"
                last = wide[counts[-1]].to_numpy()
                for n in counts:
                    row = _row(run, sigma, "mmse", n, wide[n].to_numpy(), ref, reference)
                    row["mean_abs_change_vs_largest_n"] = float(np.abs(wide[n].to_numpy() - last).mean())
                    rows.append(row)
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, stem: Path) -> Path:
    keys = list(table[["model", "sigma"]].drop_duplicates().itertuples(index=False, name=None))
    colors = {k: c for k, c in zip(keys, _cycle(len(keys)))}
    with style.style_context():
        fig, axes = style.new_figure(2, 2, height=6.6, width=9.6)
        for col, (estimator, xlabel) in enumerate((("mc", "Monte Carlo samples n"), ("mmse", "MMSE noisy copies N"))):
            t = table[table["estimator"] == estimator]
            for row, stat in enumerate(("abs", "rel")):
                ax = axes[row, col]
                if t.empty:
                    ax.text(
                        0.5,
                        0.5,
                        f"no {estimator} rows at several sample counts",
                        ha="center",
                        va="center",
                        transform=ax.transAxes,
                    )
                    ax.set_axis_off()
                    continue
                values = []
                floor = _FLOOR
                for key in keys:
                    g = t[(t["model"] == key[0]) & (t["sigma"] == key[1])].sort_values("n_samples")
                    if g.empty:
                        continue
                    y = g[f"mean_{stat}_error"].clip(lower=floor)
                    values += y.tolist()
                    ax.errorbar(
                        g["n_samples"],
                        y,
                        yerr=g[f"sem_{stat}_error"],
                        color=colors[key],
                        marker=style.method_marker(estimator),
                        capsize=2.5,
                        label=style.mathtext(f"{key[0]}, σ={key[1]:g} (vs {g['reference'].iloc[0]})"),
                    )
                    if estimator == "mc" and stat == "abs":
                        ax.plot(g["n_samples"], g["theory_abs_error"], color=colors[key], linestyle="--", linewidth=1.2)
                    if estimator == "mmse" and stat == "abs":
                        change = g[g["n_samples"] < g["n_samples"].max()]
                        values += change["mean_abs_change_vs_largest_n"].tolist()
                        ax.plot(
                            change["n_samples"],
                            change["mean_abs_change_vs_largest_n"].clip(lower=floor),
                            color=colors[key],
                            linestyle=":",
                            linewidth=1.4,
                        )
                style.log_x(ax)
                style.log_y(ax, max(style.log_floor(values), floor / 1.5))
                if min(values) <= floor:
                    ax.text(
                        0.98,
                        0.1,
                        f"bottom edge: below {floor:g} (exact)",
                        transform=ax.transAxes,
                        ha="right",
                        va="bottom",
                        fontsize=8,
                        color="#555555",
                    )
                ax.set_xlabel(xlabel)
                label = style.method_label(estimator)
                ax.set_ylabel(("mean absolute error of " if stat == "abs" else "mean relative error of ") + label)
                if row == 0:
                    ax.set_title(f"{label}: convergence in {'n' if estimator == 'mc' else 'N'}")
        if (table["estimator"] == "mc").any():
            axes[0, 0].plot(
                [], [], color="#555555", linestyle="--", linewidth=1.2, label="Monte Carlo: binomial law (theory)"
            )
        if (table["estimator"] == "mmse").any():
            axes[0, 1].plot(
                [], [], color="#555555", linestyle=":", linewidth=1.4, label="MMSE: mean change to the largest N"
            )
        handles, labels = [], []
        for ax in axes[0]:
            h, lab = ax.get_legend_handles_labels()
            for hh, ll in zip(h, lab):
                if ll not in labels:
                    handles.append(hh)
                    labels.append(ll)
        fig.legend(
            handles,
            labels,
            loc="lower center",
            ncol=2,
            frameon=False,
            bbox_to_anchor=(0.5, -0.08 - 0.025 * len(labels) // 2),
        )
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _cycle(n: int) -> list:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def _reading(table: pd.DataFrame) -> list[str]:
    out = []
    for (model, sigma), g in table.groupby(["model", "sigma"], sort=False):
        mc = g[g["estimator"] == "mc"].sort_values("n_samples")
        if len(mc) >= 2:
            first, last = mc.iloc[0], mc.iloc[-1]
            slope = np.polyfit(np.log10(mc["n_samples"]), np.log10(mc["mean_abs_error"].clip(lower=1e-9)), 1)[0]
            below = mc[mc["mean_abs_error"] < 0.01]
            need = (
                f"; mean |error| &lt; 0.01 from n={int(below['n_samples'].iloc[0]):,} on"
                if len(below)
                else "; mean |error| stays ≥ 0.01 at every n scored"
            )
            out.append(
                f"<b>{model}, σ={sigma:g}</b> ({int(first['n_points'])} points, vs {style.html_names(first['reference'])}): "
                f"p<sup>mc</sup>'s mean |error| falls from {fmt(first['mean_abs_error'])} at n={int(first['n_samples']):,} to "
                f"{fmt(last['mean_abs_error'])} at n={int(last['n_samples']):,} (log-log slope {slope:.2f}; the binomial law "
                f"predicts −0.5 against an exact reference){need}."
            )
        mm = g[g["estimator"] == "mmse"].sort_values("n_samples")
        if len(mm) >= 2:
            parts = ", ".join(f"N={int(r.n_samples)}: {fmt(r.mean_abs_error)}" for r in mm.itertuples())
            stable = mm[mm["mean_abs_change_vs_largest_n"] < 0.005]
            settle = (
                f"; from N={int(stable['n_samples'].iloc[0])} on, it changes by less than 0.005 on average up to N={int(mm['n_samples'].iloc[-1])}"
                if len(stable) and int(stable["n_samples"].iloc[0]) < int(mm["n_samples"].iloc[-1])
                else ""
            )
            out.append(
                f"<b>{model}, σ={sigma:g}</b> ({int(mm['n_points'].iloc[0])} points): p<sup>mmse</sup>'s mean |error| vs "
                f"{style.html_names(mm['reference'].iloc[0])}: {parts}{settle}."
            )
    return out


class Convergence(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path) -> Output:
        """Convergence tables for every run holding several sample counts of mc or mmse."""
        out = Path(out)
        parts = [convergence_table(r) for r in results]
        parts = [p for p in parts if not p.empty]
        if not parts:
            raise ExperimentSkipped(
                "no points were scored at several sample counts: score a subset with e.g. --mc-samples 100 1000 10000 "
                "and --mmse-samples 1 5 10 50"
            )
        table = pd.concat(parts, ignore_index=True)
        fig = _plot(table, out / NAME)
        return self.output(
            out,
            tables={NAME: table},
            figures=[fig],
            reading=_reading(table),
        )

    def display(self, output: Output) -> list[Shown]:
        return [("Error against the reference per sample count", output.tables.get(self.name, pd.DataFrame()))]


EXPERIMENT = Convergence()
