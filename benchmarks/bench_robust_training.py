"""Training for average-case robustness: CE + mu * mean(-log p_robust) against gradient-norm
regularisation, on Fashion-MNIST with the paper's CNN.

Every model is trained by probust.train on the same 20,000-image training subset for 3 epochs
(seed 0, SGD lr 0.05, cosine schedule), then evaluated on the full test set (accuracy) and on
the first 300 test images by plain Monte Carlo (400 draws per image, prediction kept): the
median and mean p_robust at the training sigma and at twice it. The robust term
(probust.RobustLoss: differentiable Taylor linearisation) is evaluated on the first 32 images of
each batch of 128 (cost), its weight ramped up over the first epoch; two variants: the
mv-sigmoid map with the label as target (the default), and the mvn-cdf with the prediction as
target (-log p_robust proper). Gradient-norm regularisation (probust.train's grad_reg: lambda *
mean ||d CE / d x||^2) is run at several lambda so that one of them matches the robust model's
accuracy. Models are cached under runs/bench_robust_training/.

Run:  .venv/bin/python benchmarks/bench_robust_training.py [--mu 0.5 1] [--lambdas 0.01 0.03 0.1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import probust
import probust.data
from probust.train import train

RUNS = Path("runs/bench_robust_training")
SUBSET = 20_000
EPOCHS = 3


def subset(ds: probust.data.ImageDataset, n: int) -> probust.data.ImageDataset:
    x, y = ds.tensors()
    return probust.data.ImageDataset(x[:n], y[:n], name=ds.name, split=ds.split, classes=ds.classes, scale=1.0,
                                     mean=ds.mean, std=ds.std)  # fmt: skip


def fit(name: str, train_ds, test_ds, **kwargs) -> tuple[torch.nn.Module, dict]:
    result = train(
        train_ds, "cnn", epochs=EPOCHS, lr=0.05, batch_size=128, seed=0, test_dataset=test_ds,
        out=RUNS / f"{name}.pt", show_progress=False, num_threads=1, **kwargs,
    )  # fmt: skip
    return result.model, result.meta


def robustness(model: torch.nn.Module, x: torch.Tensor, sigma: float, n: int) -> np.ndarray:
    return probust.MonteCarlo(model, sigma, n_samples=n, batch_size=2000)(x).p.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, default=0.3, help="noise level trained for and measured at")
    parser.add_argument("--mu", type=float, nargs="+", default=[1.0, 3.0], help="mv-sigmoid, label target")
    parser.add_argument("--mu-mvn", type=float, nargs="*", default=[0.3], help="mvn-cdf, prediction target")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.01, 0.03, 0.1])
    parser.add_argument("--points", type=int, default=300)
    parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: more threads are slower
    RUNS.mkdir(parents=True, exist_ok=True)
    full_train = probust.data.load("fashion-mnist", "train")
    train_ds, test_ds = subset(full_train, SUBSET), probust.data.load("fashion-mnist", "test")
    x_eval = test_ds.tensors()[0][: args.points]
    sigmas = (args.sigma, 2 * args.sigma)

    warmup = -(-SUBSET // 128)  # one epoch
    robust = lambda mu, **kw: probust.RobustLoss(args.sigma, mu, max_points=32, warmup_steps=warmup, **kw)  # noqa: E731
    runs: list[tuple[str, dict]] = [("plain", {})]
    runs += [(f"robust_mvs_label_mu{mu:g}", {"extra_loss": robust(mu)}) for mu in args.mu]
    runs += [(f"robust_mvn_pred_mu{mu:g}", {"extra_loss": robust(mu, cdf="mvn", target="prediction")}) for mu in args.mu_mvn]
    runs += [(f"gradnorm_l{lam:g}", {"grad_reg": lam}) for lam in args.lambdas]
    print(f"Fashion-MNIST CNN, {SUBSET} training images, {EPOCHS} epochs; p_robust by Monte Carlo "
          f"({args.draws} draws) on {args.points} test images")  # fmt: skip
    header = f"{'model':<24} {'test acc':>8} {'train s':>8}"
    for s in sigmas:
        header += f" {'median p@' + format(s, 'g'):>12} {'mean p@' + format(s, 'g'):>10}"
    print(header)
    for name, kwargs in runs:
        t0 = time.perf_counter()
        model, meta = fit(name, train_ds, test_ds, **kwargs)
        line = f"{name:<24} {meta['test_accuracy']:>8.4f} {meta['train_seconds']:>8.0f}"
        for s in sigmas:
            p = robustness(model, x_eval, s, args.draws)
            line += f" {np.median(p):>12.3f} {p.mean():>10.3f}"
        print(line, f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
