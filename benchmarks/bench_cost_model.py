"""The declared cost model against the device: a forward-mode probe's cost in pulls.

:data:`probust.linearisation.counting.JVP_IN_PULLS` declares, per device kind, what one forward-mode
probe of one row costs in backward passes of one row ("pulls"); the routes weigh passes by it, so
it decides what is computed and is never measured at run time. This benchmark measures it where it
matters: torchvision architectures with random weights at 3 x 224 x 224, ``--rows`` rows at once
(one row: what a single point's pullbacks see; more: a GPU nearer to saturation), on ``--device``.

Per model, the marginal cost of one unit, with the forward pass taken out: the seconds of K_HIGH
units minus those of K_LOW units, over (K_HIGH - K_LOW) x rows (best of ``--repeats``):

- a pull: :class:`probust.linearisation.pullback.Pullback` over the rows (its forward pass with autograd), then
  K cotangents per row on the features pulled back, by loop and by vmap (the routes time the two and take
  the faster: the smaller of the two is the pull);
- a probe: :func:`probust.linearisation.forward_mode.jvps` along K input tangents (one vmapped forward-mode
  pass), as the sketch runs its probes.

Prints probe / pull per model against the declared figure. Run:

    PYTHONPATH=src .venv/bin/python benchmarks/bench_cost_model.py [--device cuda] [--models resnet18 ...]
        [--rows 1 16] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torchvision
from torch import nn

from probust.linearisation import forward_mode
from probust.linearisation.counting import jvp_in_pulls
from probust.linearisation.head import find_linear_head
from probust.linearisation.pullback import Pullback, cannot_trace

K_LOW, K_HIGH = 8, 40


def _model(name: str, vit_layers: int) -> nn.Module:
    torch.manual_seed(0)
    if name == "resnet18":
        return torchvision.models.resnet18().eval()
    if name == "resnet50":
        return torchvision.models.resnet50().eval()
    return torchvision.models.VisionTransformer(
        image_size=224, patch_size=16, num_layers=vit_layers, num_heads=12, hidden_dim=768, mlp_dim=3072
    ).eval()


def _seconds(work: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Best of ``repeats`` timed calls, after one untimed call."""
    best = float("inf")
    for attempt in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, device: torch.device, rows: int, repeats: int, vit_layers: int) -> dict[str, float]:
    """Milliseconds of one pull and one probe of one row (marginal, over ``rows`` rows at once) and
    their ratio; no probe figures where forward mode cannot run through the model."""
    model = _model(name, vit_layers).to(device)
    x = torch.rand(rows, 3, 224, 224, generator=torch.Generator().manual_seed(1)).to(device)
    head = find_linear_head(model, x[:1])
    width = head.in_features if head is not None else 1000
    gen = torch.Generator().manual_seed(2)
    cotangents = {k: torch.randn(k, rows, width, generator=gen).to(device) for k in (K_LOW, K_HIGH)}
    tangents = {k: torch.randn(k, *x.shape, generator=gen).to(device) for k in (K_LOW, K_HIGH)}
    units = (K_HIGH - K_LOW) * rows
    row: dict[str, float] = {}
    for strategy in ("loop", "vmap"):
        t = {
            k: _seconds(
                lambda k=k, s=strategy: Pullback(model, x, head, strategy=s).pull(cotangents[k]), device, repeats
            )
            for k in (K_LOW, K_HIGH)
        }
        row[f"pull_{strategy}_ms"] = 1e3 * (t[K_HIGH] - t[K_LOW]) / units
    row["pull_ms"] = min(row["pull_loop_ms"], row["pull_vmap_ms"])
    try:
        with torch.no_grad():
            t = {
                k: _seconds(lambda k=k: forward_mode.jvps(model, x, tangents[k]), device, repeats)
                for k in (K_LOW, K_HIGH)
            }
    except RuntimeError as exc:  # NotImplementedError included
        if not cannot_trace(exc):
            raise
        print(f"{name:>9}: forward mode does not run on {device} ({str(exc).splitlines()[0][:100]})", flush=True)
        return row
    row["probe_ms"] = 1e3 * (t[K_HIGH] - t[K_LOW]) / units
    row["probe_in_pulls"] = row["probe_ms"] / row["pull_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument(
        "--models", nargs="+", default=["resnet18", "resnet50", "vit"], choices=["resnet18", "resnet50", "vit"]
    )
    parser.add_argument("--rows", nargs="+", type=int, default=[1], help="rows per pass (each a row of the table)")
    parser.add_argument("--vit-layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every number to this file")
    args = parser.parse_args()
    where = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    declared = jvp_in_pulls(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}; declared probe = {declared} pulls")
    rows = []
    for name in args.models:
        for count in args.rows:
            row = {"model": name, "rows": count, **measure(name, args.device, count, args.repeats, args.vit_layers)}
            rows.append(row)
            probe = (
                f"probe {row['probe_ms']:.3f} ms  probe/pull {row['probe_in_pulls']:.2f} (declared {declared})"
                if "probe_ms" in row
                else "no forward mode"
            )
            print(
                f"{name:>9} x{count:<3}: pull {row['pull_ms']:.3f} ms (loop {row['pull_loop_ms']:.3f}, "
                f"vmap {row['pull_vmap_ms']:.3f})  {probe}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "declared": declared, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
