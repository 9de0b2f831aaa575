"""Experiment 9: case study, can a small CNN tell robust from vulnerable images?

The paper's case study ("p_robust identifies images that are robust to and vulnerable to random
noise").

Inputs: one run's pool of points scored with p^mmse and softmax at one sigma, and its data set.
Per class, the k images with the highest and the k with the lowest p^mmse form a two-class data
set (high vs low); probust's small CNN (``cnn``: two convolutions and two fully connected
layers, two outputs) is trained on a random, stratified share and tested on the rest; the same
with the softmax probability; each over several seeds (split and initialisation).

Outputs: ``case_study.csv`` (per score: mean, standard deviation, min and max test accuracy
over seeds), ``case_study_seeds.csv`` (per seed), ``case_study_images.csv`` (the images of each
data set); one figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import case_sigma, fmt, pct, pool
from probust.experiments.datasets import images, load_dataset
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "case_study"
TITLE = "9. Case study: telling high-p from low-p images"
DESCRIPTION = (
    "Per class, the k images with the highest and the k with the lowest score form a high-vs-low data set; a small CNN "
    "(2 convolutions + 2 fully connected layers) is trained on a random 90% and tested on the other 10%. Score: "
    "p<sup>mmse</sup> at one σ, or p<sup>softmax</sup>. Each is repeated over several seeds (split and initialisation); "
    "dots are seeds, bars the mean ± one standard deviation, the dotted line chance (50%)."
)
SCORES = ("mmse", "softmax")


def groups(points: pd.DataFrame, score: str, k: int) -> pd.DataFrame:
    """Per class, the k highest (target 1) and k lowest (target 0) points by ``score``.

    With fewer than 2k points in a class, floor(n/2) of each.
    """
    col = "p_mmse" if score == "mmse" else "softmax"
    rows = []
    for c, g in points.groupby("label"):
        kk = min(k, len(g) // 2)
        if kk == 0:
            continue
        ordered = g.sort_values([col, "index"], ascending=[True, True])
        low, high = ordered.head(kk), ordered.tail(kk)
        rows += [
            {"index": int(i), "label": int(c), "target": 0, "value": float(v)} for i, v in zip(low["index"], low[col])
        ]
        rows += [
            {"index": int(i), "label": int(c), "target": 1, "value": float(v)} for i, v in zip(high["index"], high[col])
        ]
    return pd.DataFrame(rows)


def split(targets: np.ndarray, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random split stratified by target: (train positions, test positions)."""
    train, test = [], []
    for t in np.unique(targets):
        members = rng.permutation(np.flatnonzero(targets == t))
        n_test = max(1, int(round(test_fraction * members.size)))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def train_and_test(
    x: np.ndarray,
    y: np.ndarray,
    train_pos: np.ndarray,
    test_pos: np.ndarray,
    *,
    seed: int,
    epochs: int,
    mean,
    std,
    lr: float = 0.05,
    batch_size: int = 32,
) -> dict:
    """Train probust's small CNN (two outputs) on ``x[train_pos]`` and test it on ``x[test_pos]``."""
    from probust.data import ImageDataset
    from probust.models import build
    from probust.training import train

    def ds(pos, split_name):
        return ImageDataset(
            torch.from_numpy(x[pos]),
            torch.from_numpy(y[pos]),
            name="high-vs-low",
            split=split_name,
            classes=["low", "high"],
            scale=1.0,
            mean=mean,
            std=std,
        )

    result = train(
        ds(train_pos, "train"),
        "cnn",
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        out=None,
        show_progress=False,
        test_dataset=ds(test_pos, "test"),
    )
    params = sum(p.numel() for p in build("cnn", 2, tuple(x.shape[1:])).parameters())
    last = result.meta["history"][-1]
    return {
        "test_accuracy": float(result.meta["test_accuracy"]),
        "train_accuracy": float(last.get("train_accuracy", np.nan)),
        "parameters": int(params),
    }


def chance_half_width(n_test: int) -> float:
    """Half-width of the central 95% of a coin-flip classifier's accuracy on ``n_test`` images
    (normal approximation of a binomial(n_test, 1/2) over n_test): accuracies within 50% ± this are chance."""
    return 1.959963984540054 * 0.5 / np.sqrt(max(int(n_test), 1))


def too_few(per_class: pd.Series, k: int, summary: pd.DataFrame) -> str | None:
    """The warning the reading opens with when the pool is smaller than the study asks for
    (fewer than ``k`` images per class and end), or None.

    Args:
        per_class: images per end (high or low) for each class.
        k: the images per class and end asked for.
        summary: the per-score table (mean_accuracy, n_test).
    """
    if int(per_class.min()) >= k:
        return None
    n_test = int(summary["n_test"].min())
    band = chance_half_width(n_test)
    within = [
        f"{style.method_html(r.score)} {pct(r.mean_accuracy)}"
        for r in summary.itertuples()
        if abs(r.mean_accuracy - 0.5) <= band
    ]
    return (
        f"<b>Too few points for this study: read it as chance.</b> It asks for k = {k} images per class and end "
        f"(at least {2 * k} scored points per class); the pool holds {int(per_class.min())} per end in its smallest "
        f"class. Each seed tests {n_test} images, so a classifier that guesses scores 50% ± {pct(band)} (95%)"
        + (f", and {', '.join(within)} lie within it." if within else ".")
        + f" Score at least {2 * k} points per class with mmse and softmax at one σ (the paper: k = 25 on CIFAR-10)."
    )


def _plot(table: pd.DataFrame, summary: pd.DataFrame, title: str, stem: Path) -> Path:
    with style.style_context():
        fig, axes = style.new_figure(1, 1, width=5.2, height=3.8)
        ax = axes[0, 0]
        for k, score in enumerate(SCORES):
            t = table[table["score"] == score]
            if t.empty:
                continue
            s = summary[summary["score"] == score].iloc[0]
            color = style.method_color(score)
            ax.bar(k, s["mean_accuracy"], width=0.55, color=color, alpha=0.35)
            ax.errorbar(k, s["mean_accuracy"], yerr=s["std_accuracy"], color=color, capsize=6, linewidth=2)
            jitter = (np.arange(len(t)) - (len(t) - 1) / 2) * 0.05
            ax.scatter(k + jitter, t["test_accuracy"], color=color, s=22, zorder=3, edgecolor="white", linewidth=0.5)
            ax.text(
                k,
                min(1.0, s["mean_accuracy"] + s["std_accuracy"]) + 0.03,
                f"{100 * s['mean_accuracy']:.1f}%",
                ha="center",
                fontsize=9,
            )
        ax.axhline(0.5, color="#444444", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(SCORES)))
        ax.set_xticklabels([f"high vs low {style.method_label(s)}" for s in SCORES])
        ax.set_ylabel("test accuracy of the small CNN")
        ax.set_ylim(0.3, 1.08)
        ax.set_title(title, fontsize=10)
        ax.grid(False, axis="x")
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


class CaseStudy(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION
    measuring = True  # it trains small models

    def run(
        self,
        results: Results,
        out: str | Path,
        *,
        model: str | None = None,
        sigma: float | None = None,
        k: int = 25,
        seeds: int = 5,
        epochs: int = 30,
        test_fraction: float = 0.1,
        seed: int | None = None,
    ) -> Output:
        """Train and test the high-vs-low classifiers on one run's pool of scored points.

        Args:
            model: label of the run (default: the primary run).
            sigma: the noise level of p^mmse (default: the one with the most MMSE rows).
            k: images per class and end (the paper: 25).
            seeds: repetitions (each a new split and initialisation).
            epochs: training epochs of the small CNN.
            test_fraction: the test share (the paper: 10%).
            seed: base seed (default: the run's seed).
        """
        out = Path(out)
        target: Run | None = results.by_label(model) if model else results.primary()
        if target is None or not target.has("mmse"):
            raise ExperimentSkipped("no run holds mmse rows")
        chosen = float(sigma) if sigma is not None else case_sigma(target)
        points = pool(target, chosen)
        if points["label"].value_counts().min() < 4 if len(points) else True:
            raise ExperimentSkipped(f"too few scored points per class at σ={chosen:g} (need at least 4 per class)")
        ds = load_dataset(target, images_only=True)
        base = target.seed if seed is None else int(seed)
        mean = list(getattr(ds, "mean", [0.0]))
        std = list(getattr(ds, "std", [1.0]))
        rows, members = [], {}
        threads = torch.get_num_threads()
        for score in SCORES:
            g = groups(points, score, k)
            members[score] = g
            x = images(ds, g["index"].to_numpy()).astype(np.float32)
            y = g["target"].to_numpy().astype(np.int64)
            for s in range(seeds):
                rng = np.random.default_rng([base, s])
                tr, te = split(y, test_fraction, rng)
                res = train_and_test(x, y, tr, te, seed=base * 1000 + s, epochs=epochs, mean=mean, std=std)
                rows.append(
                    {
                        "model": target.label,
                        "sigma": chosen,
                        "score": score,
                        "seed": s,
                        "images": len(y),
                        "n_train": len(tr),
                        "n_test": len(te),
                        **res,
                    }
                )
        torch.set_num_threads(threads)
        table = pd.DataFrame(rows)
        summary = (
            table.groupby("score", sort=False)["test_accuracy"]
            .agg(mean_accuracy="mean", std_accuracy="std", min_accuracy="min", max_accuracy="max", seeds="count")
            .reset_index()
        )
        summary.insert(0, "model", target.label)
        summary["images"] = [int(len(members[s])) for s in summary["score"]]
        summary["n_test"] = [int(table[table["score"] == s]["n_test"].iloc[0]) for s in summary["score"]]
        a, b = members["mmse"], members["softmax"]
        shared = set(a["index"]) & set(b["index"])
        agree = pd.merge(a, b, on="index", suffixes=("_mmse", "_softmax"))
        same_side = float((agree["target_mmse"] == agree["target_softmax"]).mean()) if len(agree) else np.nan
        per_class = a.groupby("label").size() // 2
        each = (
            f"{int(per_class.max())}"
            if per_class.min() == per_class.max()
            else f"{int(per_class.min())}–{int(per_class.max())}"
        )
        title = f"{target.label}: top/bottom {each} per class by score (σ={chosen:g})"
        warning = too_few(per_class, k, summary)
        fig = _plot(table, summary, title, out / NAME)
        m = summary.set_index("score")
        reading = [
            f"Test accuracy over {seeds} seeds ({int(m.loc['mmse', 'n_test'])} test images each): high-vs-low p<sup>mmse</sup> "
            f"{pct(m.loc['mmse', 'mean_accuracy'])} ± {pct(m.loc['mmse', 'std_accuracy'])}, high-vs-low p<sup>softmax</sup> "
            f"{pct(m.loc['softmax', 'mean_accuracy'])} ± {pct(m.loc['softmax', 'std_accuracy'])} (the paper, CIFAR-10: 92% vs 58%).",
            f"The difference of the means is {fmt(100 * (m.loc['mmse', 'mean_accuracy'] - m.loc['softmax', 'mean_accuracy']))} points"
            + (
                f", against a seed-to-seed standard deviation of about {fmt(100 * float(summary['std_accuracy'].max()))} points."
                if summary["std_accuracy"].notna().any()
                else " (one seed: no spread to compare with)."
            ),
            f"The two data sets share {len(shared)} of {len(a)} images; of those, {pct(same_side)} are on the same side (high or low).",
        ]
        if warning:
            reading.insert(0, warning)
        return self.output(
            out,
            tables={
                NAME: summary,
                "seeds": table,
                "images": pd.concat([a.assign(score="mmse"), b.assign(score="softmax")], ignore_index=True),
            },
            figures=[fig],
            reading=reading,
            settings={
                "model": target.label,
                "sigma": chosen,
                "k": k,
                "seeds": seeds,
                "epochs": epochs,
                "test_fraction": test_fraction,
                "pool_points": int(len(points)),
                "cnn_parameters": int(table["parameters"].iloc[0]),
                **({"warning": warning} if warning else {}),
            },
        )

    def display(self, output: Output) -> list[Shown]:
        t = output.tables
        main = t.get(self.name, pd.DataFrame())
        return [
            ("Test accuracy of the high-vs-low classifier", main),
            ("Per seed", t.get("seeds", pd.DataFrame()).drop(columns=["model"], errors="ignore")),
        ]


EXPERIMENT = CaseStudy()
