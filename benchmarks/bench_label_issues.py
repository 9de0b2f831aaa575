"""Label errors from one training run (probust.issues.Tracker) against the loss history, the margin
history and 5-fold cleanlab, in the memorising regime.

    python benchmarks/bench_label_issues.py                       # docs/issues.md's tables (2 processes)
    python benchmarks/bench_label_issues.py --seeds 0 --settings sym0.2 --data fashion-mnist   # a quick look

Needs cleanlab (``pip install cleanlab==2.9.0``: a benchmark-only dependency, never probust's),
scikit-learn and Debian's Fashion-MNIST files. For every data set, noise setting (symmetric flips
to a uniform other class, or class-conditional flips to a confusable class, at each rate) and seed:

- **one training run** (Adam, the data set's architecture and epochs) watched by a
  :class:`probust.issues.Tracker` (its updates timed apart from the training), and, from the same
  run at no cost, every training step's per-point loss, margin and correctness: the cumulative
  sample loss (CSL), the Area Under the Margin (AUM, Pleiss et al. 2020) and forgetting counts
  (Toneva et al. 2019); after every 4th epoch the input-gradient norm of the loss (CSG, summed) and
  at two snapshots the input-loss curvature (Garg et al. 2024, one probe), each timed; the finished model's
  self-confidence, margin and ``probust.find_issues`` label score;
- **5-fold cleanlab**: five models of the same architecture and epochs, each trained without one
  fold, give the out-of-sample probabilities for cleanlab's three label-quality scores and
  ``find_label_issues``.

Printed per score, mean (min-max) over seeds: AUROC and AUPRC of "the label is wrong" (low score =
suspect), precision among the lowest-scored true-noise-rate share, the Spearman correlation with
the loss history (CSL), the cost in seconds; the flags' F1; memorised points (the run's model fits
the given label, the fold model that held the point out does not) ranked among the fitted ones;
the fit (share of given labels the run's model predicts), and the tracker's cost against the
training it watched. Every number follows from the flags; ``--json`` keeps them all.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score, roc_auc_score
from torch import nn

import probust
from probust import data as pdata
from probust.issues import Tracker, find_issues

#: Class-conditional flips (confusable classes). Fashion-MNIST: t-shirt <-> shirt, pullover <->
#: coat, sandal -> sneaker -> ankle boot -> sandal, trouser -> dress -> t-shirt, bag -> pullover.
#: Digits: 1 <-> 7, 3 <-> 8, 5 <-> 6, 4 -> 9 -> 4, 0 -> 6, 2 -> 7.
FLIPS = {
    "fashion-mnist": {0: 6, 6: 0, 2: 4, 4: 2, 5: 7, 7: 9, 9: 5, 1: 3, 3: 0, 8: 2},
    "digits": {1: 7, 7: 1, 3: 8, 8: 3, 5: 6, 6: 5, 4: 9, 9: 4, 0: 6, 2: 7},
}
#: Per data set: points, epochs, learning rate, batch size.
SETUP = {"fashion-mnist": (2000, 24, 1e-3, 128), "digits": (1797, 40, 3e-3, 32)}
SETTINGS = ("sym0.1", "sym0.2", "sym0.4", "asym0.1", "asym0.25")


def noisy(y: np.ndarray, rate: float, kind: str, seed: int, data: str) -> np.ndarray:
    """Labels with about a ``rate`` share flipped: to a uniformly drawn other class ("sym") or to
    the class's confusable partner ("asym")."""
    rng = np.random.default_rng(seed)
    flip = rng.random(len(y)) < rate
    out = y.copy()
    if kind == "sym":
        out[flip] = (y[flip] + rng.integers(1, 10, size=len(y))[flip]) % 10
    else:
        out[flip] = [FLIPS[data][int(c)] for c in y[flip]]
    return out


def factory(data: str) -> nn.Module:
    """Fashion-MNIST: conv 32 / conv 64 / 256 hidden (3x3 convolutions, max-pooling); digits (8 x 8):
    a 512-unit MLP. Both fit most of their noisy labels in the epochs of :data:`SETUP`."""
    if data == "digits":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 49, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def load(data: str) -> tuple[torch.Tensor, np.ndarray]:
    n = SETUP[data][0]
    if data == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return torch.tensor(d.images[:n, None] / 16.0, dtype=torch.float32), d.target[:n].astype(np.int64)
    x, y = pdata.load("fashion-mnist", "train").tensors()
    return x[:n], y[:n].numpy()


def _margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    other = logits.scatter(1, y[:, None], -float("inf")).amax(1)
    return logits.gather(1, y[:, None])[:, 0] - other


def train(data, x, y, seed, tracker=None, baselines=False):
    """One training run (Adam); with ``baselines`` also each step's per-point loss, margin and
    correctness, the loss's input-gradient norm after each epoch and four snapshots. Returns the
    model, the records and the seconds of training, tracking and each baseline's extra work."""
    _, epochs, lr, batch_size = SETUP[data]
    torch.manual_seed(seed)
    model = factory(data)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    shuffle = torch.Generator().manual_seed(seed)
    n = len(x)
    rec = {k: np.zeros((epochs, n), np.float32) for k in ("loss", "margin", "correct", "csg")}
    snaps, cost = [], defaultdict(float)
    for epoch in range(epochs):
        started = time.perf_counter()
        model.train()
        for b in torch.randperm(n, generator=shuffle).split(batch_size):
            logits = model(x[b])
            losses = nn.functional.cross_entropy(logits, y[b], reduction="none")
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            if baselines:
                with torch.no_grad():
                    rec["loss"][epoch, b] = losses.numpy()
                    rec["margin"][epoch, b] = _margin(logits, y[b]).numpy()
                    rec["correct"][epoch, b] = (logits.argmax(1) == y[b]).numpy()
        cost["train"] += time.perf_counter() - started
        if tracker is not None:
            started = time.perf_counter()
            tracker.update(model)
            cost["tracker"] += time.perf_counter() - started
        if baselines and epoch % 4 == 3:  # CSG's input gradients every 4th epoch, as the tracker's
            started = time.perf_counter()
            rec["csg"][epoch] = loss_gradient_norm(model, x, y)
            cost["CSG"] += time.perf_counter() - started
        if baselines and epoch % (epochs // 2) == epochs // 2 - 1:  # curvature: two snapshots
            snaps.append({k: v.clone() for k, v in model.state_dict().items()})
    return model.eval(), rec, snaps, cost


def loss_gradient_norm(model, x, y):
    model.eval()
    out = np.zeros(len(x), np.float32)
    for i in range(0, len(x), 500):
        xi = x[i : i + 500].clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(model(xi), y[i : i + 500], reduction="sum")
        out[i : i + 500] = torch.autograd.grad(loss, xi)[0].flatten(1).norm(dim=1).numpy()
    return out


def curvature(data, snaps, x, y, seed, h=1e-3, probes=1):
    """Garg et al. (ICML 2024): Hutchinson's estimate of the input-loss curvature tr(H^2) by finite
    differences of input gradients, over probes and snapshots. High = memorised / mislabelled."""
    g = torch.Generator().manual_seed(seed)
    total = np.zeros(len(x))
    model = factory(data).eval()
    for state in snaps:
        model.load_state_dict(state)
        for _ in range(probes):
            v = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
            for i in range(0, len(x), 500):
                grads = []
                for xi in (x[i : i + 500].clone(), x[i : i + 500] + h * v[i : i + 500]):
                    xi.requires_grad_(True)
                    loss = nn.functional.cross_entropy(model(xi), y[i : i + 500], reduction="sum")
                    grads.append(torch.autograd.grad(loss, xi)[0])
                total[i : i + 500] += (grads[1] - grads[0]).flatten(1).pow(2).sum(1).numpy() / h**2
    return total / (len(snaps) * probes)


def fold_probabilities(data, x, y, seed, k=5):
    """cleanlab's out-of-sample probabilities: k models of the same architecture and epochs."""
    order = np.random.default_rng(seed).permutation(len(x))
    probs = np.zeros((len(x), 10))
    for part in np.array_split(order, k):
        keep = np.setdiff1d(np.arange(len(x)), part)
        model, _, _, _ = train(data, x[keep], y[keep], seed)
        with torch.no_grad():
            probs[part] = torch.softmax(model(x[part]).double(), 1).numpy()
    return probs


def metrics(bad, score, csl, seconds):
    k = max(1, int(round(bad.mean() * len(bad))))
    top = np.argsort(score, kind="stable")[:k]
    return {
        "auroc": roc_auc_score(bad, -score),
        "auprc": average_precision_score(bad, -score),
        "precision": float(bad[top].mean()),
        "spearman_csl": float(spearmanr(score, -csl)[0]),
        "seconds": seconds,
    }


def f1(flags, bad):
    tp = (flags & bad).sum()
    p, r = tp / max(flags.sum(), 1), tp / max(bad.sum(), 1)
    return {"f1": 0.0 if p + r == 0 else 2 * p * r / (p + r), "precision": p, "recall": r, "flagged": int(flags.sum())}


def one_run(job):
    data, setting, seed = job
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    kind, rate = ("asym", float(setting[4:])) if setting.startswith("asym") else ("sym", float(setting[3:]))
    x, y_true = load(data)
    y = noisy(y_true, rate, kind, seed, data)
    bad = y != y_true
    yt = torch.as_tensor(y)
    started = time.perf_counter()
    tracker = Tracker((x, yt), seed=seed)
    cost = {"tracker_setup": time.perf_counter() - started}
    model, rec, snaps, run_cost = train(data, x, yt, seed, tracker=tracker, baselines=True)
    cost.update(run_cost)
    started = time.perf_counter()
    frame = tracker.find_issues()
    cost["tracker"] += time.perf_counter() - started + cost.pop("tracker_setup")
    started = time.perf_counter()
    probs_oos = fold_probabilities(data, x, yt, seed)
    cost["folds"] = time.perf_counter() - started
    started = time.perf_counter()
    final = find_issues(model, (x, yt), seed=seed, show_progress=False)
    cost["find_issues"] = time.perf_counter() - started
    started = time.perf_counter()
    curv = curvature(data, snaps, x, yt, seed)
    cost["curvature"] = time.perf_counter() - started

    csl = rec["loss"].sum(0).astype(np.float64)
    with torch.no_grad():
        logits = model(x).double()
    probs = torch.softmax(logits, 1).numpy()
    rows = np.arange(len(y))
    scores = {
        "probust Tracker label_score": (frame["label_score"].to_numpy(), cost["tracker"]),
        "CSL (cumulative loss)": (-csl, 0.0),
        "AUM (mean margin)": (rec["margin"].mean(0).astype(np.float64), 0.0),
        "forgetting events": (-_forgetting(rec["correct"]), 0.0),
        "CSG (cumulative input gradient)": (-rec["csg"].sum(0).astype(np.float64), cost["CSG"]),
        "curvature": (-curv, cost["curvature"]),
        "final self-confidence": (probs[rows, y], 0.0),
        "final margin": (_margin(logits, yt).numpy(), 0.0),
        "final probust find_issues": (final["label_score"].to_numpy(), cost["find_issues"]),
    }
    for name in ("self_confidence", "normalized_margin", "confidence_weighted_entropy"):
        scores[f"5-fold cleanlab {name}"] = (get_label_quality_scores(y, probs_oos, method=name), cost["folds"])
    fits = probs.argmax(1) == y
    memorised = fits & (probs_oos.argmax(1) != y)
    return {
        "key": f"{data} {setting} {seed}",
        "fit": float(fits.mean()),
        "noise": float(bad.mean()),
        "cost": cost,
        "scores": {name: metrics(bad, s, csl, c) for name, (s, c) in scores.items()},
        "flags": {
            "probust Tracker is_label_issue": f1(frame["is_label_issue"].to_numpy(), bad),
            "5-fold cleanlab find_label_issues": f1(find_label_issues(y, probs_oos, n_jobs=1), bad),
            "final probust find_issues is_label_issue": f1(final["is_label_issue"].to_numpy(), bad),
        },
        "memorised": {
            "count": int(memorised.sum()),
            **{
                name: float(roc_auc_score(memorised[fits], value[fits]))
                for name, value in {
                    "probust Tracker memorisation_score": frame["memorisation_score"].to_numpy(),
                    "-AUM": -rec["margin"].mean(0),
                    "CSL": csl,
                    "curvature": curv,
                    "1 - final self-confidence": 1 - probs[rows, y],
                    "-Tracker label_score": -frame["label_score"].to_numpy(),
                }.items()
            },
        },
    }


def outliers_run(seed):
    """Atypical training points: 60 of scikit-learn's digits (upscaled to 28 x 28, each with a
    uniformly drawn label) among the Fashion-MNIST points at 20% symmetric noise. AUROC of "this
    point is a digit" for the tracker's outlier_score and its label_score, cleanlab's
    OutOfDistribution on the folds' out-of-sample probabilities, and 1 - max softmax (out of
    sample and the run's finished model)."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from cleanlab.outlier import OutOfDistribution
    from sklearn.datasets import load_digits

    data = "fashion-mnist"
    x, y_true = load(data)
    y = noisy(y_true, 0.2, "sym", seed, data)
    rng = np.random.default_rng(seed + 100)
    digits = load_digits()
    pick = rng.choice(len(digits.images), 60, replace=False)
    small = torch.as_tensor(digits.images[pick] / 16.0, dtype=torch.float32)[:, None]
    big = nn.functional.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1)
    x = torch.cat([x, big])
    y = np.concatenate([y, rng.integers(0, 10, 60)])
    atypical = np.r_[np.zeros(len(y_true), bool), np.ones(60, bool)]
    yt = torch.as_tensor(y)
    tracker = Tracker((x, yt), seed=seed)
    model, _, _, _ = train(data, x, yt, seed, tracker=tracker)
    frame = tracker.find_issues()
    probs_oos = fold_probabilities(data, x, yt, seed)
    with torch.no_grad():
        final = torch.softmax(model(x).double(), 1).numpy()
    ood = OutOfDistribution().fit_score(pred_probs=probs_oos, labels=y, verbose=False)
    return {
        "key": f"outliers {seed}",
        "auroc": {
            "probust Tracker outlier_score": roc_auc_score(atypical, frame["outlier_score"]),
            "probust Tracker -label_score": roc_auc_score(atypical, -frame["label_score"]),
            "5-fold cleanlab OutOfDistribution(pred_probs)": roc_auc_score(atypical, -ood),
            "5-fold 1 - max softmax": roc_auc_score(atypical, -probs_oos.max(1)),
            "final model 1 - max softmax": roc_auc_score(atypical, -final.max(1)),
        },
    }


def _forgetting(correct: np.ndarray) -> np.ndarray:
    c = correct.astype(bool)
    return (c[:-1] & ~c[1:]).sum(0).astype(np.float64) + 0.5 * (~c[-1])


def summary(results):
    """Mean (min-max) over seeds, per data set, setting and score."""
    table = defaultdict(lambda: defaultdict(list))
    for r in results:
        data, setting, _ = r["key"].split()
        for name, m in r["scores"].items():
            for key, value in m.items():
                table[(data, setting, name)][key].append(value)
        for name, m in r["flags"].items():
            for key in ("f1", "flagged"):
                table[(data, setting, "flags: " + name)][key].append(m[key])
        for name, value in r["memorised"].items():
            table[(data, setting, "memorised: " + name)]["auroc" if name != "count" else "count"].append(value)
        table[(data, setting, "run")]["fit"].append(r["fit"])
        table[(data, setting, "run")]["noise"].append(r["noise"])
        for name, value in r["cost"].items():
            table[(data, setting, "cost")][name].append(value)
        table[(data, setting, "cost")]["tracker / train"].append(r["cost"]["tracker"] / r["cost"]["train"])
        table[(data, setting, "cost")]["tracked run / 5 folds"].append(
            (r["cost"]["tracker"] + r["cost"]["train"]) / r["cost"]["folds"]
        )
    for (data, setting, name), values in table.items():
        cells = []
        for key, vs in values.items():
            spread = f" ({min(vs):.3f}-{max(vs):.3f})" if len(vs) > 1 else ""
            cells.append(f"{key} {statistics.mean(vs):.4f}{spread}")
        print(f"{data:<13} {setting:<8} {name:<44} " + "  ".join(cells))


def markdown(results) -> None:
    """docs/issues.md's tables: per data set, each score's mean over seeds per setting."""

    def mean(values):
        return statistics.mean(values) if values else float("nan")

    for data in dict.fromkeys(r["key"].split()[0] for r in results):
        runs = [r for r in results if r["key"].startswith(data + " ")]
        settings = list(dict.fromkeys(r["key"].split()[1] for r in runs))
        head = "| | " + " | ".join(settings) + " |\n|---|" + "---|" * len(settings)

        def row(name, get, fmt="{:.4f}", runs=runs, settings=settings):
            cells = [fmt.format(mean([get(r) for r in runs if r["key"].split()[1] == s])) for s in settings]
            return f"| {name} | " + " | ".join(cells) + " |"

        print(f"\n**{data}**: fit (share of given labels the run's model predicts) and noise\n\n{head}")
        count = {s: sum(r["key"].split()[1] == s for r in runs) for s in settings}
        print(row("seeds", lambda r, count=count: count[r["key"].split()[1]], "{:.0f}"))
        print(row("fit", lambda r: r["fit"], "{:.3f}"))
        print(row("noise", lambda r: r["noise"], "{:.3f}"))
        for metric in ("auroc", "auprc", "precision"):
            print(f"\n**{data}**: {metric} (mean over the seeds)\n\n{head}")
            for name in runs[0]["scores"]:
                print(row(name, lambda r, n=name, m=metric: r["scores"][n][m]))
        print(f"\n**{data}**: flags' F1\n\n{head}")
        for name in runs[0]["flags"]:
            print(row(name, lambda r, n=name: r["flags"][n]["f1"]))
        print(f"\n**{data}**: memorised points, AUROC among the fitted ones (count)\n\n{head}")
        print(row("memorised points", lambda r: r["memorised"]["count"], "{:.0f}"))
        for name in runs[0]["memorised"]:
            if name != "count":
                print(row(name, lambda r, n=name: r["memorised"][n]))
        print(f"\n**{data}**: seconds (one thread)\n\n{head}")
        for name in ("train", "tracker", "folds", "CSG", "curvature", "find_issues"):
            print(row(name, lambda r, n=name: r["cost"][n], "{:.1f}"))
        print(row("tracker / training", lambda r: r["cost"]["tracker"] / r["cost"]["train"], "{:.3f}"))
        print(
            row(
                "watched run / 5 folds",
                lambda r: (r["cost"]["tracker"] + r["cost"]["train"]) / r["cost"]["folds"],
                "{:.3f}",
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", nargs="+", default=["fashion-mnist", "digits"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--json", type=Path, help="write every number here (and read runs already there)")
    parser.add_argument("--only-done", action="store_true", help="print the runs --json holds, run nothing")
    parser.add_argument("--markdown", action="store_true", help="also print docs/issues.md's tables")
    parser.add_argument("--outliers", action="store_true", help="the atypical-points runs instead (one per seed)")
    args = parser.parse_args()
    if args.outliers:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            runs = pool.map(outliers_run, args.seeds)
        for name in runs[0]["auroc"]:
            values = [r["auroc"][name] for r in runs]
            print(f"outliers  {name:<48} auroc {statistics.mean(values):.4f} ({min(values):.3f}-{max(values):.3f})")
        if args.json:
            args.json.write_text(json.dumps(runs, default=float, indent=1))
        return
    print(
        f"probust {probust.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"setup {SETUP}, seeds {args.seeds}, {args.jobs} process(es) of one thread",
        flush=True,
    )
    done = {}
    if args.json and args.json.exists():
        done = {r["key"]: r for r in json.loads(args.json.read_text())}
    jobs = [(d, s, seed) for seed in args.seeds for d in args.data for s in args.settings]
    if args.only_done:  # report the runs the json holds, run nothing
        jobs = [j for j in jobs if f"{j[0]} {j[1]} {j[2]}" in done]
    todo = [j for j in jobs if f"{j[0]} {j[1]} {j[2]}" not in done]
    with multiprocessing.get_context("spawn").Pool(min(args.jobs, max(len(todo), 1))) as pool:
        for result in pool.imap_unordered(one_run, todo):
            done[result["key"]] = result
            print(f"  {result['key']}: fit {result['fit']:.3f}, costs {result['cost']}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(list(done.values()), default=float, indent=1))
    results = [done[f"{d} {s} {seed}"] for d, s, seed in jobs]
    summary(results)
    if args.markdown:
        markdown(results)


if __name__ == "__main__":
    main()
