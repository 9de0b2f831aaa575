"""Where one Taylor/MMSE call on a large-C model spends its time: cProfile of the steady state.

The 1,000-class model of :mod:`bench_imagenet` (a backbone whose head ranks 990 classes far below
the 10 that compete), one warm-up call, then one profiled call; prints the call's seconds and the
functions with the most time of their own, then probust's functions by time within them. On CUDA the kernels run asynchronously, so the time
shows where the host waits (``synchronize``, ``item``, ``nonzero``) or launches.

    PYTHONPATH=src .venv/bin/python benchmarks/profile_call.py [--device cuda] [--model resnet50]
        [--method taylor] [--points 2] [--sigma 5.62] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from bench_imagenet import _estimator, _inputs, models  # a sibling module of this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50", "vit", "linear"])
    parser.add_argument("--method", default="taylor", choices=["taylor", "mmse"])
    parser.add_argument("--points", type=int, default=2)
    parser.add_argument("--sigma", type=float, default=5.62)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    small, big = models(args.model, "trained", 0, 2)
    x = _inputs(args.model, args.points, 2).to(args.device)
    for name, model in (("C = 10", small), ("C = 1,000", big)):
        estimator = _estimator(args.method, model.to(args.device), args.sigma)
        estimator(x)
        if args.device.type == "cuda":
            torch.cuda.synchronize(args.device)
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.enable()
        r = estimator(x)
        if args.device.type == "cuda":
            torch.cuda.synchronize(args.device)
        profile.disable()
        print(f"{args.model} {name} {args.method}: {time.perf_counter() - start:.3f} s, routes {r.route}", flush=True)
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats("probust/", args.top)


if __name__ == "__main__":
    main()
