"""Seconds from a call's start to its progress bar's first update, and to its end, in a fresh process.

What a notebook user sees first: a new process, a new model, one call with its bar on. Each case
runs in its own process (imports done before the clock starts) on torchvision's resnet18 at random
weights, seed 0:

- ``score_mc``: ``probust.score(net, (x, torch.zeros(len(x), dtype=torch.long)), sigma=0.1, methods=["mc"], mc_samples=10_000)`` on
  4 images at 3 x 64 x 64 (C = 10), the run's bar counting model evaluations;
- ``taylor`` / ``mmse``: ``probust.Taylor`` / ``probust.MMSE`` (N = 5) with
  ``Execution(show_progress=True)`` on 64 images at 3 x 32 x 32 with the CIFAR stem (C = 10);
- ``certify``: ``probust.certify`` (n0 = 100, n = 10,000) on 4 images at 3 x 64 x 64.

Target (issue 59): the first update within 3 s of the start.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_first_update.py [--only score_mc taylor mmse certify]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CASES = ("score_mc", "taylor", "mmse", "certify")
TARGET_S = 3.0


def _child(case: str) -> tuple[float, float]:
    import torch
    import torchvision
    import tqdm.auto

    import probust
    from probust.models import build

    first: list[float] = []
    real = tqdm.auto.tqdm

    class Timed(real):  # type: ignore[misc, valid-type]
        def update(self, n: float | None = 1) -> bool | None:
            if not first:
                first.append(time.perf_counter())
            return super().update(n)

    tqdm.auto.tqdm = Timed
    torch.manual_seed(0)
    if case in ("taylor", "mmse"):
        net = build("resnet18", 10, (3, 32, 32)).eval()
        x = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    else:
        net = torchvision.models.resnet18(num_classes=10).eval()
        x = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    bar = probust.Execution(show_progress=True)
    start = time.perf_counter()
    if case == "score_mc":
        probust.score(net, (x, torch.zeros(len(x), dtype=torch.long)), sigma=0.1, methods=["mc"], mc_samples=10_000)
    elif case == "taylor":
        probust.Taylor(net, 0.1, execution=bar)(x)
    elif case == "mmse":
        probust.MMSE(net, 0.1, n_samples=5, execution=bar)(x)
    else:
        probust.certify(net, x, sigma=0.1, n0=100, n=10_000, execution=bar)
    end = time.perf_counter()
    return (first[0] - start if first else float("inf")), end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return
    ok = True
    print(f"{'case':<10} {'first update s':>14} {'call s':>8}")
    for case in args.only:
        out = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True, text=True, check=True)
        first, total = json.loads(out.stdout.strip().splitlines()[-1])
        ok &= first <= TARGET_S
        print(f"{case:<10} {first:14.2f} {total:8.2f}  {'ok' if first <= TARGET_S else 'NOT met'}", flush=True)
    print("every first update within 3 s" if ok else "TARGET NOT MET (see the rows above)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
