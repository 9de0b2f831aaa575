"""probust's first call in a fresh process against the paper code's approach, also in a fresh process.

What a user sees first is a new process: probust then measures the model's row cost (one pass on
two rows), declares its plans (:mod:`probust.execution.plans`) and pays every one-time cost of its
first use. Each side runs in its own fresh Python process, times its first call on the points,
then the same call again (the steady state); the ratios are paper / probust for each.

Settings (models randomly initialised: speed does not depend on training), sigma = 0.1, seed 0:

- ResNet18 with the CIFAR stem (3 x 32 x 32, C = 10), 50 points: Taylor and MMSE (N = 5); target
  first-use ratio >= 1.5;
- the paper's Fashion-MNIST linear model and CNN (1 x 28 x 28, C = 10), 100 points: Taylor and
  MMSE (N = 16); target >= 1.5;
- Monte Carlo (n = 2,000) on the linear model and the CNN (100 points) and ResNet18 (10 points);
  target >= 1.0.

The paper's side is benchmarks/bench_paper.py's reimplementation of the paper code: per point, one
backward pass per class (on the N noisy copies for MMSE), then scipy's multivariate normal CDF;
Monte Carlo as ``model(x_i + sigma * randn(n, ...))``.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_first_use.py [--only resnet18 linear cnn]
        [--methods taylor mmse mc] [--json out.json]

Agreement is part of each verdict: Taylor's max |p_paper - p_probust| within bench_paper's 2e-3
(the same quantity, two mvn-cdfs at their tolerances); MMSE's and Monte Carlo's mean |dp| within
0.05 (each side draws its own noise).

Exits 1 when a printed target is missed or a row disagrees.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_paper  # noqa: E402 - the paper code's approach, a sibling module of this script

SIGMA, SEED = 0.1, 0
SETTINGS = {  # model -> (points for Taylor/MMSE, MMSE copies, points for Monte Carlo)
    "resnet18": (50, 5, 10),
    "linear": (100, 16, 100),
    "cnn": (100, 16, 100),
}
TARGETS = {"taylor": 1.5, "mmse": 1.5, "mc": 1.0}
MC_SAMPLES = 2000


def _work(side: str, arch: str, method: str) -> tuple[float, float, list[float]]:
    """(first call seconds, second call seconds, p per point) of one side, in this (fresh) process."""
    analytic_points, copies, mc_points = SETTINGS[arch]
    points = mc_points if method == "mc" else analytic_points
    model = bench_paper._model(arch, 10, SEED)
    x = bench_paper._points(arch, points, SEED)[2:]
    if side == "probust":
        import probust

        if method == "taylor":
            estimator: probust.Estimator = probust.Taylor(model, SIGMA, seed=SEED)
        elif method == "mmse":
            estimator = probust.MMSE(model, SIGMA, n_samples=copies, seed=SEED)
        else:
            estimator = probust.MonteCarlo(model, SIGMA, n_samples=MC_SAMPLES, seed=SEED)
        call = lambda: estimator(x).p  # noqa: E731
    elif method == "taylor":
        call = lambda: bench_paper._paper_taylor(model, x, SIGMA, SEED, False)  # noqa: E731
    elif method == "mmse":
        call = lambda: bench_paper._paper_mmse(model, x, SIGMA, copies, SEED, False)  # noqa: E731
    else:
        call = lambda: bench_paper._paper_mc(model, x, SIGMA, MC_SAMPLES, SEED, MC_SAMPLES)  # noqa: E731
    times = []
    for _ in range(2):
        start = time.perf_counter()
        p = call()
        times.append(time.perf_counter() - start)
    return times[0], times[1], p.double().tolist()


def _fresh(side: str, arch: str, method: str) -> tuple[float, float, torch.Tensor]:
    out = subprocess.run([sys.executable, __file__, "--child", side, arch, method], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{side} {arch} {method} failed:\n{out.stderr[-2000:]}")
    first, second, p = json.loads(out.stdout.strip().splitlines()[-1])
    return first, second, torch.tensor(p, dtype=torch.float64)


def _agreement(method: str, paper: torch.Tensor, ours: torch.Tensor) -> tuple[float, float, bool]:
    """(max |dp|, mean |dp|, agrees): Taylor computes the same quantity on both sides, to the two
    mvn-cdfs' tolerances (bench_paper's 2e-3); MMSE and Monte Carlo draw different noise on each
    side, so their mean |dp| must be within sampling noise (0.05: MMSE's copies move its
    linearisation, Monte Carlo's n = 2,000 draws have a standard error up to 0.011)."""
    gap = (paper - ours).abs()
    if method == "taylor":
        return float(gap.max()), float(gap.mean()), float(gap.max()) <= bench_paper.TAYLOR_AGREEMENT
    return float(gap.max()), float(gap.mean()), float(gap.mean()) <= 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--methods", nargs="+", default=["taylor", "mmse", "mc"], choices=list(TARGETS))
    parser.add_argument("--json", help="write every number to this file")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_work(*args.child)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {bench_paper._cpu_model()}", flush=True)
    rows, ok = [], True
    for arch in args.only:
        for method in args.methods:
            paper_first, paper_steady, paper_p = _fresh("paper", arch, method)
            first, steady, p = _fresh("probust", arch, method)
            ratio, steady_ratio = paper_first / first, paper_steady / steady
            max_dp, mean_dp, agrees = _agreement(method, paper_p, p)
            met = ratio >= TARGETS[method]
            ok &= met and agrees
            row = {
                "model": arch,
                "method": method,
                "paper_first_s": paper_first,
                "paper_steady_s": paper_steady,
                "probust_first_s": first,
                "probust_steady_s": steady,
                "first_use_ratio": ratio,
                "steady_ratio": steady_ratio,
                "first_over_steady": first / steady,
                "max_dp": max_dp,
                "mean_dp": mean_dp,
                "agrees": agrees,
            }
            rows.append(row)
            print(
                f"{arch:>9} {method:>6}: first use paper {paper_first:7.2f} s probust {first:7.2f} s ratio "
                f"{ratio:5.2f} ({'met' if met else 'NOT met'} >= {TARGETS[method]}) | steady paper {paper_steady:7.2f} "
                f"s probust {steady:7.2f} s ratio {steady_ratio:5.2f} | probust first / steady {first / steady:4.2f} | "
                f"|dp| max {max_dp:.1e} mean {mean_dp:.1e} ({'agrees' if agrees else 'DISAGREES'})",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("all targets met" if ok else "TARGETS NOT MET (see the rows above)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
