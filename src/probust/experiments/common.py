"""Helpers shared by several experiments: numbers for prose, the error table against Monte Carlo,
the pool of points of the image experiments, and the estimator order of displayed tables."""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.run_info import Run

__all__ = ["ERROR_ESTIMATORS", "case_sigma", "error_table", "fmt", "pct", "pool", "sem", "sort_by_method"]


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for prose: 3 significant digits, scientific below 1e-3."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def pct(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{100 * value:.1f}%"


def sem(values) -> float:
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")


#: The estimators compared with Monte Carlo by :func:`error_table`, in this order.
ERROR_ESTIMATORS = ("taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is")


def error_table(run: Run) -> pd.DataFrame:
    """Per (sigma, estimator): error statistics against Monte Carlo on the points both scored."""
    w = run.wide(core=True)
    if "p_mc" not in w:
        return pd.DataFrame()
    w = w[w["p_mc"].notna()]
    rows = []
    for sigma, group in w.groupby("sigma"):
        half_width = ((group["mc_ci_high"] - group["mc_ci_low"]) / 2).to_numpy()
        for method in ERROR_ESTIMATORS:
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
                    "mc_n_samples": int(cast(int, run.principal_n("mc"))),  # the run has mc rows
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


def case_sigma(run: Run, method: str = "mmse") -> float:
    """The sigma with the most rows of ``method`` (ties: the one nearest the middle)."""
    rows = run.rows(method)
    counts = rows.groupby("sigma").size()
    best = counts.max()
    tied = sorted(float(s) for s, c in counts.items() if c == best)
    middle = run.sigmas[len(run.sigmas) // 2]
    return min(tied, key=lambda s: (abs(np.log(s / middle)), s))


def pool(run: Run, sigma: float) -> pd.DataFrame:
    """index, label, prediction, p_mmse, softmax for every point with p^mmse at ``sigma``."""
    w = run.wide()
    g = w[(w["sigma"] == sigma) & w["p_mmse"].notna()] if "p_mmse" in w else w.iloc[:0]
    return g[["index", "label", "prediction", "p_mmse", "softmax"]].reset_index(drop=True)


def sort_by_method(frame: pd.DataFrame, col: str = "method") -> pd.DataFrame:
    """``frame`` sorted by model, estimator (in :data:`~probust.experiments.style.METHOD_ORDER`) and sigma,
    those of the three it has."""
    methods_order = {m: i for i, m in enumerate(style.METHOD_ORDER)}
    return (
        frame.assign(_o=frame[col].map(methods_order))
        .sort_values([c for c in ("model", "_o", "sigma") if c in frame or c == "_o"])
        .drop(columns="_o")
    )
