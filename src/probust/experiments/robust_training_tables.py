"""The tables of experiment 11 (:mod:`probust.experiments.robust_training`): which runs are
compared, and for each group of them the per-model medians with bootstrap intervals and the
comparison with the gradient-norm family at matched accuracy (see the experiment's ``run`` for
the columns)."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from probust.experiments import style
from probust.experiments.base import ExperimentSkipped
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

__all__ = [
    "KINDS",
    "boot_medians",
    "bootstrap_indices",
    "comparisons",
    "frontier_mask",
    "group_label",
    "group_tables",
    "interpolate",
    "matched_curve",
    "short_label",
]

#: The kinds of model in a group, in the order of the tables.
KINDS = ("plain", "grad-norm", "robust-loss")


# -- which runs ------------------------------------------------------------------------------------


def comparisons(results: Results) -> list[dict]:
    """Groups of runs to compare: ``{"plain": Run, "grad_norm": [Run], "robust": [Run]}``.

    One group per gradient-norm family (models trained alike, no extra loss, that differ only
    in lambda) that has a plain member (lambda 0) and at least one lambda > 0, with the RobustLoss
    models (lambda 0) trained with the same recipe; every run must have Monte Carlo rows.

    Raises:
        ExperimentSkipped: no group is complete (the message says what is missing).
    """
    robust = [r for r in results.robust_loss_runs() if not r.grad_reg]
    if not robust:
        raise ExperimentSkipped(
            "no model trained with a RobustLoss among the results: train one with probust train --robust-loss MU "
            "--robust-sigma S (the same recipe as the plain model) and score it with method mc"
        )
    robust_mc = [r for r in robust if r.has("mc")]
    if not robust_mc:
        raise ExperimentSkipped(
            f"the RobustLoss model(s) ({', '.join(r.label for r in robust)}) have no Monte Carlo rows: score them with method mc"
        )
    groups = []
    for family in results.families():
        if family[0].extra_loss is not None or family[0].grad_reg != 0:
            continue
        plain, grad_norm = family[0], [r for r in family[1:] if r.has("mc")]
        members = [r for r in robust_mc if r.recipe == plain.recipe]
        if plain.has("mc") and grad_norm and members:
            groups.append({"plain": plain, "grad_norm": grad_norm, "robust": members})
    if not groups:
        raise ExperimentSkipped(
            f"no plain model (λ=0) and gradient-norm models (λ>0), all with Monte Carlo rows, trained with the same recipe "
            f"(data set, architecture, epochs, lr, batch size, weight decay, schedule, training size, seed) as the RobustLoss "
            f"model(s) {', '.join(r.label for r in robust_mc)}: train them with probust train --grad-reg 0 / λ ... and score them with method mc"
        )
    return groups


def group_label(run: Run) -> str:
    return run.default_label().split(",")[0]


def _kind(run: Run) -> str:
    if run.robust_loss is not None:
        return "robust-loss"
    return "grad-norm" if run.grad_reg else "plain"


def short_label(run: Run) -> str:
    """λ=0.01 / μ=1 (σ=0.2) / plain: the name used inside one group's figure and reading."""
    if run.robust_loss is not None:
        sigma = f" (σ={run.robust_sigma:g})" if run.robust_sigma is not None else ""
        return f"RobustLoss μ={run.robust_loss:g}{sigma}"
    return style.lambda_label(run.grad_reg) if run.grad_reg else "plain"


def _mc_values(run: Run) -> pd.DataFrame:
    """index x sigma -> p_mc at the principal count."""
    rows = run.rows("mc")
    return rows.pivot_table(index="index", columns="sigma", values="p", aggfunc="first")


# -- numbers ---------------------------------------------------------------------------------------


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] resampled positions (with replacement), from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def boot_medians(values: np.ndarray, idx: np.ndarray, chunk: int = 250) -> np.ndarray:
    """The median of ``values[idx[b]]`` for every resample b."""
    return np.concatenate([np.median(values[idx[i : i + chunk]], axis=1) for i in range(0, len(idx), chunk)])


def matched_curve(acc: np.ndarray, med: np.ndarray) -> tuple[np.ndarray, list[list[int]], np.ndarray]:
    """The family's curve: accuracies sorted and unique, and the positions (into ``acc``) of the
    points averaged at each; returns ``(x, groups, order)`` with ``groups[k]`` the positions
    sharing ``x[k]``."""
    order = np.argsort(acc, kind="stable")
    xs: list[float] = []
    groups: list[list[int]] = []
    for i in order:
        if xs and acc[i] == xs[-1]:
            groups[-1].append(i)
        else:
            xs.append(acc[i])
            groups.append([i])
    return np.array(xs), groups, order


def interpolate(x: np.ndarray, y: np.ndarray, at: float) -> tuple[float, int | None, float]:
    """Linear interpolation of the curve ``(x sorted increasing, y)`` at ``at``.

    Returns:
        ``(value, k, w)``: value = (1 - w) y[k] + w y[k+1] with x[k] <= at <= x[k+1]; NaN, None,
        NaN when ``at`` lies outside [x[0], x[-1]] (a single point matches only itself).
    """
    if len(x) == 0 or not (x[0] <= at <= x[-1]):
        return float("nan"), None, float("nan")
    if len(x) == 1:
        return float(y[0]), 0, 0.0
    k = int(cast(int, min(np.searchsorted(x, at, side="right") - 1, len(x) - 2)))
    w = 0.0 if x[k + 1] == x[k] else float((at - x[k]) / (x[k + 1] - x[k]))
    return float((1 - w) * y[k] + w * y[k + 1]), k, w


def frontier_mask(acc: ArrayLike, med: ArrayLike) -> np.ndarray:
    """bool [n]: the points no other point beats on both accuracy and median (at least as high
    in both, higher in one): the trade-offs worth choosing."""
    acc, med = np.asarray(acc, dtype=np.float64), np.asarray(med, dtype=np.float64)
    beaten = (
        (acc[None, :] >= acc[:, None])
        & (med[None, :] >= med[:, None])
        & ((acc[None, :] > acc[:, None]) | (med[None, :] > med[:, None]))
    )
    return cast(np.ndarray, ~beaten.any(axis=1))


def _ci(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [0.025, 0.975])
    return float(lo), float(hi)


def group_tables(group: dict, *, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The main table (one row per model and sigma) and the matched-accuracy table (one row per
    RobustLoss model and sigma) of one group; see
    :meth:`probust.experiments.robust_training.RobustTraining.run` for the columns."""
    plain: Run = group["plain"]
    grad_norm: list[Run] = group["grad_norm"]
    robust: list[Run] = group["robust"]
    models = [plain, *grad_norm, *robust]
    values = [_mc_values(r) for r in models]
    sigmas = sorted(set.intersection(*(set(float(s) for s in v.columns) for v in values)))
    if not sigmas:
        raise ExperimentSkipped(f"{group_label(plain)}: the models share no σ with Monte Carlo rows")
    # the points every model scored at every common sigma
    common = None
    for v in values:
        ok = set(v.index[v[sigmas].notna().all(axis=1)])
        common = ok if common is None else common & ok
    indices = np.array(sorted(common or ()), dtype=np.int64)
    if len(indices) < 2:
        raise ExperimentSkipped(
            f"{group_label(plain)}: fewer than 2 points scored with Monte Carlo by every model at every common σ"
        )
    label = group_label(plain)
    acc = {r.label: r.test_accuracy for r in models}
    acc_plain = acc[plain.label]
    rows, matched = [], []
    for j, sigma in enumerate(sigmas):
        idx = bootstrap_indices(len(indices), n_boot, seed + 7919 * j)
        p = {r.label: v.loc[indices, sigma].to_numpy(dtype=np.float64) for r, v in zip(models, values)}
        boot = {name: boot_medians(vals, idx) for name, vals in p.items()}
        med = {name: float(np.median(vals)) for name, vals in p.items()}
        for r in models:
            name = r.label
            gain_boot = boot[name] - boot[plain.label]
            a = acc[name]
            rows.append(
                {
                    "group": label,
                    "model": name,
                    "short": short_label(r),
                    "kind": _kind(r),
                    "grad_reg": r.grad_reg,
                    "robust_mu": r.robust_loss,
                    "robust_sigma": r.robust_sigma,
                    "sigma": sigma,
                    "n_points": len(indices),
                    "mc_n": r.principal_n("mc"),
                    "test_accuracy": a,
                    "accuracy_cost": (acc_plain - a) if a is not None and acc_plain is not None else np.nan,
                    "median_p": med[name],
                    "median_ci_low": _ci(boot[name])[0],
                    "median_ci_high": _ci(boot[name])[1],
                    "mean_p": float(p[name].mean()),
                    "gain_median": med[name] - med[plain.label],
                    "gain_ci_low": _ci(gain_boot)[0] if r is not plain else 0.0,
                    "gain_ci_high": _ci(gain_boot)[1] if r is not plain else 0.0,
                    "gain_mean": float(p[name].mean() - p[plain.label].mean()),
                }
            )
        # the family's curve over accuracy (plain + grad-norm, with known accuracy), through its
        # frontier only: a member that another beats on both accuracy and median is no
        # trade-off a user would pick, and interpolating through it would understate the family
        family = [r for r in [plain, *grad_norm] if acc[r.label] is not None]
        fam_acc = {f.label: cast(float, acc[f.label]) for f in family}  # (not None: filtered above)
        keep = frontier_mask([fam_acc[f.label] for f in family], [med[f.label] for f in family])
        frontier = [f for f, k in zip(family, keep) if k]
        f_acc = np.array([acc[r.label] for r in frontier], dtype=np.float64)
        f_all = [fam_acc[r.label] for r in family]
        x, groups_, _ = matched_curve(f_acc, np.array([med[r.label] for r in frontier]))
        y = np.array([np.mean([med[frontier[i].label] for i in g]) for g in groups_])
        y_boot = (
            np.stack([np.mean([boot[frontier[i].label] for i in g], axis=0) for g in groups_])
            if len(x)
            else np.empty((0, n_boot))
        )
        for r in robust:
            a = acc[r.label]
            # within the family's accuracy range but below its frontier's, the frontier's least
            # accurate member is more accurate and at least as robust: it is the matched value
            inside = a is not None and len(x) and min(f_all) <= a <= max(f_all)
            value, k, w = (
                interpolate(x, y, min(max(cast(float, a), x[0]), x[-1]))
                if inside
                else (float("nan"), None, float("nan"))
            )
            nearest = (
                min(family, key=lambda f: (abs(fam_acc[f.label] - cast(float, a)), -(f.grad_reg or 0)))
                if family and a is not None
                else None
            )
            if k is not None:
                upper = k + 1 < len(x) and a >= x[0]  # below the frontier: its first member alone
                between = [frontier[i] for i in groups_[k]] + ([frontier[i] for i in groups_[k + 1]] if upper else [])
                curve_boot = (1 - w) * y_boot[k] + (w * y_boot[k + 1] if k + 1 < len(x) else 0.0)
                adv_boot = boot[r.label] - curve_boot
                adv_lo, adv_hi = _ci(adv_boot)
            else:
                between, adv_lo, adv_hi = [], float("nan"), float("nan")
            dominates = [
                f
                for f in family
                if a is not None
                and fam_acc[f.label] <= a
                and med[f.label] <= med[r.label]
                and (fam_acc[f.label] < a or med[f.label] < med[r.label])
            ]
            dominated = [
                f
                for f in grad_norm
                if acc[f.label] is not None
                and a is not None
                and cast(float, acc[f.label]) >= a
                and med[f.label] >= med[r.label]
                and (cast(float, acc[f.label]) > a or med[f.label] > med[r.label])
            ]
            advantage = med[r.label] - value
            if not math.isfinite(advantage):
                verdict = "outside the family's accuracy range"
            elif adv_lo > 0:
                verdict = "robust loss higher"
            elif adv_hi < 0:
                verdict = "gradient-norm higher"
            else:
                verdict = "no clear difference"
            matched.append(
                {
                    "group": label,
                    "model": r.label,
                    "robust_mu": r.robust_loss,
                    "robust_sigma": r.robust_sigma,
                    "sigma": sigma,
                    "test_accuracy": a,
                    "median_p": med[r.label],
                    "family_accuracy_min": min(f_all) if f_all else np.nan,
                    "family_accuracy_max": max(f_all) if f_all else np.nan,
                    "in_range": k is not None,
                    "matched_median_p": value,
                    "matched_between": " and ".join(dict.fromkeys(short_label(f) for f in between)),
                    "advantage": advantage,
                    "advantage_ci_low": adv_lo,
                    "advantage_ci_high": adv_hi,
                    "verdict": verdict,
                    "nearest_model": nearest.label if nearest else None,
                    "nearest_short": short_label(nearest) if nearest else None,
                    "nearest_accuracy": acc[nearest.label] if nearest else np.nan,
                    "nearest_median_p": med[nearest.label] if nearest else np.nan,
                    "nearest_median_ci_low": _ci(boot[nearest.label])[0] if nearest else np.nan,
                    "nearest_median_ci_high": _ci(boot[nearest.label])[1] if nearest else np.nan,
                    "dominated_by": "; ".join(short_label(f) for f in dominated),
                    "dominates": "; ".join(short_label(f) for f in dominates),
                    "dominates_all": len(dominates) == len(family) > 0,
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(matched)
