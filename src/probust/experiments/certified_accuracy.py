"""Experiment 12: certified accuracy against radius, from ``probust certify`` folders.

The standard curve of randomized smoothing (Cohen, Rosenfeld and Kolter, 2019, figures 6-7): the
share of points whose smoothed prediction is correct and certified at L2 radius at least r, one
curve per (model, sigma); with ``--estimate`` the same curve from the analytic estimate
sigma * Phi^-1(p) beside it (dashed: an estimate, not a certificate). And the draws each point
cost (``n_drawn``: n0 + estimation draws; fewer than n0 + n with ``--radii``).

Inputs: folders written by ``probust certify`` (:attr:`probust.experiments.Results.certified`).

Outputs: ``certified_accuracy.csv``, one row per (model, sigma): points, abstentions, certified
accuracy at a few radii, the estimate's at the same radii, the draws per point (mean, median,
min, max); ``certified_accuracy_curve.csv``, the curves (model, sigma, curve, radius, accuracy);
one figure (the curves; a histogram of the draws per point).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "certified_accuracy"
TITLE = "12. Certified accuracy by randomized smoothing"
DESCRIPTION = (
    "From <code>probust certify</code> folders: the share of points whose smoothed class (Cohen et al.'s CERTIFY) "
    "is correct and certified at L2 radius ≥ r, against r, per model and σ (solid). Where the folder holds an "
    "analytic estimate (<code>--estimate taylor|mmse</code>), the same curve from σ Φ<sup>−1</sup>(p) of that "
    "estimate is dashed beside it: an estimate, with no guarantee. Radii are in the units of the tensors the model "
    "receives (pixels in [0, 1] for probust's models). Right: the noisy forward passes spent per point."
)
#: The radii the table reports (units of the model's inputs, L2).
TABLE_RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Points of each curve.
CURVE_POINTS = 200


def _accuracy(ok: np.ndarray, radius: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """float64 [R]: the share of points with ``ok`` and ``radius >= r`` for each r of ``radii``."""
    if len(ok) == 0:
        return np.zeros(len(radii))
    return ((radius[:, None] >= radii[None, :]) & ok[:, None]).mean(axis=0)


def _groups(run: Run):
    for sigma, group in run.table.groupby("sigma", sort=True):
        yield float(sigma), group


def _has_estimate(group: pd.DataFrame) -> bool:
    return "radius_estimate" in group and bool(group["radius_estimate"].notna().any())


def _estimate_ok(group: pd.DataFrame) -> np.ndarray:
    return (group["estimate_target"].to_numpy() == group["label"].to_numpy()) & group[
        "radius_estimate"
    ].notna().to_numpy()


def curves(run: Run) -> pd.DataFrame:
    """One row per (sigma, curve, radius): the certified accuracy ("certificate") and, where the
    folder has them, the estimate's ("estimate (taylor)"), on a grid from 0 past the largest radius."""
    rows = []
    method = (run.config.get("run") or {}).get("estimate")
    for sigma, group in _groups(run):
        radius = group["radius"].to_numpy(dtype=float)
        top = radius.max() if len(radius) else 0.0
        if _has_estimate(group):
            finite = group["radius_estimate"].to_numpy(dtype=float)
            finite = finite[np.isfinite(finite)]
            top = max(top, finite.max() if len(finite) else 0.0)
        grid = np.linspace(0.0, top * 1.05 if top > 0 else sigma, CURVE_POINTS)
        curve = {"certificate": _accuracy(group["correct"].to_numpy(dtype=bool), radius, grid)}
        if _has_estimate(group):
            estimate = np.nan_to_num(group["radius_estimate"].to_numpy(dtype=float), nan=0.0)
            curve[f"estimate ({method})"] = _accuracy(_estimate_ok(group), estimate, grid)
        for name, values in curve.items():
            rows += [
                {"model": run.label, "sigma": sigma, "curve": name, "radius": r, "accuracy": a}
                for r, a in zip(grid, values, strict=True)
            ]
    return pd.DataFrame(rows)


def summary(run: Run) -> pd.DataFrame:
    """One row per sigma of the run: points, abstentions, certified accuracy (and the estimate's)
    at :data:`TABLE_RADII`, and the draws per point."""
    rows = []
    radii = np.array(TABLE_RADII)
    for sigma, group in _groups(run):
        row: dict = {
            "model": run.label,
            "sigma": sigma,
            "points": len(group),
            "abstained": float((group["prediction"] == -1).mean()),
        }
        certified = _accuracy(group["correct"].to_numpy(dtype=bool), group["radius"].to_numpy(dtype=float), radii)
        row |= {f"certified@{r:g}": a for r, a in zip(radii, certified, strict=True)}
        if _has_estimate(group):
            estimate = np.nan_to_num(group["radius_estimate"].to_numpy(dtype=float), nan=0.0)
            row |= {
                f"estimate@{r:g}": a
                for r, a in zip(radii, _accuracy(_estimate_ok(group), estimate, radii), strict=True)
            }
        drawn = group["n_drawn"].to_numpy(dtype=float)
        row |= {
            "draws_mean": drawn.mean(),
            "draws_median": float(np.median(drawn)),
            "draws_min": drawn.min(),
            "draws_max": drawn.max(),
        }
        rows.append(row)
    return pd.DataFrame(rows)


def _plot(curve: pd.DataFrame, runs: list[Run], stem: Path) -> Path:
    with style.style_context():
        fig, axes = style.new_figure(1, 2, width=10.0, height=4.0)
        ax = axes[0, 0]
        keys = list(curve[["model", "sigma"]].drop_duplicates().itertuples(index=False, name=None))
        colours = dict(zip(keys, _colours(len(keys)), strict=True))
        for (model, sigma), colour in colours.items():
            mine = curve[(curve["model"] == model) & (curve["sigma"] == sigma)]
            for name, group in mine.groupby("curve", sort=False):
                dashed = str(name).startswith("estimate")
                ax.plot(
                    group["radius"],
                    group["accuracy"],
                    color=colour,
                    linestyle="--" if dashed else "-",
                    label=f"{model}, σ={sigma:g}" + (f", {name}" if dashed else ""),
                )
        ax.set_xlabel("L2 radius r (units of the model's inputs)")
        ax.set_ylabel("certified accuracy at r")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("certified accuracy (dashed: analytic estimate, no guarantee)")
        ax.legend(frameon=False, fontsize=8)
        ax = axes[0, 1]
        for run in runs:
            for sigma, group in _groups(run):
                ax.hist(
                    group["n_drawn"],
                    bins=30,
                    histtype="step",
                    color=colours.get((run.label, sigma), "#444444"),
                    label=f"{run.label}, σ={sigma:g}",
                )
        ax.set_xlabel("noisy forward passes per point (n0 + estimation draws)")
        ax.set_ylabel("points")
        ax.set_title("draws spent per point")
        ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _colours(n: int) -> list:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


class CertifiedAccuracy(Experiment):
    """Certified accuracy against radius (and the analytic estimate's), and the draws per point."""

    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(self, results: Results, out: str | Path, *args, **options) -> Output:
        out = Path(out)
        runs = results.certified
        if not runs:
            raise ExperimentSkipped("no probust certify folder among the results")
        table = pd.concat([summary(r) for r in runs], ignore_index=True)
        curve = pd.concat([curves(r) for r in runs], ignore_index=True)
        figure = _plot(curve, runs, out / NAME)
        reading = []
        for row in table.to_dict("records"):
            line = (
                f"{row['model']}, σ={row['sigma']:g}: certified accuracy {fmt(row['certified@0'])} at r = 0 "
                f"and {fmt(row['certified@0.5'])} at r = 0.5; {fmt(100 * row['abstained'])}% abstained; "
                f"{fmt(row['draws_mean'])} draws per point on average"
            )
            if pd.notna(row.get("estimate@0.5", np.nan)):
                line += f"; the analytic estimate gives {fmt(row['estimate@0.5'])} at r = 0.5"
            reading.append(line + ".")
        return self.output(
            out,
            tables={NAME: table, "curve": curve},
            figures=[figure],
            reading=reading,
            settings={"radii": list(TABLE_RADII), "folders": [str(r.path) for r in runs]},
        )

    def display(self, output: Output) -> list[Shown]:
        return [
            (
                "certified accuracy per model and σ (draws: noisy forward passes per point)",
                output.tables.get(NAME, pd.DataFrame()),
            )
        ]


EXPERIMENT = CertifiedAccuracy()
