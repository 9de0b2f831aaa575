"""Model evaluations saved by Monte Carlo with a linearised control variate (method "mc_cv").

For each model and sigma, every test point gets n noisy draws. On the *same* draws:

* plain Monte Carlo: p_mc = fraction kept, Wilson 95% half-width h_mc (what MonteCarlo reports);
* mc_cv (MMSE linearisation, N = 5 copies): p_cv and its 95% half-width h_cv.

Both half-widths shrink like 1 / sqrt(n), so to reach plain Monte Carlo's half-width mc_cv needs
n (h_cv / h_mc)^2 draws: the *sample ratio* (h_mc / h_cv)^2 is how many times fewer model
evaluations mc_cv spends. (Where the model and its linearisation never disagree, h_cv shrinks
like 1 / n, so the ratio is then an underestimate.) Reported per sigma: the median ratio over
points with 0.01 < p < 0.99, the pooled ratio (total draws plain MC needs / total mc_cv needs over
those points), the same including the linearisation's cost (N forward + N C backward passes per
point, each counted as one evaluation), and MMSE's mean absolute error |p_mmse - p_cv| (p_cv is
the unbiased reference). An adaptive run (stop at half-width 0.01) on the CNN checks the ratio
directly.

Models (cached under runs/bench_control_variate/):
* the paper's Fashion-MNIST CNN, trained 3 epochs by probust.train;
* the same CNN trained with gradient-norm regularisation (lambda = 0.1), smoother, so its
  linearisation is better (the paper's robust models);
* a ResNet18 (CIFAR stem) trained *briefly* (2 epochs on 2,048 Fashion-MNIST images padded to
  3x32x32): a CIFAR-shaped stand-in, since no CIFAR-10 is available offline and a CPU cannot
  train one properly here. Its boundaries are those of a weak model, not of a CIFAR ResNet.

Why the saving is small here: the control variate's variance reduction is 1 / (1 - rho^2), rho
the correlation of the model's and the linearisation's verdicts over draws, so 10x fewer draws
needs rho >= 0.95, i.e. the two to disagree on well under a tenth of the draws that fail. On
these ReLU CNNs the per-draw margin deviates from its linearisation by much more than the
*mean* deviation that MMSE's small error reflects (MMSE's error averages out over draws; the
control variate needs per-draw agreement). A stronger unbiased scheme, line sampling, was
explored and fails for the same reason (its measurements are in docs/performance.md's history:
`git log -S "line sampling" -- docs/performance.md`).

Run:  .venv/bin/python benchmarks/bench_control_variate.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import probust
import probust.data
from probust.estimators.monte_carlo import binomial_interval
from probust.execution import Execution
from probust.training import train

RUNS = Path("runs/bench_control_variate")
MMSE_N = 5


def fmnist_cnn() -> tuple[torch.nn.Module, float]:
    r = train("fashion-mnist", "cnn", epochs=3, out=RUNS / "fmnist_cnn.pt", show_progress=False, num_threads=1)
    return r.model, r.meta["test_accuracy"]


def fmnist_cnn_gradnorm(lam: float = 0.1) -> tuple[torch.nn.Module, float]:
    r = train(
        "fashion-mnist",
        "cnn",
        epochs=3,
        grad_reg=lam,
        out=RUNS / f"fmnist_cnn_gradnorm{lam:g}.pt",
        show_progress=False,
        num_threads=1,
    )
    return r.model, r.meta["test_accuracy"]


def cifar_shaped(split: str, limit: int) -> probust.data.ImageDataset:
    """Fashion-MNIST padded to 32x32 and repeated over 3 channels."""
    ds = probust.data.load("fashion-mnist", split)
    x, y = ds.tensors()
    x = torch.nn.functional.pad(x[:limit], (2, 2, 2, 2)).repeat(1, 3, 1, 1)
    return probust.data.ImageDataset(
        x,
        y[:limit],
        name="fmnist32",
        split=split,
        classes=ds.classes,
        scale=1.0,
        mean=[float(x.mean())] * 3,
        std=[float(x.std())] * 3,
    )


def resnet18() -> tuple[torch.nn.Module, float]:
    r = train(
        cifar_shaped("train", 2048),
        "resnet18",
        epochs=2,
        lr=0.05,
        batch_size=64,
        augment=False,
        test_dataset=cifar_shaped("test", 256),
        out=RUNS / "resnet18_fmnist32_2k.pt",
        show_progress=False,
        num_threads=1,
    )
    return r.model, r.meta["test_accuracy"]


def compare(model: torch.nn.Module, x: torch.Tensor, sigma: float, n: int, classes: int) -> dict:
    """One mc_cv run: per-point half-widths of plain MC and mc_cv on the same draws."""
    t0 = time.perf_counter()
    r = probust.MonteCarloCV(model, sigma, n_samples=n, mmse_samples=MMSE_N, execution=Execution(batch_size=1024))(x)
    seconds = time.perf_counter() - t0
    successes = torch.round(r.p_mc * n).long()
    low, high = binomial_interval(successes, torch.full_like(successes, n), 0.95, "wilson")
    h_mc = ((high - low) / 2).numpy()
    h_cv = ((r.ci_high - r.ci_low) / 2).numpy()
    p = r.p.numpy()
    mid = (p > 0.01) & (p < 0.99)
    ratio = (h_mc / h_cv) ** 2
    linear_cost = MMSE_N * (1 + classes)
    pooled = n * mid.sum() / max((n / ratio[mid]).sum(), 1e-12)
    pooled_with = n * mid.sum() / max((n / ratio[mid] + linear_cost).sum(), 1e-12)
    return {
        "sigma": sigma,
        "points": len(p),
        "mid": int(mid.sum()),
        "median_p": float(np.median(p)),
        "mmse_error": float(np.abs(r.p_linearised.numpy() - p).mean()),
        "median_ratio": float(np.median(ratio[mid])) if mid.any() else float("nan"),
        "pooled_ratio": float(pooled) if mid.any() else float("nan"),
        "pooled_ratio_with_linearisation": float(pooled_with) if mid.any() else float("nan"),
        "median_beta": float(np.median(r.cv_beta.numpy()[mid])) if mid.any() else float("nan"),
        "seconds": seconds,
    }


def adaptive(model: torch.nn.Module, x: torch.Tensor, sigma: float, half: float, cap: int) -> tuple[int, int, float]:
    """Total model evaluations of plain MC and mc_cv, each stopping at the same half-width."""
    mc = probust.MonteCarlo(
        model, sigma, n_samples=cap, target_half_width=half, check_every=250, execution=Execution(batch_size=1024)
    )(x)
    cv = probust.MonteCarloCV(
        model,
        sigma,
        n_samples=cap,
        target_half_width=half,
        check_every=250,
        mmse_samples=MMSE_N,
        execution=Execution(batch_size=1024),
    )(x)
    reached = float((((cv.ci_high - cv.ci_low) / 2) <= half).double().mean())
    return int(mc.n_samples.sum()), int(cv.n_samples.sum()), reached


def table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}")
    print(
        f"{'sigma':>6} {'pts':>4} {'0.01<p<0.99':>11} {'median p':>8} {'MMSE |err|':>10} {'median ratio':>12} "
        f"{'pooled ratio':>12} {'incl. lin.':>10} {'beta':>5} {'s':>6}"
    )
    for r in rows:
        print(
            f"{r['sigma']:>6.3g} {r['points']:>4} {r['mid']:>11} {r['median_p']:>8.3f} {r['mmse_error']:>10.4f} "
            f"{r['median_ratio']:>12.1f} {r['pooled_ratio']:>12.1f} {r['pooled_ratio_with_linearisation']:>10.1f} "
            f"{r['median_beta']:>5.2f} {r['seconds']:>6.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points and draws")
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine: more threads are slower
    RUNS.mkdir(parents=True, exist_ok=True)
    cnn_points, cnn_n, res_points, res_n = (16, 1000, 3, 200) if args.quick else (40, 2000, 8, 400)

    t0 = time.perf_counter()
    cnn, acc = fmnist_cnn()
    x, _ = probust.data.load("fashion-mnist", "test").tensors()
    x = x[:cnn_points]
    rows = [compare(cnn, x, s, cnn_n, 10) for s in (0.05, 0.1, 0.2, 0.3, 0.5)]
    table(f"Fashion-MNIST CNN (3 epochs, test accuracy {acc:.3f}), {cnn_points} test points, n = {cnn_n} draws", rows)
    mc_total, cv_total, reached = adaptive(cnn, x[:20], 0.1, 0.01, 20_000)
    print(
        f"adaptive, sigma 0.1, stop at half-width 0.01, 20 points: plain MC {mc_total} evaluations, "
        f"mc_cv {cv_total} (+ {20 * MMSE_N * 11} for the linearisation): {mc_total / cv_total:.1f}x fewer "
        f"({mc_total / (cv_total + 20 * MMSE_N * 11):.1f}x with it); {reached:.0%} of mc_cv points reached 0.01"
    )

    smooth, acc = fmnist_cnn_gradnorm()
    rows = [compare(smooth, x, s, cnn_n, 10) for s in (0.05, 0.1, 0.2, 0.3, 0.5)]
    table(
        f"Fashion-MNIST CNN, gradient-norm regularised (lambda 0.1, 3 epochs, test accuracy {acc:.3f}), "
        f"{cnn_points} test points, n = {cnn_n} draws",
        rows,
    )

    if not args.skip_resnet:
        net, acc = resnet18()
        xr = cifar_shaped("test", 256).tensors()[0][:res_points]
        rows = [compare(net, xr, s, res_n, 10) for s in (0.1, 0.2, 0.3, 0.5)]
        table(
            f"ResNet18, 2 epochs on 2,048 CIFAR-shaped Fashion-MNIST images (test accuracy {acc:.3f}), "
            f"{res_points} points, n = {res_n}",
            rows,
        )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
