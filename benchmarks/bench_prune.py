"""Pruning the decision boundaries of Taylor and MMSE at many classes: pruned vs full, side by side.

Models: probust's CNN on Fashion-MNIST composites (benchmarks/prune_models.py): C = 100 (two
images side by side) and C = 1,000 (three), trained briefly on the CPU. 64 test points, sigma in
{0.05, 0.1, 0.2}; Taylor and MMSE (N = 5) with ``prune="off"`` (every boundary's gradient) and
``prune="on"`` (a forward-mode sketch of 32 probes, exact gradients only for the boundaries that
can matter). Printed per row: the time ratio full / pruned (each timed once, after one warm-up
call that measures the Jacobian plan), boundaries kept per point (mean, max), max and mean
|p_pruned - p_full|, the largest ``cdf_error`` of the pruned run (which includes the pruning
bound) and of the full run (the mvn-cdf's own error at k = C - 1: |dp| can exceed the pruning
bound where the full run's integral is the less accurate one). Timings depend on the machine's load: the ratios are measured in one run, side by side.

Run:  PYTHONPATH=src .venv/bin/python benchmarks/bench_prune.py [--classes 100 1000] [--points 64]
      [--mmse-points N] [--methods taylor mmse] [--sigmas ...]   (--mmse-points: MMSE's points at
      C = 1,000; default: --points)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import probust

sys.path.insert(0, str(Path(__file__).parent))
import prune_models  # noqa: E402 - a sibling module of this script, found once its folder is on the path


def _timed(estimator: probust.Estimator, x: torch.Tensor) -> tuple[probust.Estimate, float]:
    estimator(x[:2])  # plans measured, caches warm
    start = time.perf_counter()
    r = estimator(x)
    return r, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[100, 1000], choices=[100, 1000])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--mmse-points", type=int, default=None)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--methods", nargs="+", default=["taylor", "mmse"], choices=["taylor", "mmse"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    header = (
        f"{'C':>5} {'method':>7} {'sigma':>5} {'pts':>4} {'full s':>8} {'pruned s':>8} {'ratio':>6} "
        f"{'kept mean':>9} {'kept max':>8} {'max|dp|':>9} {'mean|dp|':>9} {'max err':>9} {'full err':>9} "
        f"{'p in (.05,.95)':>14}"
    )
    print(header, flush=True)
    for classes in args.classes:
        model, test = prune_models.model({100: 2, 1000: 3}[classes])
        x_all, _ = test.tensors()
        for method in args.methods:
            points = args.points if method == "taylor" or classes == 100 else (args.mmse_points or args.points)
            x = x_all[:points]
            for sigma in args.sigmas:
                make = probust.Taylor if method == "taylor" else probust.MMSE
                full, t_full = _timed(make(model, sigma, prune="off", show_progress=False), x)
                pruned, t_pruned = _timed(make(model, sigma, prune="on", show_progress=False), x)
                assert pruned.boundaries_kept is not None and pruned.cdf_error is not None
                assert full.cdf_error is not None
                gap = (pruned.p - full.p).abs()
                mid = int(((full.p > 0.05) & (full.p < 0.95)).sum())
                kept = pruned.boundaries_kept.double()
                print(
                    f"{classes:>5} {method:>7} {sigma:>5} {points:>4} {t_full:>8.2f} {t_pruned:>8.2f} "
                    f"{t_full / t_pruned:>6.1f} {kept.mean():>9.1f} {int(kept.max()):>8} {gap.max():>9.2e} "
                    f"{gap.mean():>9.2e} {pruned.cdf_error.max():>9.2e} {full.cdf_error.max():>9.2e} {mid:>14}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
