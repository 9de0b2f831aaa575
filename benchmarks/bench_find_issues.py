"""probust.find_issues on Fashion-MNIST's 60,000 training points against its score's own floor.

    python benchmarks/bench_find_issues.py              # 60,000 points (issue 58's target: <= 1.3x)
    python benchmarks/bench_find_issues.py --n 5000     # a quick look

The model is the paper's CNN trained for one epoch (Adam, seed 0): a trained model predicts most
labels, so the prediction's second Taylor pass runs on the few points it gets wrong, as on a
user's data. The floor is what the score needs done plainly: per point one forward pass with
autograd and C - 1 backward passes (the gradients of f_label - f_i), in passes of 64 rows, with
torch.autograd.grad. find_issues runs first, in a fresh process (first use: its plans are
measured in the call), then the floor, then find_issues again (warm); its progress bar is off.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch  # noqa: E402
from torch import nn  # noqa: E402

import probust  # noqa: E402
from probust import data as pdata  # noqa: E402


def trained_cnn(x, y, seed=0):
    torch.manual_seed(seed)
    model = probust.models.build("cnn", 10, (1, 28, 28))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for batch in torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).split(128):
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def floor(model, x, y, rows=64):
    """One forward pass with autograd and C - 1 backward passes per point."""
    for i in range(0, len(x), rows):
        xb = x[i : i + rows].clone().requires_grad_(True)
        logits = model(xb)
        label = logits.gather(1, y[i : i + rows, None])
        for c in range(logits.shape[1] - 1):
            other = (y[i : i + rows] + 1 + c) % logits.shape[1]
            torch.autograd.grad((label[:, 0] - logits.gather(1, other[:, None])[:, 0]).sum(), xb, retain_graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60_000)
    args = parser.parse_args()
    x, y = pdata.load("fashion-mnist", "train").tensors()
    x, y = x[: args.n], y[: args.n]
    model = trained_cnn(x, y)
    with torch.no_grad():
        wrong = float((model(x).argmax(1) != y).float().mean())
    print(
        f"probust {probust.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads; {args.n} points, the model predicts another class than the label on {wrong:.1%}"
    )
    timings = {}
    start = time.perf_counter()
    first = probust.find_issues(model, (x, y), show_progress=False)
    timings["find_issues, first use"] = time.perf_counter() - start
    start = time.perf_counter()
    floor(model, x, y)
    timings["floor"] = time.perf_counter() - start
    start = time.perf_counter()
    probust.find_issues(model, (x, y), show_progress=False)
    timings["find_issues, warm"] = time.perf_counter() - start
    for name, seconds in timings.items():
        print(
            f"  {name:<24} {seconds:8.1f} s  {seconds / timings['floor']:.2f}x the floor  ({seconds / args.n * 1e3:.2f} ms per point)"
        )
    print(f"  sigma {first['sigma'].iloc[0]:.4f}, {int(first['is_label_issue'].sum())} flagged")


if __name__ == "__main__":
    main()
