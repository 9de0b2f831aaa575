"""Randomized smoothing: probust.certify against the authors' CERTIFY, and the sequential test's draws.

    python benchmarks/bench_certify.py [--points 50] [--n 100000] [--quick] [--json FILE]
    python benchmarks/bench_certify.py --procedures --epochs 3 --points 40 --n 10000   # the docs' table
    python benchmarks/bench_certify.py --procedures --arch resnet18 --epochs 2 --points 40 --n 10000

Model (``--arch``): ``cnn`` (default), probust's CNN (the paper's) trained on Fashion-MNIST with
Gaussian noise augmentation at sigma = 0.25 (the cross-entropy of each batch plus that of a noisy
copy, 5 epochs; cached under runs/bench_certify/), as Cohen et al. train the base classifiers they
smooth. Points: the first ``--points`` test images. Noise: sigma = 0.25 in pixel space (the model
normalises inside).

``--arch resnet18``: ``torchvision.models.resnet18(num_classes=10)`` as torchvision builds it (the
ImageNet stem: 7x7 stride-2 convolution and max-pool, no normalisation layer) on 3 x 32 x 32
inputs: Fashion-MNIST images padded with 2 black pixels a side and repeated to 3 channels (the
issue asks for a resnet18 at 3 x 32 x 32 and CIFAR-10 cannot be downloaded on the machine this
was written on). Trained with the same loss (the cross-entropy of each batch plus that of a copy
with Gaussian noise at sigma 0.25), SGD as the CNN's (lr 0.05, momentum 0.9, weight decay 5e-4, batch 128, cosine),
on the first ``--train-subset`` training images for ``--epochs`` epochs; cached under
runs/bench_certify/. Noise and radii are in the 3 x 32 x 32 pixel space the model receives
(the padding and the three copies of each pixel get their own noise).

1. The authors' CERTIFY, written here as in their code (``core.py``: per point,
   ``model(x_i.repeat(batch) + sigma * torch.randn_like(...)).argmax(1)`` in batches of 1,000
   under no_grad, n0 = 100 selection draws, n estimation draws, ``proportion_confint(nA, n,
   alpha=2 * alpha, method="beta")[0]`` which is scipy's ``beta.ppf(alpha, nA, n - nA + 1)``),
   against ``probust.certify`` with the same model, points, n0, n and alpha. Verdict: the
   certified-accuracy curves agree within sampling noise at every radius of a grid (the two
   use different noise, so they differ by chance: the allowance is 4 sqrt(d) / P, d the points
   certified correct at that radius by one and not the other), and probust is at least 1.2x
   faster. Also printed: the forward-pass floor, the best throughput of the model alone
   (pre-made batches, no noise, every batch size and memory format tried), and how close each
   implementation gets to it.
2. Sequential CERTIFY, ``radii=(0, 0.25, 0.5, 0.75)``, against the fixed-n run of part 1 on the
   same points. Verdict: certified accuracy at each radius no lower than fixed-n's minus 0.03,
   with at most 1/3 of its draws per point on average (selection draws included in both).

3. ``--procedures`` (instead of 1 and 2): the three estimation procedures of
   ``probust.certify(..., radii=RADII, procedure=...)`` on the same points, one after the other
   in one process: "fixed" (Cohen et al.'s n draws), "sequential" (the uniform-mixture
   confidence sequence) and "prior" (the analytic-prior test, the default with ``radii``; its
   time includes the Taylor step). Printed: certified accuracy per radius, draws per point
   (mean, median, ratio to fixed-n's), wall time and its ratio. Verdict: the prior test's
   certified accuracy within 0.01 of fixed-n's at every radius, and its draws at most 1/10 of
   fixed-n's at n >= 100,000, at most 1/3 below.

Exits 1 when a target it prints is missed. One thread (the machine this was written on has 2
cores shared with other work; ``--threads`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import probust
import probust.data
from baselines import cohen_certify
from probust.training import train

RUNS = Path("runs/bench_certify")
SIGMA = 0.25
RADII = (0.0, 0.25, 0.5, 0.75)
GRID = tuple(np.round(np.arange(0.0, 1.01, 0.125), 3))  # radii of the agreement check (part 1)


class GaussianAugmentation:
    """Extra training loss: the cross-entropy on x + N(0, sigma^2 I), a noisy copy of each batch
    (Cohen et al. train on noisy copies only; here the clean cross-entropy is kept beside it)."""

    def __init__(self, sigma: float) -> None:
        self.sigma = sigma

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor, logits: Tensor) -> Tensor:
        return F.cross_entropy(model(x + self.sigma * torch.randn_like(x)), y)

    def config(self) -> dict:
        return {"name": "gaussian_augmentation", "sigma": self.sigma}

    def __repr__(self) -> str:
        return f"GaussianAugmentation(sigma={self.sigma})"


def noisy_cnn(sigma: float = SIGMA, epochs: int = 5) -> tuple[nn.Module, float]:
    """The CNN trained with Gaussian augmentation (minutes on one CPU core; cached)."""
    name = f"cnn_gaussian{sigma:g}" + ("" if epochs == 5 else f"_e{epochs}")
    result = train(
        "fashion-mnist",
        "cnn",
        epochs=epochs,
        lr=0.05,
        batch_size=128,
        extra_loss=GaussianAugmentation(sigma),
        out=RUNS / f"{name}.pt",
        show_progress=False,
        num_threads=1,
    )
    return result.model.eval(), float(result.meta["test_accuracy"])


def as_rgb32(x: Tensor) -> Tensor:
    """Fashion-MNIST images [B, 1, 28, 28] as [B, 3, 32, 32]: padded with 2 black pixels a side,
    the one channel repeated three times."""
    return F.pad(x, (2, 2, 2, 2)).repeat(1, 3, 1, 1)


def noisy_resnet18(sigma: float = SIGMA, epochs: int = 2, subset: int = 30_000) -> tuple[nn.Module, float]:
    """torchvision's resnet18 (num_classes=10) on :func:`as_rgb32` Fashion-MNIST, trained with
    Gaussian augmentation (:class:`GaussianAugmentation`) as :func:`noisy_cnn` trains the CNN, on
    the first ``subset`` training images (cached; minutes on one CPU core)."""
    import torchvision

    path = RUNS / f"resnet18_gaussian{sigma:g}_e{epochs}_n{subset}.pt"
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["state_dict"])
        return model.eval(), float(saved["test_accuracy"])
    x, y = probust.data.load("fashion-mnist", "train").tensors()
    x, y = as_rgb32(x[:subset]), y[:subset]
    batch_size, extra = 128, GaussianAugmentation(sigma)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(batch_size):
            logits = model(x[rows])
            loss = F.cross_entropy(logits, y[rows]) + extra(model, x[rows], y[rows], logits)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    tx, ty = probust.data.load("fashion-mnist", "test").tensors()
    with torch.inference_mode():
        predicted = torch.cat([model(as_rgb32(part)).argmax(1) for part in tx.split(1000)])
    accuracy = float((predicted == ty).double().mean())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "test_accuracy": accuracy}, path)
    return model, accuracy


# ---------------------------------------------------------------- measurements


def forward_floor(model: nn.Module, x: Tensor, seconds: float = 1.0) -> tuple[float, str]:
    """The best rows per second of ``model`` alone on pre-made batches (no noise), over batch
    sizes 32..4096 and both memory formats: what no sampler can beat."""
    best, label = 0.0, ""
    for channels_last in (False, True):
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        net = model.to(memory_format=fmt)
        rows = 32
        while rows <= 4096:
            batch = x[torch.arange(rows) % len(x)].contiguous(memory_format=fmt)
            with torch.inference_mode():
                net(batch)
                calls, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds / 8:
                    net(batch)
                    calls += 1
                rate = rows * calls / (time.perf_counter() - start)
            if rate > best:
                best, label = rate, f"{rows} rows, {'channels_last' if channels_last else 'contiguous'}"
            rows *= 2
    model.to(memory_format=torch.contiguous_format)
    return best, label


def curve(prediction: np.ndarray, radius: np.ndarray, labels: np.ndarray, radii) -> np.ndarray:
    correct = (prediction == labels) & (prediction >= 0)
    return np.array([(correct & (radius >= r)).mean() for r in radii])


def procedures_table(model: nn.Module, x: Tensor, y: Tensor, args: argparse.Namespace) -> tuple[bool, dict]:
    """Part 3: fixed, sequential and prior CERTIFY at RADII on the same points; (verdict, figures)."""
    rows: dict[str, dict] = {}
    for procedure in ("fixed", "sequential", "prior"):
        start = time.perf_counter()
        r = probust.certify(
            model, x, SIGMA, n0=args.n0, n=args.n, alpha=args.alpha, radii=RADII, procedure=procedure, seed=args.seed
        )
        seconds = time.perf_counter() - start
        drawn = r.n_drawn.double()
        rows[procedure] = {
            "accuracy": r.certified_accuracy(y).numpy().tolist(),
            "draws": float(drawn.mean()),
            "median": float(drawn.median()),
            "seconds": seconds,
        }
    base = rows["fixed"]
    print(f"\n3. Estimation procedures at radii {RADII}: {args.points} points, n {args.n:,}, alpha {args.alpha}")
    print(
        f"   {'procedure':<11} "
        + " ".join(f"r={r:<5g}" for r in RADII)
        + "   draws/point  median   ratio   seconds  ratio"
    )
    for name, row in rows.items():
        print(
            f"   {name:<11} "
            + " ".join(f"{a:7.3f}" for a in row["accuracy"])
            + f"   {row['draws']:11,.0f} {row['median']:7,.0f}  {row['draws'] / base['draws']:6.3f}"
            f"  {row['seconds']:8.1f}  {row['seconds'] / base['seconds']:5.2f}"
        )
    target = 0.1 if args.n >= 100_000 else 1 / 3
    prior = rows["prior"]
    accuracy_ok = bool(np.all(np.abs(np.array(prior["accuracy"]) - np.array(base["accuracy"])) <= 0.01 + 1e-12))
    draws_ok = prior["draws"] / base["draws"] <= target
    print(
        f"   prior: accuracy within 0.01 of fixed-n's at every radius: {'yes' if accuracy_ok else 'NO'}; draws "
        f"{prior['draws'] / base['draws']:.3f} of fixed-n's (target <= {target:.3g}): {'met' if draws_ok else 'MISSED'}"
    )
    return accuracy_ok and draws_ok, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=50, help="test images (the first ones)")
    parser.add_argument("--n", type=int, default=100_000, help="estimation draws per point")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--chunk", type=int, default=10, help="points per alternation of the two implementations")
    parser.add_argument("--batch", type=int, default=1000, help="the authors' batch (their default: 1,000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 points, n = 10,000: a smoke run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--arch", choices=("cnn", "resnet18"), default="cnn", help="the base classifier (see above)")
    parser.add_argument(
        "--epochs", type=int, default=None, help="training epochs (cached per value; default 5 for cnn, 2 for resnet18)"
    )
    parser.add_argument(
        "--train-subset", type=int, default=30_000, help="resnet18: train on the first this many training images"
    )
    parser.add_argument(
        "--procedures", action="store_true", help="part 3 only: fixed, sequential and prior CERTIFY at the radii"
    )
    args = parser.parse_args()
    if args.quick:
        args.points, args.n, args.chunk = 10, 10_000, 5
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    RUNS.mkdir(parents=True, exist_ok=True)

    x, y = probust.data.load("fashion-mnist", "test").tensors()
    x, y = x[: args.points], y[: args.points]
    if args.arch == "resnet18":
        started = time.perf_counter()
        model, accuracy = noisy_resnet18(epochs=args.epochs or 2, subset=args.train_subset)
        x = as_rgb32(x)
        described = (
            f"torchvision resnet18 on Fashion-MNIST as 3 x 32 x 32, trained {args.epochs or 2} epoch(s) on "
            f"{args.train_subset:,} images with Gaussian augmentation sigma {SIGMA} (ready in "
            f"{time.perf_counter() - started:.0f} s)"
        )
    else:
        model, accuracy = noisy_cnn(epochs=args.epochs or 5)
        described = f"Fashion-MNIST CNN trained with Gaussian augmentation sigma {SIGMA}"
    labels = y.numpy()
    load = os.getloadavg()
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (load {load[0]:.1f}), torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    print(
        f"{described} (clean test accuracy {accuracy:.3f}); "
        f"{args.points} test points, sigma {SIGMA}, n0 {args.n0}, n {args.n:,}, alpha {args.alpha}"
    )

    if args.procedures:
        ok, rows = procedures_table(model, x, y, args)
        load = os.getloadavg()
        print(f"   (load average at the end {load[0]:.1f})")
        if args.json:
            args.json.write_text(json.dumps({"points": args.points, "n": args.n, "procedures": rows}, indent=2))
        return 0 if ok else 1

    # 1. The same points, n0, n and alpha through both implementations, alternating in chunks so
    # that a change in the machine's load falls on both (probust's results do not depend on the
    # chunks: each point's draws are fixed by its index).
    t_cohen = t_probust = 0.0
    cohen_pred, cohen_radius, parts = [], [], []
    for first in range(0, args.points, args.chunk):
        rows = slice(first, min(first + args.chunk, args.points))
        start = time.perf_counter()
        pred, rad = cohen_certify(model, x[rows], SIGMA, args.n0, args.n, args.alpha, args.batch, 10)
        t_cohen += time.perf_counter() - start
        cohen_pred.append(pred)
        cohen_radius.append(rad)
        start = time.perf_counter()
        parts.append(
            probust.certify(
                model, x[rows], SIGMA, n0=args.n0, n=args.n, alpha=args.alpha, seed=args.seed, index_offset=first
            )
        )
        t_probust += time.perf_counter() - start
    fixed = probust.CertifyResult.cat(parts)
    c_pred, c_rad = np.concatenate(cohen_pred), np.concatenate(cohen_radius)
    p_pred, p_rad = fixed.prediction.numpy(), fixed.radius.numpy()
    floor_rate, floor_label = forward_floor(model, x)
    rows_total = args.points * (args.n0 + args.n)
    floor = rows_total / floor_rate

    a_cohen, a_probust = curve(c_pred, c_rad, labels, GRID), curve(p_pred, p_rad, labels, GRID)
    grid = np.array(GRID)
    ok_c = ((c_pred == labels) & (c_pred >= 0))[:, None] & (c_rad[:, None] >= grid)
    ok_p = ((p_pred == labels) & (p_pred >= 0))[:, None] & (p_rad[:, None] >= grid)
    discordant = (ok_c != ok_p).sum(axis=0)
    allowance = 4 * np.sqrt(np.maximum(discordant, 1)) / args.points
    curve_ok = bool((np.abs(a_cohen - a_probust) <= allowance).all())
    d = p_rad - c_rad
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else 0.0
    radius_ok = bool(abs(d.mean()) <= 4 * se + 1e-12)
    speedup = t_cohen / t_probust
    print(f"\n1. CERTIFY, the authors' code (per point, batch {args.batch}) against probust.certify")
    print(f"   {'radius':>8} " + " ".join(f"{r:>6.3f}" for r in GRID))
    print(f"   {'authors':>8} " + " ".join(f"{a:>6.3f}" for a in a_cohen))
    print(f"   {'probust':>8} " + " ".join(f"{a:>6.3f}" for a in a_probust))
    print(f"   {'allowed':>8} " + " ".join(f"{a:>6.3f}" for a in allowance) + "   (|difference| <= 4 sqrt(d) / points)")
    print(
        f"   curves agree within sampling noise: {'yes' if curve_ok else 'NO'}; radius probust - authors per point: "
        f"mean {d.mean():+.4f} (4 standard errors {4 * se:.4f}): {'agree' if radius_ok else 'DIFFER'}; "
        f"same prediction on {(c_pred == p_pred).mean():.0%} of points"
    )
    print(
        f"   authors {t_cohen:8.1f} s ({t_cohen / args.points:.2f} s/point, {rows_total / t_cohen:,.0f} rows/s)\n"
        f"   probust {t_probust:8.1f} s ({t_probust / args.points:.2f} s/point, {rows_total / t_probust:,.0f} rows/s)"
        f"   speed-up {speedup:.2f}x (target >= 1.2)\n"
        f"   forward-pass floor {floor:8.1f} s ({floor_rate:,.0f} rows/s, best at {floor_label}): probust at "
        f"{floor / t_probust:.0%} of it, the authors' at {floor / t_cohen:.0%}"
    )

    # 2. Sequential CERTIFY on the same points: draws until each radius is decided.
    start = time.perf_counter()
    seq = probust.certify(model, x, SIGMA, n0=args.n0, n=args.n, alpha=args.alpha, radii=RADII, seed=args.seed)
    t_seq = time.perf_counter() - start
    acc_fixed = fixed.certified_accuracy(y, RADII).numpy()
    acc_seq = seq.certified_accuracy(y).numpy()
    draws_ratio = float(seq.n_drawn.double().mean() / fixed.n_drawn.double().mean())
    seq_ok = bool((acc_seq >= acc_fixed - 0.03).all())
    print(f"\n2. Sequential CERTIFY, radii {RADII}, against fixed-n CERTIFY (part 1's probust run)")
    print(f"   {'radius':>8} " + " ".join(f"{r:>6.3f}" for r in RADII))
    print(f"   {'fixed n':>8} " + " ".join(f"{a:>6.3f}" for a in acc_fixed))
    print(f"   {'sequent.':>8} " + " ".join(f"{a:>6.3f}" for a in acc_seq) + "   (target: >= fixed - 0.03)")
    print(
        f"   draws per point: sequential {seq.n_drawn.double().mean():,.0f} (median {seq.n_drawn.median():,}, "
        f"{(seq.n_drawn == args.n0 + args.n).double().mean():.0%} ran to n), fixed {args.n0 + args.n:,}: ratio "
        f"{draws_ratio:.3f} (target <= 1/3); {t_seq:.1f} s, {t_probust / t_seq:.1f}x faster than fixed-n"
    )
    load = os.getloadavg()
    print(f"   (load average at the end {load[0]:.1f})")

    verdict = {
        "curves agree": curve_ok,
        "radii agree": radius_ok,
        "speed-up >= 1.2": speedup >= 1.2,
        "sequential accuracy >= fixed - 0.03": seq_ok,
        "sequential draws <= 1/3": draws_ratio <= 1 / 3,
    }
    print("\nverdict: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}" for k, v in verdict.items()))
    if args.json:
        figures = {
            "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "points": args.points,
            "n": args.n,
            "seconds_authors": t_cohen,
            "seconds_probust": t_probust,
            "seconds_floor": floor,
            "seconds_sequential": t_seq,
            "speedup": speedup,
            "accuracy_authors": a_cohen.tolist(),
            "accuracy_probust": a_probust.tolist(),
            "accuracy_fixed": acc_fixed.tolist(),
            "accuracy_sequential": acc_seq.tolist(),
            "draws_ratio": draws_ratio,
            "verdict": verdict,
        }
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
