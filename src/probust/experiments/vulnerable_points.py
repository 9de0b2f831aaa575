"""Experiment 8: vulnerable and canonical points, and what the noise looks like.

The paper's figures 4, "images with the lowest and highest p_robust and p_softmax" and
"examples of noisy images": per class (true label), the images with the lowest p^mmse (close to
a decision boundary: "support vectors") and the highest (far from it: "canonical" examples),
next to the images with the lowest and highest softmax probability; and a few images with
Gaussian noise of each sigma added, as the model sees them.

Outputs: ``vulnerable_points.csv``, the images shown (class, score, end, rank, values); two
figures (the per-class grid, and the noisy examples).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import case_sigma, fmt, pool
from probust.experiments.datasets import images, load_dataset
from probust.experiments.run_info import Run
from probust.experiments.runs import Results
from probust.plots.images import Cell, image_panel, to_display

NAME = "vulnerable_points"
TITLE = "8. Vulnerable and canonical points"
DESCRIPTION = (
    "Per class (true label), the scored images with the lowest and highest p<sup>mmse</sup> at one σ, and with the "
    "lowest and highest p<sup>softmax</sup>, each captioned with its value; below, images with Gaussian noise of each "
    "σ added (shown clipped to [0, 1]; the model sees them unclipped), captioned with p<sup>mmse</sup> where scored."
)
GROUPS = (
    ("mmse", "lowest", "lowest p^mmse"),
    ("mmse", "highest", "highest p^mmse"),
    ("softmax", "lowest", "lowest p^softmax"),
    ("softmax", "highest", "highest p^softmax"),
)


def selection(points: pd.DataFrame, k: int) -> pd.DataFrame:
    """Per class, the k lowest and highest by p^mmse and by softmax (ties broken by index)."""
    rows = []
    for c, g in points.groupby("label"):
        for score, end, _ in GROUPS:
            col = "p_mmse" if score == "mmse" else "softmax"
            ordered = g.sort_values([col, "index"], ascending=[end == "lowest", True])
            for rank, r in enumerate(ordered.head(k).itertuples(), start=1):
                rows.append(
                    {
                        "class": int(c),
                        "score": score,
                        "end": end,
                        "rank": rank,
                        "index": int(r.index),
                        "prediction": int(r.prediction),
                        "p_mmse": float(r.p_mmse),
                        "softmax": float(r.softmax),
                    }
                )
    return pd.DataFrame(rows)


def _grid_figure(
    sel: pd.DataFrame, pics: dict[int, np.ndarray], names: list[str], run: Run, sigma: float, k: int, stem: Path
) -> Path:
    """Four panels of :func:`probust.plots.images.image_panel` (lowest / highest p^mmse and softmax)."""
    classes = sorted(sel["class"].unique())
    with style.style_context():
        fig, axes = style.new_figure(
            1, len(GROUPS), width=len(GROUPS) * k * 0.62 + 1.8, height=len(classes) * 0.66 + 1.1
        )
        for gi, (score, end, label) in enumerate(GROUPS):
            rows: list[list[Cell | None]] = []
            for c in classes:
                picks = sel[(sel["class"] == c) & (sel["score"] == score) & (sel["end"] == end)].sort_values("rank")
                line: list[Cell | None] = []
                for j in range(k):
                    if j >= len(picks):
                        line.append(None)
                        continue
                    r = picks.iloc[j]
                    value = r["p_mmse"] if score == "mmse" else r["softmax"]
                    wrong = int(r["prediction"]) != c
                    line.append((to_display(pics[int(r["index"])]), f"{value:.2f}" + ("*" if wrong else ""), wrong))
                rows.append(line)
            row_labels = [names[c] if c < len(names) else str(c) for c in classes] if gi == 0 else None
            image_panel(axes[0, gi], rows, row_labels, style.METHOD_LABELS[score].join(label.split(f"p^{score}")))
        fig.suptitle(
            f"{run.label}: per class, the {k} scored images with the lowest / highest p$^{{\\mathrm{{mmse}}}}$ (σ={sigma:g}) "
            f"and softmax probability (caption: the value; red *: misclassified)",
            fontsize=10,
        )
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _noisy_figure(ds, run: Run, indices: list[int], sigmas: list[float], seed: int, stem: Path) -> Path:
    clean = images(ds, indices)
    names = run.classes
    w = run.wide()
    gen = torch.Generator().manual_seed(int(seed))
    with style.style_context():
        fig, axes = style.new_figure(
            len(indices), len(sigmas) + 1, width=1.35 * (len(sigmas) + 1) + 0.6, height=1.55 * len(indices) + 0.5
        )
        grey = clean.shape[1] == 1
        for row, (i, img) in enumerate(zip(indices, clean)):
            label = int(run.table.loc[run.table["index"] == i, "label"].iloc[0])
            for col in range(len(sigmas) + 1):
                ax = axes[row, col]
                ax.set_xticks([])
                ax.set_yticks([])
                ax.grid(False)
                for s in ax.spines.values():
                    s.set_visible(False)
                if col == 0:
                    shown = img
                    ax.set_ylabel(names[label] if label < len(names) else str(label), fontsize=9)
                    caption = "original"
                else:
                    sigma = sigmas[col - 1]
                    noise = torch.randn(img.shape, generator=gen).numpy() * sigma
                    shown = img + noise
                    p = w[(w["index"] == i) & (w["sigma"] == sigma)]
                    caption = (
                        f"p$^{{\\mathrm{{mmse}}}}$={p['p_mmse'].iloc[0]:.2f}"
                        if len(p) and "p_mmse" in p and p["p_mmse"].notna().iloc[0]
                        else ""
                    )
                    if row == 0:
                        ax.set_title(f"σ={sigma:g}", fontsize=10)
                ax.imshow(
                    to_display(shown, rescale=False),
                    cmap="gray" if grey else None,
                    vmin=0,
                    vmax=1,
                    interpolation="nearest",
                )
                ax.set_xlabel(caption, fontsize=7.5, labelpad=2)
        fig.suptitle(f"Gaussian noise of each σ on {run.dataset} images (pixel values in [0, 1])", fontsize=10)
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _reading(sel: pd.DataFrame, points: pd.DataFrame, names: list[str], sigma: float) -> list[str]:
    out = []
    low = sel[(sel["score"] == "mmse") & (sel["end"] == "lowest")]
    high = sel[(sel["score"] == "mmse") & (sel["end"] == "highest")]
    wrong_low = (low["prediction"] != low["class"]).mean()
    wrong_high = (high["prediction"] != high["class"]).mean()
    out.append(
        f"Among the images with the lowest p<sup>mmse</sup> at σ={sigma:g}, {fmt(100 * wrong_low)}% are misclassified; among "
        f"those with the highest, {fmt(100 * wrong_high)}% (over {points['index'].nunique()} scored points)."
    )
    both = {}
    for end in ("lowest", "highest"):
        a = set(sel[(sel["score"] == "mmse") & (sel["end"] == end)]["index"])
        b = set(sel[(sel["score"] == "softmax") & (sel["end"] == end)]["index"])
        both[end] = len(a & b) / max(len(a), 1)
    out.append(
        f"The p<sup>mmse</sup> and softmax selections share {fmt(100 * both['lowest'])}% of the lowest and "
        f"{fmt(100 * both['highest'])}% of the highest images: the two scores pick {'largely different' if max(both.values()) < 0.5 else 'partly the same'} images."
    )
    med = points.groupby("label")["p_mmse"].median().sort_values()
    out.append(
        f"Median p<sup>mmse</sup> per class ranges from {fmt(med.iloc[0])} ({names[int(med.index[0])]}) to {fmt(med.iloc[-1])} "
        f"({names[int(med.index[-1])]})."
    )
    return out


class VulnerablePoints(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION

    def run(
        self,
        results: Results,
        out: str | Path,
        *,
        model: str | None = None,
        sigma: float | None = None,
        k: int = 4,
        noisy_examples: int = 3,
    ) -> Output:
        """Image grids for one run (default: the primary run).

        Args:
            model: label of the run.
            sigma: the noise level of p^mmse (default: the one with the most MMSE rows).
            k: images per class and group.
            noisy_examples: how many images to show with noise added.
        """
        out = Path(out)
        target = results.by_label(model) if model else results.primary()
        if target is None or not target.has("mmse"):
            raise ExperimentSkipped("no run holds mmse rows")
        chosen = float(sigma) if sigma is not None else case_sigma(target)
        points = pool(target, chosen)
        if points.empty:
            raise ExperimentSkipped(f"{target.label} has no mmse rows at σ={chosen:g}")
        ds = load_dataset(target, images_only=True)
        sel = selection(points, k)
        sel.insert(0, "model", target.label)
        sel.insert(1, "sigma", chosen)
        names = target.classes
        sel.insert(3, "class_name", [names[c] for c in sel["class"]])
        pics = dict(zip(sel["index"].unique().tolist(), images(ds, sel["index"].unique())))
        figures = [_grid_figure(sel, pics, names, target, chosen, k, out / NAME)]
        # noisy examples: the first scored point of evenly spread classes, among points scored at every sigma
        core = target.table[target.table["index"].isin(target.core_indices)].drop_duplicates("index")
        classes = sorted(core["label"].unique())
        want = [
            classes[int(round(j * (len(classes) - 1) / max(noisy_examples - 1, 1)))]
            for j in range(min(noisy_examples, len(classes)))
        ]
        examples = [int(core[core["label"] == c]["index"].iloc[0]) for c in dict.fromkeys(want)]
        figures.append(_noisy_figure(ds, target, examples, target.sigmas, target.seed, out / f"{NAME}_noisy"))
        return self.output(
            out,
            tables={NAME: sel},
            figures=figures,
            reading=_reading(sel, points, names, chosen),
            settings={
                "model": target.label,
                "sigma": chosen,
                "k": k,
                "pool_points": int(len(points)),
                "noisy_examples": examples,
            },
        )

    def display(self, output: Output) -> list[Shown]:
        return []  # the figures are the result; the table lists the images shown


EXPERIMENT = VulnerablePoints()
