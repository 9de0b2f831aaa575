"""What watching a training run costs: probust.issues.Tracker's updates against the training epochs
they watch, timed in one process on the same model and points.

    python benchmarks/bench_tracker_cost.py                   # docs/issues.md's cost table
    python benchmarks/bench_tracker_cost.py --models cnn      # one model

For each model: one training epoch (Adam, batch 128, forward and backward over every point), then
one tracker update of each kind: a margin-only update (one forward pass, no autograd) and a
gradient update (one forward and one backward pass to the inputs). Printed: seconds of each, their
ratio to the epoch, and the ratio of a run's tracking to its training at ``gradient_every`` 1, 4 and
8 (one update per epoch). Models: the Fashion-MNIST CNN of bench_label_issues.py on 3,000 points,
and torchvision's resnet18 (10 classes) on 512 random 3 x 32 x 32 images, each with the machine's
threads (``--threads``). The median of ``--repeats`` timings of each; the first is printed too (a
first use, with nothing warmed).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from torch import nn

from probust.issues import Tracker


def _cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from bench_label_issues import factory, load

    x, y = load("fashion-mnist")
    torch.manual_seed(0)
    return factory("fashion-mnist"), x, torch.as_tensor(y)


def _resnet18() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(0)
    return model, torch.rand(512, 3, 32, 32, generator=g), torch.randint(0, 10, (512,), generator=g)


MODELS = {"cnn": _cnn, "resnet18": _resnet18}


def _epoch(model, opt, x, y, seed):
    model.train()
    for b in torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).split(128):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[b]), y[b]).backward()
        opt.step()


def _timed(fn, repeats):
    times = []
    for r in range(repeats):
        started = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s)")
    for name in args.models:
        measure(name, args.repeats)


def measure(name: str, repeats: int) -> None:
    """Time one model's epochs and both kinds of update, and print them."""
    model, x, y = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    epoch = _timed(lambda r: _epoch(model, opt, x, y, r), repeats)
    every = Tracker((x, y), sigma=0.3, gradient_every=1)
    gradient = _timed(lambda r: every.update(model), repeats)
    once = Tracker((x, y), sigma=0.3, gradient_every=10**6)
    once.update(model)  # the first update computes the gradient
    margin = _timed(lambda r: once.update(model), repeats)
    e, g, m = (statistics.median(t) for t in (epoch, gradient, margin))
    print(
        f"{name}: {len(x)} points; epoch {e:.3f} s (first {epoch[0]:.3f}), gradient update {g:.3f} s "
        f"(first {gradient[0]:.3f}) = {g / e:.3f} x epoch, margin update {m:.3f} s = {m / e:.3f} x epoch"
    )
    for k in (1, 4, 8):
        print(f"  gradient_every {k}: tracking / training {(g + (k - 1) * m) / k / e:.3f}")


if __name__ == "__main__":
    main()
