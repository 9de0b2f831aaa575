"""What "the same numbers" means: batch splits, execution plans and thread counts, measured.

docs/estimate.md ("Reproducibility") states what holds: bitwise equality for a fixed plan however
the points are split into calls, and agreement to float rounding across plans and thread counts.
This script measures it, for every registered method, on the models the tests use plus a small
CNN and an MLP, in float32 and float64, so the numbers in the docs (and the tolerances of the
tests that cite them) can be regenerated:

    PYTHONPATH=src python benchmarks/plan_agreement.py            # the table (a few minutes, 2 cores)
    PYTHONPATH=src python benchmarks/plan_agreement.py --quick --dtypes float32   # fewer plans (5 min)

Everything is seeded (the models, the points, the estimators' seed): a rerun on the same machine
and torch build prints the same table. Columns, per method and dtype, over all models:

- split: the largest |dp| between one call on all points and the same plan called on x[:k] and
  x[k:] (index_offset=k) for every k; "==" when every field of the Estimate is bitwise equal.
  Parts of one row are reported apart (split1): a one-row pass may round differently inside the
  model.
- plans: the largest |dp| and |dz| (the z-scores, or the margins for the methods without z)
  between the reference plan (rows per pass 32, Jacobian "loop", contiguous format) and each
  other plan: rows per pass 1 / 7 / 128, Jacobian "vmap", every gradient by forward mode
  (``gradients="forward", prune="off"``), channels_last (CNNs), the gradient routes "direct" /
  "head" / "forward" (taylor, mmse).
- routes: the routes "head" and "forward" against "direct", all three with pruning on (the
  dropped boundaries are the same whichever route computes the kept ones).
- pruning: |dp| between pruning on (route "direct") and the reference (the full sum at C = 10),
  checked against the pruned estimate's cdf_error, which counts the dropped boundaries' mass
  (the script exits 1 where it does not hold).
- threads: the same plan with torch.set_num_threads(T) (T = the machine's cores, a user's
  default) against one thread, and the batch-split check repeated at T threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests._helpers

from tests._helpers import TinyCNN, linear_model, points_near_boundaries  # noqa: E402

import probust  # noqa: E402
from probust.estimators import REGISTRY, Estimate, make_estimator  # noqa: E402
from probust.execution import Execution
from probust.linearisation.routes import FORCING  # noqa: E402
from probust.models import build  # noqa: E402

POINTS = 8


def models() -> dict[str, tuple[nn.Module, Tensor, float]]:
    """(model, points, sigma): the contract suite's two, the plan tests' CNN, the runner's MLP,
    and probust's own MLP."""
    lin = linear_model(12, 10, seed=3)
    torch.manual_seed(3)
    cnn = build("cnn", 10, (1, 12, 12)).eval()
    torch.manual_seed(0)
    tiny_mlp = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))
    torch.manual_seed(1)
    mlp = build("mlp", 10, (1, 8, 8)).eval()
    gen = torch.Generator().manual_seed(2)
    return {
        "linear": (lin, points_near_boundaries(lin, POINTS, 0.3), 0.3),
        "tinycnn": (TinyCNN(classes=3, seed=0).eval(), torch.randn(POINTS, 1, 8, 8, generator=gen) * 0.5, 2.0),
        "cnn": (cnn, torch.rand(POINTS, 1, 12, 12, generator=gen), 0.3),
        "tiny_mlp": (tiny_mlp, torch.rand(POINTS, 1, 4, 4, generator=gen), 0.3),
        "mlp": (mlp, torch.rand(POINTS, 1, 8, 8, generator=gen), 0.3),
    }


def settings(name: str, *, batch_size: int = 32, jacobian: str = "loop", channels_last: bool = False) -> dict:
    spec = REGISTRY[name]
    how: dict[str, Any] = dict(batch_size=batch_size, memory_budget="256MB", channels_last=channels_last)
    if "jacobian" in spec.run_options:
        how["jacobian"] = jacobian
    s: dict[str, Any] = dict(execution=Execution(**how), seed=0)
    if spec.samples == "mc":
        s["n_samples"] = 256
    elif spec.samples == "mmse":
        s["n_samples"] = 3
    if "tol" in spec.run_options:
        s["tol"] = 1e-3
    if "mmse_samples" in spec.run_options:
        s["mmse_samples"] = 3
    return s


def field_diffs(a: Estimate, b: Estimate) -> tuple[bool, dict[str, float]]:
    """(every field bitwise equal, max |a - b| per float field; NaN where only one side is NaN)."""
    same, diffs = True, {}
    for f in dataclasses.fields(Estimate):
        u, v = getattr(a, f.name), getattr(b, f.name)
        if not isinstance(u, Tensor):
            same &= u == v
            continue
        u, v = u.double(), v.double()
        nan = u.isnan() | v.isnan()
        if not torch.equal(u.isnan(), v.isnan()):
            same, diffs[f.name] = False, float("nan")
            continue
        u, v = torch.where(nan, 0.0, u), torch.where(nan, 0.0, v)
        finite = u.isfinite() & v.isfinite()
        same &= torch.equal(u, v)
        d = (u - v)[finite].abs()
        diffs[f.name] = float(d.max()) if d.numel() else 0.0
    return bool(same), diffs


def z_like(d: dict[str, float]) -> float:
    return max(d.get("z", 0.0), d.get("margin", 0.0) if "z" not in d else 0.0)


class Table:
    def __init__(self) -> None:
        self.cells: dict[tuple[str, str, str], list] = defaultdict(lambda: [True, 0.0, 0.0, set()])

    def add(self, method: str, dtype: str, column: str, same: bool, diffs: dict[str, float], model: str = "") -> None:
        cell = self.cells[(method, dtype, column)]
        cell[0] &= same
        cell[1] = max(cell[1], diffs.get("p", 0.0))
        cell[2] = max(cell[2], z_like(diffs))
        if not same:
            cell[3].add(model)

    def show(self, columns: list[str]) -> None:
        print("| method | dtype | " + " | ".join(columns) + " |")
        print("|---|---|" + "---|" * len(columns))
        keys = sorted({(m, d) for m, d, _ in self.cells}, key=lambda k: (list(REGISTRY).index(k[0]), k[1]))
        for method, dtype in keys:
            row = []
            for column in columns:
                if (method, dtype, column) not in self.cells:
                    row.append("-")
                    continue
                same, dp, dz, where = self.cells[(method, dtype, column)]
                row.append("==" if same else f"p {dp:.1e}, z {dz:.1e} ({'/'.join(sorted(where))})")
            print(f"| {method} | {dtype} | " + " | ".join(row) + " |")


def call(name: str, model: nn.Module, x: Tensor, sigma: float, offset: int = 0, **overrides: Any) -> Estimate:
    s = settings(name, **{k: overrides.pop(k) for k in ("batch_size", "jacobian", "channels_last") if k in overrides})
    return make_estimator(name, model, sigma, **(s | overrides))(x, index_offset=offset)


def splits(name, model, x, sigma, table, dtype, column, model_name, **plan) -> None:
    whole = call(name, model, x, sigma, **plan)
    for k in range(1, len(x)):
        parts = Estimate.cat([call(name, model, x[:k], sigma, **plan), call(name, model, x[k:], sigma, k, **plan)])
        one_row = k in (1, len(x) - 1)
        table.add(name, dtype, column + ("1" if one_row else ""), *field_diffs(whole, parts), model_name)


def prune_check(table: Table, name: str, dtype: str, model_name: str, full: Estimate, pruned: Estimate) -> None:
    """Pruning against the full sum: |dp| must stay within the pruned estimate's cdf_error (which
    counts the dropped boundaries' mass); the excess over it, if any, is printed."""
    dp = (full.p.double() - pruned.p.double()).abs()
    allowed = pruned.cdf_error.double() if pruned.cdf_error is not None else torch.zeros_like(dp)
    excess = float((dp - allowed).max())
    table.add(name, dtype, "pruning", bool(torch.equal(full.p, pruned.p)), {"p": float(dp.max())}, model_name)
    PRUNING.append((model_name, name, dtype, float(dp.max()), float(allowed.max()), excess))


#: (model, method, dtype, max |dp| pruned against full, max cdf_error, max excess of |dp| over it)
PRUNING: list[tuple[str, str, str, float, float, float]] = []


def plans(name: str, model: nn.Module, x: Tensor, sigma: float, quick: bool) -> list[dict]:
    spec = REGISTRY[name]
    out: list[dict] = [dict(batch_size=rows) for rows in ((7, 128) if quick else (1, 7, 128))]
    if "jacobian" in spec.run_options:
        out += [dict(jacobian="vmap")]
    if "gradients" in spec.run_options and not quick:
        out += [dict(gradients="forward", prune="off")]
    if x.ndim == 4 and any(p.ndim == 4 for p in model.parameters()):
        out.append(dict(channels_last=True))
    if "prune" in spec.run_options and not quick:
        out += [dict(FORCING[r]) for r in ("direct", "head", "forward")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer plans (no 1 row per pass, forward mode, routes)")
    parser.add_argument("--methods", nargs="*", default=list(REGISTRY))
    parser.add_argument("--models", nargs="*", default=None, help="some of the models (default: all)")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "float64"], choices=["float32", "float64"])
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"torch {torch.__version__}, {cores} cores; split/plans at 1 thread, threads column at {cores}")
    table = Table()
    dtypes = [getattr(torch, name) for name in args.dtypes]
    for dtype in dtypes:
        for model_name, (model, x, sigma) in models().items():
            if args.models and model_name not in args.models:
                continue
            model, x = model.to(dtype), x.to(dtype)
            dname = str(dtype).removeprefix("torch.")
            for name in args.methods:
                torch.set_num_threads(1)
                splits(name, model, x, sigma, table, dname, "split", model_name)
                reference = call(name, model, x, sigma)
                pruned = None
                for plan in plans(name, model, x, sigma, args.quick):
                    key = ",".join(f"{k}={v}" for k, v in plan.items())
                    try:
                        other = call(name, model, x, sigma, **plan)
                    except (ValueError, RuntimeError) as exc:
                        print(f"  {model_name} {name} {dname} {key}: not run ({str(exc)[:80]})")
                        continue
                    if "gradients" in plan and "prune" not in plan:
                        # Pruning drops boundaries (their mass is in cdf_error): a route is compared
                        # with the direct route under the same pruning, and pruning with the full sum.
                        if plan["gradients"] == "direct":  # listed first: the routes' reference
                            pruned = other
                            prune_check(table, name, dname, model_name, reference, pruned)
                            continue
                        assert pruned is not None
                        same, d = field_diffs(pruned, other)
                        table.add(name, dname, "routes", same, d, model_name)
                        if d.get("p", 0) > 1e-7 or z_like(d) > 1e-6:
                            print(
                                f"  {model_name} {name} {dname} {key} (pruned): p {d.get('p', 0):.2e} z {z_like(d):.2e}"
                            )
                        continue
                    same, d = field_diffs(reference, other)
                    table.add(name, dname, "plans", same, d, model_name)
                    if d.get("p", 0) > 1e-7 or z_like(d) > 1e-6:
                        print(f"  {model_name} {name} {dname} {key}: p {d.get('p', 0):.2e} z {z_like(d):.2e}")
                torch.set_num_threads(cores)
                table.add(name, dname, "threads", *field_diffs(reference, call(name, model, x, sigma)), model_name)
                splits(name, model, x, sigma, table, dname, f"split@{cores}", model_name)
                torch.set_num_threads(1)
    columns = ["split", "split1", "plans", "routes", "threads", f"split@{cores}", f"split@{cores}1", "pruning"]
    print()
    table.show(columns)
    if PRUNING:
        worst = max(PRUNING, key=lambda r: r[5])
        print(
            f"\npruning: |p(prune on) - p(prune off)| at most {max(r[3] for r in PRUNING):.1e}; the pruned "
            f"estimate's cdf_error at most {max(r[4] for r in PRUNING):.1e}; |dp| - cdf_error at most "
            f"{worst[5]:.1e} ({worst[0]} {worst[1]} {worst[2]}): "
            + ("within the stated error everywhere" if worst[5] <= 0 else "BEYOND the stated error")
        )
        if worst[5] > 0:
            sys.exit(1)
    print("\n==: every field bitwise equal; otherwise the largest |dp| and |dz| (margins where no z).")
    _ = probust  # the package under test (PYTHONPATH=src)


if __name__ == "__main__":
    main()
