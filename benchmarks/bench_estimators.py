"""Estimator speed, as ratios measured in one run on this machine.

    python benchmarks/bench_estimators.py [--points 50] [--batch 64] [--seed 0]

Prints:
  1. Taylor and MMSE(N=5) time divided by the bare Jacobian time (one forward pass and C
     vmapped backward passes) for the same batch: the analytic estimators should cost
     little more than their gradients (target: Taylor within 1.5x).
  2. Taylor, MMSE(N=5) and MC(n=10,000) wall time on the paper's CNN for 50 points, and the
     speed-up of each over Monte Carlo (the paper's runtime table).
Exits 1 when the printed target (1) is missed. The CNN is untrained (weights from the seed): speed does not depend on training, but the
mvn-cdf's work does depend on how close points are to boundaries, so the numbers are
indicative; `probust demo` reports the same table for trained models.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import probust
from probust.execution import Execution
from probust.linearisation.margins import logit_jacobian
from probust.models import build

TAYLOR_OVER_JACOBIAN = 1.5


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64, help="batch for the Jacobian ratio")
    parser.add_argument("--mc-samples", type=int, default=10_000)
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = build("cnn", num_classes=10, input_shape=(1, 28, 28)).eval()
    x = torch.rand(max(args.points, args.batch), 1, 28, 28, generator=torch.Generator().manual_seed(args.seed))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CNN 1x28x28 -> 10, sigma {args.sigma}")

    xb = x[: args.batch]
    taylor = probust.Taylor(model, args.sigma, execution=Execution(batch_size=args.batch))
    mmse = probust.MMSE(model, args.sigma, n_samples=5, execution=Execution(batch_size=5 * args.batch))
    taylor(xb[:4]), mmse(xb[:4])  # warm-up: torch.func tracing, allocator
    jac = _best_of(lambda: logit_jacobian(model, xb), args.repeats)
    t_taylor = _best_of(lambda: taylor(xb), args.repeats)
    t_mmse = _best_of(lambda: mmse(xb), args.repeats)
    jac5 = _best_of(lambda: logit_jacobian(model, xb.repeat(5, 1, 1, 1)), args.repeats)
    print(f"\n1. Analytic estimators vs the bare Jacobian, batch of {args.batch}")
    print(f"   bare Jacobian                 {jac * 1e3:8.1f} ms")
    met = t_taylor / jac <= TAYLOR_OVER_JACOBIAN
    print(
        f"   Taylor                        {t_taylor * 1e3:8.1f} ms   ratio {t_taylor / jac:5.2f}  "
        f"(target <= {TAYLOR_OVER_JACOBIAN}: {'met' if met else 'NOT met'})"
    )
    print(f"   bare Jacobian of 5 copies     {jac5 * 1e3:8.1f} ms")
    print(f"   MMSE (N=5)                    {t_mmse * 1e3:8.1f} ms   ratio {t_mmse / jac5:5.2f}  (vs 5-copy Jacobian)")

    xp = x[: args.points]
    estimators = {
        "taylor": probust.Taylor(model, args.sigma),
        "mmse (N=5)": probust.MMSE(model, args.sigma, n_samples=5),
        f"mc (n={args.mc_samples:,})": probust.MonteCarlo(model, args.sigma, n_samples=args.mc_samples),
    }
    times = {name: _best_of(lambda est=est: est(xp), 1) for name, est in estimators.items()}
    mc_time = times[f"mc (n={args.mc_samples:,})"]
    print(f"\n2. Wall time for {args.points} points on the CNN (batched)")
    for name, seconds in times.items():
        print(f"   {name:<22} {seconds:8.2f} s   speed-up over MC {mc_time / seconds:8.1f}x")
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
