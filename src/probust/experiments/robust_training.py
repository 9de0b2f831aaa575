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

from probust.experiments import _style
from probust.experiments._base import ExperimentSkipped, Output, finish, fmt, pct
from probust.experiments.run_info import Run
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
        raise ExperimentSkipped(f"the RobustLoss model(s) ({', '.join(r.label for r in robust)}) have no Monte Carlo rows: score them with method mc")
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


def _group_label(run: Run) -> str:
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
    return _style.lambda_label(run.grad_reg) if run.grad_reg else "plain"


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
    xs, groups = [], []
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
    k = int(min(np.searchsorted(x, at, side="right") - 1, len(x) - 2))
    w = 0.0 if x[k + 1] == x[k] else float((at - x[k]) / (x[k + 1] - x[k]))
    return float((1 - w) * y[k] + w * y[k + 1]), k, w


def frontier_mask(acc: np.ndarray, med: np.ndarray) -> np.ndarray:
    """bool [n]: the points no other point beats on both accuracy and median (at least as high
    in both, higher in one): the trade-offs worth choosing."""
    acc, med = np.asarray(acc, dtype=np.float64), np.asarray(med, dtype=np.float64)
    beaten = (acc[None, :] >= acc[:, None]) & (med[None, :] >= med[:, None]) & ((acc[None, :] > acc[:, None]) | (med[None, :] > med[:, None]))
    return ~beaten.any(axis=1)


def _ci(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [0.025, 0.975])
    return float(lo), float(hi)


def group_tables(group: dict, *, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The main table (one row per model and sigma) and the matched-accuracy table (one row per
    RobustLoss model and sigma) of one group; see :func:`run` for the columns."""
    plain: Run = group["plain"]
    grad_norm: list[Run] = group["grad_norm"]
    robust: list[Run] = group["robust"]
    models = [plain, *grad_norm, *robust]
    values = [_mc_values(r) for r in models]
    sigmas = sorted(set.intersection(*(set(float(s) for s in v.columns) for v in values)))
    if not sigmas:
        raise ExperimentSkipped(f"{_group_label(plain)}: the models share no σ with Monte Carlo rows")
    # the points every model scored at every common sigma
    common = None
    for v in values:
        ok = set(v.index[v[sigmas].notna().all(axis=1)])
        common = ok if common is None else common & ok
    indices = np.array(sorted(common or ()), dtype=np.int64)
    if len(indices) < 2:
        raise ExperimentSkipped(f"{_group_label(plain)}: fewer than 2 points scored with Monte Carlo by every model at every common σ")
    label = _group_label(plain)
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
        keep = frontier_mask([acc[f.label] for f in family], [med[f.label] for f in family])
        frontier = [f for f, k in zip(family, keep) if k]
        f_acc = np.array([acc[r.label] for r in frontier], dtype=np.float64)
        f_all = [acc[r.label] for r in family]
        x, groups_, _ = matched_curve(f_acc, np.array([med[r.label] for r in frontier]))
        y = np.array([np.mean([med[frontier[i].label] for i in g]) for g in groups_])
        y_boot = np.stack([np.mean([boot[frontier[i].label] for i in g], axis=0) for g in groups_]) if len(x) else np.empty((0, n_boot))
        for r in robust:
            a = acc[r.label]
            # within the family's accuracy range but below its frontier's, the frontier's least
            # accurate member is more accurate and at least as robust: it is the matched value
            inside = a is not None and len(x) and min(f_all) <= a <= max(f_all)
            value, k, w = interpolate(x, y, min(max(a, x[0]), x[-1])) if inside else (float("nan"), None, float("nan"))
            nearest = min(family, key=lambda f: (abs(acc[f.label] - a), -(f.grad_reg or 0))) if family and a is not None else None
            if k is not None:
                upper = k + 1 < len(x) and a >= x[0]  # below the frontier: its first member alone
                between = [frontier[i] for i in groups_[k]] + ([frontier[i] for i in groups_[k + 1]] if upper else [])
                curve_boot = (1 - w) * y_boot[k] + (w * y_boot[k + 1] if k + 1 < len(x) else 0.0)
                adv_boot = boot[r.label] - curve_boot
                adv_lo, adv_hi = _ci(adv_boot)
            else:
                between, adv_lo, adv_hi = [], float("nan"), float("nan")
            dominates = [
                f for f in family
                if a is not None and acc[f.label] <= a and med[f.label] <= med[r.label]
                and (acc[f.label] < a or med[f.label] < med[r.label])
            ]  # fmt: skip
            dominated = [
                f for f in grad_norm
                if acc[f.label] is not None and a is not None and acc[f.label] >= a and med[f.label] >= med[r.label]
                and (acc[f.label] > a or med[f.label] > med[r.label])
            ]  # fmt: skip
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


# -- figure ----------------------------------------------------------------------------------------


def _plot(table: pd.DataFrame, matched: pd.DataFrame, group: dict, stem: Path) -> Path:
    sigmas = sorted(table["sigma"].unique())
    ncols = min(4, len(sigmas))
    nrows = math.ceil(len(sigmas) / ncols)
    robust_markers = ["*", "D", "P", "X", "v", "^"]
    robust_colors = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#ff7f0e", "#17becf"]
    with _style.style_context():
        fig, axes = _style.new_figure(nrows, ncols, width=4.3 * ncols + 0.5, height=3.6 * nrows + 0.6)
        for k, sigma in enumerate(sigmas):
            ax = axes[k // ncols, k % ncols]
            t = table[table["sigma"] == sigma]
            fam = t[t["kind"] != "robust-loss"].dropna(subset=["test_accuracy"]).sort_values(["test_accuracy", "grad_reg"])
            yerr = [fam["median_p"] - fam["median_ci_low"], fam["median_ci_high"] - fam["median_p"]]
            ax.errorbar(100 * fam["test_accuracy"], fam["median_p"], yerr=yerr, color="#1f77b4", marker="o", capsize=2.5,
                        linestyle="none", label="gradient-norm family")  # fmt: skip
            front = fam[frontier_mask(fam["test_accuracy"], fam["median_p"])]
            ax.plot(100 * front["test_accuracy"], front["median_p"], color="#1f77b4", linewidth=1.2,
                    label="its frontier (interpolated)")  # fmt: skip
            span = max(float(100 * (t["test_accuracy"].max() - t["test_accuracy"].min())), 1e-9)
            placed: list[float] = []
            for row in fam.itertuples():
                # labels of points close in accuracy are stacked instead of drawn over each other
                x = 100 * row.test_accuracy
                j = sum(abs(x - other) < 0.06 * span for other in placed)
                placed.append(x)
                ax.annotate(row.short, (x, row.median_p), textcoords="offset points", xytext=(4, -10 - 9 * j), fontsize=7, color="#1f77b4")
            pl = fam[fam["kind"] == "plain"]
            ax.plot(100 * pl["test_accuracy"], pl["median_p"], linestyle="none", marker="s", markersize=8, markerfacecolor="white",
                    markeredgecolor="black", label="plain model", zorder=3)  # fmt: skip
            rob = t[t["kind"] == "robust-loss"].dropna(subset=["test_accuracy"])
            for i, row in enumerate(rob.itertuples()):
                c, m = robust_colors[i % len(robust_colors)], robust_markers[i % len(robust_markers)]
                ax.errorbar([100 * row.test_accuracy], [row.median_p], yerr=[[row.median_p - row.median_ci_low], [row.median_ci_high - row.median_p]],
                            color=c, marker=m, markersize=10 if m == "*" else 7, capsize=2.5, linestyle="none", label=row.short, zorder=4)  # fmt: skip
                ax.annotate(f"μ={row.robust_mu:g}", (100 * row.test_accuracy, row.median_p), textcoords="offset points", xytext=(5, 4), fontsize=8, color=c)
                mrow = matched[(matched["model"] == row.model) & (matched["sigma"] == sigma)]
                if len(mrow) and np.isfinite(mrow["matched_median_p"].iloc[0]):
                    y = float(mrow["matched_median_p"].iloc[0])
                    ax.plot([100 * row.test_accuracy] * 2, [row.median_p, y], color=c, linestyle=":", linewidth=1)
                    ax.plot([100 * row.test_accuracy], [y], marker="o", markerfacecolor="white", markeredgecolor=c, linestyle="none", zorder=4)
            ax.set_xlabel("test accuracy (%)")
            ax.set_ylabel(f"median {_style.method_label('mc')}")
            ax.set_title(f"σ = {sigma:g}")
            if k == 0:
                ax.legend(frameon=False, fontsize=7, loc="best")
        for k in range(len(sigmas), nrows * ncols):
            axes[k // ncols, k % ncols].set_visible(False)
        plain = group["plain"]
        n = int(table["n_points"].iloc[0])
        fig.suptitle(f"{_group_label(plain)}: median p_robust (Monte Carlo, {n} test points) against test accuracy; "
                     "open circles: the family interpolated at the robust model's accuracy", y=1.0, fontsize=10)  # fmt: skip
        fig.tight_layout()
        return _style.save_figure(fig, stem)[0]


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
            f"from {fmt(prow['median_p'])} (plain) to {fmt(row['median_p'])}" if verb != "leaves" else f"at {fmt(row['median_p'])}, the plain model's value"
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
            text += f" {' and '.join(who)} {verb} at least as accurate and at least as robust (median) as {name} at this σ."
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
            out.append(f"Over all σ, {name} is " + "; ".join(parts) + f" (median advantage at matched accuracy, σ = "
                       f"{', '.join(f'{s:g}' for s in sigmas)}: {adv}).")  # fmt: skip
        saturated = [s for s in sigmas if min(tp.loc[s, "median_p"], t.loc[s, "median_p"]) >= 0.99]
        if saturated:
            out.append(
                f"At σ = {', '.join(f'{s:g}' for s in saturated)} the median p<sup>mc</sup> is already ≥ 0.99 for the plain and the "
                f"robust model, so the median cannot tell them apart there; the mean (table) still can."
            )
    return out


# -- the experiment --------------------------------------------------------------------------------


def run(results: Results, out: str | Path, *, n_boot: int = 2000, seed: int = 0) -> Output:
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
    tables, matched_tables, figures, reading = [], [], [], []
    skipped = []
    for k, group in enumerate(groups):
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
    return finish(
        Output(
            name=NAME,
            title=TITLE,
            description=DESCRIPTION,
            tables={NAME: pd.concat(tables, ignore_index=True), "matched": pd.concat(matched_tables, ignore_index=True)},
            figures=figures,
            reading=reading,
            settings={
                "groups": [
                    {"plain": g["plain"].label, "grad_norm": [r.label for r in g["grad_norm"]], "robust": [r.label for r in g["robust"]]}
                    for g in groups
                ],
                "n_boot": n_boot,
                "seed": seed,
                "skipped_groups": skipped,
            },
        ),
        out,
    )
