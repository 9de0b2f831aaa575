"""probust.find_issues against cleanlab on the same folds: label errors, memorised points, outliers.

    python benchmarks/bench_label_issues.py                      # the docs' table (docs/issues.md)
    python benchmarks/bench_label_issues.py --n 1000 --seeds 0   # a quick look

Needs cleanlab (``pip install cleanlab==2.9.0``: a benchmark-only dependency, never probust's) and
Debian's Fashion-MNIST files. For every noise setting (symmetric and class-conditional flips at
each rate) and seed: the first ``--n`` training images get their labels flipped; ``--folds``
models (``probust.issues.train_folds``, Adam) give the out-of-sample scores, one model trained
on every point (the same loop, with each step's logits kept for the Area Under the Margin and
snapshots for the curvature) the in-sample ones. Printed per score: AUROC and AUPRC of "the label
is wrong" (low score = suspect), precision and recall among the lowest-scored ``true noise rate``
share of points, the Spearman correlation with the logit margin of the same model, and the cost
(trainings, seconds). Then the flags (``is_label_issue`` against cleanlab's
``find_label_issues``), memorised points, and outliers (scikit-learn's digits upscaled to 28 x 28
among Fashion-MNIST test images, against ``cleanlab.outlier.OutOfDistribution`` on pred_probs).
Every number follows from ``--seeds`` and the other flags.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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
from probust.issues import find_issues, train_folds

warnings.simplefilter("ignore")
#: Class-conditional flips (Fashion-MNIST's confusable pairs): t-shirt <-> shirt, pullover <->
#: coat, sandal -> sneaker -> ankle boot -> sandal, trouser -> dress -> coat, bag -> pullover.
ASYMMETRIC = {0: 6, 6: 0, 2: 4, 4: 2, 5: 7, 7: 9, 9: 5, 1: 3, 3: 4, 8: 2}
EPOCHS, LR, BATCH = 15, 1e-3, 128


def noisy(y: np.ndarray, rate: float, kind: str, seed: int) -> np.ndarray:
    """Labels with a ``rate`` share flipped: to a uniformly drawn other class ("sym") or to the
    class's confusable partner ("asym")."""
    rng = np.random.default_rng(seed)
    flip = rng.random(len(y)) < rate
    out = y.copy()
    if kind == "sym":
        out[flip] = (y[flip] + rng.integers(1, 10, size=len(y))[flip]) % 10
    else:
        out[flip] = [ASYMMETRIC[int(c)] for c in y[flip]]
    return out


def factory() -> nn.Module:
    """The paper's CNN (two 5x5 convolutions, 21,840 weights)."""
    return probust.models.build("cnn", 10, (1, 28, 28))


def train_full(x, y, seed):
    """One model on every point (the training of :func:`train_folds`' folds), keeping each step's
    logits margin per point (AUM) and a snapshot every 5 epochs (curvature)."""
    torch.manual_seed(seed)
    model = factory()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    shuffle = torch.Generator().manual_seed(seed)
    margins = np.zeros((EPOCHS, len(x)), dtype=np.float32)
    snaps = []
    for epoch in range(EPOCHS):
        model.train()
        for b in torch.randperm(len(x), generator=shuffle).split(BATCH):
            logits = model(x[b])
            loss = nn.functional.cross_entropy(logits, y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                margins[epoch, b.numpy()] = _margin(logits.double(), y[b])
        if epoch % 5 == 4:
            snaps.append(copy_of(model))
    return model.eval(), margins, snaps


def copy_of(model):
    clone = factory()
    clone.load_state_dict(model.state_dict())
    return clone.eval()


def _margin(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    label = logits.gather(1, y[:, None])[:, 0]
    other = logits.scatter(1, y[:, None], -float("inf")).amax(1)
    return (label - other).numpy()


def curvature(models, x, y, h=1e-3, probes=2, seed=0):
    """Garg et al. (ICML 2024): the input-loss curvature, Hutchinson's estimate of tr(H^2) by
    finite differences, ||grad L(x + h v) - grad L(x)||^2 / h^2 for Rademacher v, averaged over
    probes and training snapshots. High = memorised / mislabelled."""
    g = torch.Generator().manual_seed(seed)
    total = np.zeros(len(x))
    for model in models:
        for _ in range(probes):
            v = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
            total += _loss_grad_diff(model, x, y, h * v) / h**2
    return total / (len(models) * probes)


def _loss_grad_diff(model, x, y, step):
    out = np.zeros(len(x))
    for i in range(0, len(x), 500):
        xs = [x[i : i + 500].clone().requires_grad_(True), (x[i : i + 500] + step[i : i + 500]).requires_grad_(True)]
        grads = []
        for xi in xs:
            loss = nn.functional.cross_entropy(model(xi), y[i : i + 500], reduction="sum")
            grads.append(torch.autograd.grad(loss, xi)[0])
        out[i : i + 500] = (grads[1] - grads[0]).flatten(1).pow(2).sum(1).numpy()
    return out


def metrics(bad, score, margin, rate):
    k = max(1, int(round(rate * len(bad))))
    top = np.argsort(score, kind="stable")[:k]
    return {
        "auroc": roc_auc_score(bad, -score),
        "auprc": average_precision_score(bad, -score),
        "precision": bad[top].mean(),
        "recall": bad[top].sum() / max(bad.sum(), 1),
        "spearman_margin": spearmanr(score, margin)[0],
    }


def f1(flags, bad):
    tp = (flags & bad).sum()
    p, r = tp / max(flags.sum(), 1), tp / max(bad.sum(), 1)
    return {"precision": p, "recall": r, "f1": 0.0 if p + r == 0 else 2 * p * r / (p + r)}


def one_setting(x, y_true, kind, rate, seed, folds, n_threads):
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    y = noisy(y_true, rate, kind, seed)
    bad = y != y_true
    yt = torch.as_tensor(y)
    out: dict = {"scores": {}, "cost": {}}
    started = time.perf_counter()
    fold_models = train_folds(
        factory, x, yt, folds, epochs=EPOCHS, lr=LR, batch_size=BATCH, seed=seed, show_progress=False
    )
    out["cost"]["train_folds"] = time.perf_counter() - started
    started = time.perf_counter()
    full, aum_margins, snaps = train_full(x, yt, seed)
    out["cost"]["train_full"] = time.perf_counter() - started

    started = time.perf_counter()
    oos = find_issues(None, (x, yt), folds=fold_models, seed=seed, show_progress=False)
    out["cost"]["find_issues_oos"] = time.perf_counter() - started
    started = time.perf_counter()
    ins = find_issues(full, (x, yt), seed=seed, show_progress=False)
    out["cost"]["find_issues_in"] = time.perf_counter() - started

    probs_oos = _probs(fold_models, x)
    probs_in = _probs([(full, np.arange(len(x)))], x)
    logits_in = _logits(full, x)
    margin_oos = np.log(probs_oos[np.arange(len(y)), y] + 1e-300) - np.log(
        np.where(np.eye(10, dtype=bool)[y], 0, probs_oos).max(1) + 1e-300
    )
    margin_in = _margin(logits_in, yt)
    s = out["scores"]
    for name in ("self_confidence", "normalized_margin", "confidence_weighted_entropy"):
        s[f"oos cleanlab {name}"] = (get_label_quality_scores(y, probs_oos, method=name), margin_oos)
    s["oos margin"] = (margin_oos, margin_oos)
    s["oos probust label_score"] = (oos["label_score"].to_numpy(), margin_oos)
    s["in self_confidence"] = (probs_in[np.arange(len(y)), y], margin_in)
    s["in margin"] = (margin_in, margin_in)
    s["in -loss"] = (-nn.functional.cross_entropy(logits_in, yt, reduction="none").numpy(), margin_in)
    s["in AUM"] = (aum_margins.mean(0), margin_in)
    started = time.perf_counter()
    s["in -curvature"] = (-curvature(snaps, x, yt, seed=seed), margin_in)
    out["cost"]["curvature"] = time.perf_counter() - started
    s["in probust label_score"] = (ins["label_score"].to_numpy(), margin_in)
    out["metrics"] = {name: metrics(bad, v, m, bad.mean()) for name, (v, m) in s.items()}
    curvature_score = s["in -curvature"][0]
    out.pop("scores")
    out["flags"] = {
        "oos cleanlab find_label_issues": f1(find_label_issues(y, probs_oos), bad),
        "oos probust is_label_issue": f1(oos["is_label_issue"].to_numpy(), bad),
        "in probust is_label_issue": f1(ins["is_label_issue"].to_numpy(), bad),
    }
    # Memorised: the full model predicts the given label at the point, the fold model holding it out does not.
    memorised = (probs_in.argmax(1) == y) & (probs_oos.argmax(1) != y)
    fits = probs_in.argmax(1) == y
    out["memorised"] = {
        "count": int(memorised.sum()),
        "in probust memorisation_score": roc_auc_score(memorised[fits], ins["memorisation_score"].to_numpy()[fits]),
        "in 1 - self_confidence": roc_auc_score(memorised[fits], -probs_in[fits, y[fits]]),
        "in -AUM": roc_auc_score(memorised[fits], -aum_margins.mean(0)[fits]),
        "in curvature": roc_auc_score(memorised[fits], -curvature_score[fits]),
    }
    out["outliers"] = outliers(full, seed)
    return out


def outliers(model, seed, n_in=1000, n_out=100):
    """Digits (scikit-learn's 8 x 8, upscaled to 28 x 28) among Fashion-MNIST test images."""
    from cleanlab.outlier import OutOfDistribution
    from sklearn.datasets import load_digits

    test = pdata.load("fashion-mnist", "test").tensors()
    rng = np.random.default_rng(seed)
    keep = rng.choice(len(test[0]), n_in, replace=False)
    digits = load_digits()
    pick = rng.choice(len(digits.images), n_out, replace=False)
    small = torch.as_tensor(digits.images[pick] / 16.0, dtype=torch.float32)[:, None]
    big = nn.functional.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).clamp(0, 1)
    x = torch.cat([test[0][keep], big])
    atypical = np.r_[np.zeros(n_in, bool), np.ones(n_out, bool)]
    logits = _logits(model, x)
    prediction = logits.argmax(1)
    frame = find_issues(model, (x, prediction), seed=seed, show_progress=False)
    probs = torch.softmax(logits, 1).numpy()
    ood = OutOfDistribution().fit_score(pred_probs=probs, labels=prediction.numpy(), verbose=False)
    return {
        "probust outlier_score": roc_auc_score(atypical, frame["outlier_score"].to_numpy()),
        "cleanlab OutOfDistribution(pred_probs)": roc_auc_score(atypical, -ood),
        "1 - max softmax": roc_auc_score(atypical, -probs.max(1)),
    }


def _logits(model, x):
    with torch.no_grad():
        return torch.cat([model(x[i : i + 2000]) for i in range(0, len(x), 2000)]).double()


def _probs(parts, x):
    probs = np.zeros((len(x), 10))
    for model, idx in parts:
        probs[idx] = torch.softmax(_logits(model, x[idx]), 1).numpy()
    return probs


def summary(runs):
    """Mean and spread (min-max) over seeds, per setting and score."""
    table = defaultdict(lambda: defaultdict(list))
    for (kind, rate, _seed), out in runs.items():
        for name, m in out["metrics"].items():
            for key, value in m.items():
                table[(kind, rate, name)][key].append(value)
        for name, m in out["flags"].items():
            table[(kind, rate, "flags " + name)]["f1"].append(m["f1"])
            table[(kind, rate, "flags " + name)]["precision"].append(m["precision"])
            table[(kind, rate, "flags " + name)]["recall"].append(m["recall"])
        for name, v in out["memorised"].items():
            table[(kind, rate, "memorised " + name)]["auroc"].append(v)
        for name, v in out["outliers"].items():
            table[(kind, rate, "outliers " + name)]["auroc"].append(v)
        for name, v in out["cost"].items():
            table[(kind, rate, "cost " + name)]["seconds"].append(v)
    for (kind, rate, name), values in table.items():
        cells = []
        for key, vs in values.items():
            spread = f" ({min(vs):.4f}-{max(vs):.4f})" if len(vs) > 1 else ""
            cells.append(f"{key} {statistics.mean(vs):.4f}{spread}")
        print(f"{kind}{int(rate * 100):>3}%  {name:<44} " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="training images (the first n)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.2])
    parser.add_argument("--kinds", nargs="+", default=["sym", "asym"])
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    x, y_true = pdata.load("fashion-mnist", "train").tensors()
    x, y_true = x[: args.n], y_true[: args.n].numpy()
    import platform

    print(
        f"probust {probust.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"n {args.n}, folds {args.folds}, epochs {EPOCHS}, seeds {args.seeds}",
        flush=True,
    )
    runs = {}
    for kind in args.kinds:
        for rate in args.rates:
            for seed in args.seeds:
                started = time.perf_counter()
                runs[(kind, rate, seed)] = one_setting(x, y_true, kind, rate, seed, args.folds, 2)
                print(
                    f"  {kind} {rate} seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True
                )
    summary(runs)
    if args.json:
        args.json.write_text(json.dumps({f"{k[0]} {k[1]} {k[2]}": v for k, v in runs.items()}, default=float, indent=1))


if __name__ == "__main__":
    main()
