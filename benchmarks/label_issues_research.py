"""Research for issue 58 (temporary): which per-point score ranks label errors best.

Stage 1 trains K-fold and full-data models on a Fashion-MNIST subset with injected noise and
caches what each score needs; stage 2 computes the scores and prints AUROC.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import probust
from probust import data as pdata

OUT = Path("runs/label_research")
# Class-conditional flips (Fashion-MNIST): t-shirt<->shirt, pullover<->coat, sandal<->sneaker,
# sneaker->ankle boot, dress->coat, trouser->dress, bag->pullover.
PAIRS = {0: 6, 6: 0, 2: 4, 4: 2, 5: 7, 7: 9, 9: 5, 3: 4, 1: 3, 8: 2}


def noisy_labels(y: np.ndarray, rate: float, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flip = rng.random(len(y)) < rate
    out = y.copy()
    if kind == "sym":
        shift = rng.integers(1, 10, size=len(y))
        out[flip] = (y[flip] + shift[flip]) % 10
    else:
        out[flip] = np.array([PAIRS[int(c)] for c in y[flip]])
    return out


def make_model(arch: str) -> nn.Module:
    if arch == "cnn2":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 49, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
    return probust.models.build(arch, 10, (1, 28, 28))


def train(x, y, arch, epochs, seed, record_idx=None):
    torch.manual_seed(seed)
    model = make_model(arch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n = len(x)
    g = torch.Generator().manual_seed(seed)
    margins = np.zeros((epochs, n), dtype=np.float32)
    snaps = []
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, 128):
            b = perm[i : i + 128]
            logits = model(x[b])
            loss = nn.functional.cross_entropy(logits, y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                lab = logits.gather(1, y[b, None])[:, 0]
                other = logits.scatter(1, y[b, None], -float("inf")).amax(1)
                margins[epoch, b.numpy()] = (lab - other).numpy()
        snaps.append({k: v.clone() for k, v in model.state_dict().items()})
    model.eval()
    return model, margins, snaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--arch", default="cnn2")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--kind", default="sym")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ds = pdata.load("fashion-mnist", "train")
    x, y_true = ds.tensors()
    x, y_true = x[: args.n], y_true[: args.n].numpy()
    y = noisy_labels(y_true, args.rate, args.kind, args.seed)
    tag = f"{args.arch}_{args.kind}{int(args.rate * 100)}_s{args.seed}_n{args.n}_e{args.epochs}"
    folder = OUT / tag
    folder.mkdir(parents=True, exist_ok=True)
    yt = torch.as_tensor(y)
    rng = np.random.default_rng(1000 + args.seed)
    fold_of = rng.permutation(np.arange(args.n) % args.folds)
    t0 = time.perf_counter()
    full, margins, snaps = train(x, yt, args.arch, args.epochs, args.seed)
    t_full = time.perf_counter() - t0
    torch.save({"state": full.state_dict(), "snaps": snaps}, folder / "full.pt")
    np.save(folder / "aum_margins.npy", margins)
    t0 = time.perf_counter()
    for k in range(args.folds):
        tr = np.flatnonzero(fold_of != k)
        m, _, _ = train(x[tr], yt[tr], args.arch, args.epochs, args.seed + 1 + k)
        torch.save(m.state_dict(), folder / f"fold{k}.pt")
    t_folds = time.perf_counter() - t0
    np.savez(folder / "meta.npz", y=y, y_true=y_true, fold_of=fold_of)
    (folder / "meta.json").write_text(json.dumps({**vars(args), "t_full": t_full, "t_folds": t_folds}))
    print(tag, f"full {t_full:.0f}s folds {t_folds:.0f}s")


if __name__ == "__main__":
    main()
