"""The modules a Taylor or MMSE call walks through: issue 34's "a newcomer can follow it".

Traces every probust function called during one ``Taylor(model, sigma)(x)`` (or MMSE) call, after
the estimator is built and warmed up (plans measured and kept: the second call is what a reader
follows), and prints:

- the probust modules entered, in order of first entry, with how often each is entered;
- the calls from the maths (any module but the estimator's own and execution's) into
  ``probust.execution`` (timing, plans, the plan cache): the climbs the issue forbids;
- the calls into ``probust.execution`` from anywhere, the estimator included, once the maths
  began (the estimator's first chunk, ``Linearised._routed``): the estimator asks execution for
  its plan once, before the maths, so this is 0 too.

Control flow, not data flow: every probust function called counts, so this bounds from above
the modules the input's values pass through. Helpers that only check options, raise errors,
show progress or draw random streams are left out (``--all`` keeps them in).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/walk.py [--method taylor|mmse] [--classes 10|1000]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch
from torch import nn

import probust

#: Modules of housekeeping, not of the computation: options, errors, progress bars, random streams.
HOUSEKEEPING = ("probust._checks", "probust.errors", "probust._progress", "probust._rng", "probust.noise")


def _model(classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, classes),
    ).eval()


def trace(call: Any, keep_housekeeping: bool) -> list[tuple[str, str, str]]:
    """(caller module, callee module, callee function) of every call into a probust module
    during ``call()``."""
    edges: list[tuple[str, str, str]] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("probust"):
            return None
        if not keep_housekeeping and module.startswith(HOUSEKEEPING):
            return None
        caller = frame.f_back
        while caller is not None:
            name = caller.f_globals.get("__name__", "")
            if name.startswith("probust") and (keep_housekeeping or not name.startswith(HOUSEKEEPING)):
                break
            caller = caller.f_back
        edges.append((caller.f_globals["__name__"] if caller is not None else "<user>", module, frame.f_code.co_name))
        return None

    sys.setprofile(None)
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return edges


#: The layer of each module group: the estimator asks execution for its plan, then runs the maths.
#: A call from the maths into execution (timing, the plan cache) is a climb back up.
EXECUTION = "probust.execution"

#: Where the maths begin: the estimator's linearisation of its first chunk.
MATHS_ENTRY = ("probust.estimators.linearised", "_routed")


def summarise(edges: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Modules in order of first entry, entries per module, the calls from any other module but
    the estimator's into execution (climbs), and the calls into execution from any other module
    once the maths began (late plans)."""
    order: list[str] = []
    entries: Counter[str] = Counter()
    climbs: Counter[tuple[str, str]] = Counter()
    late: Counter[tuple[str, str]] = Counter()
    began = False
    for caller, callee, function in edges:
        began = began or (callee, function) == MATHS_ENTRY
        if caller == callee:
            continue
        entries[callee] += 1
        if callee not in order:
            order.append(callee)
        if callee.startswith(EXECUTION) and not caller.startswith(EXECUTION):
            if not _estimator(caller):
                climbs[(caller, callee)] += 1
            if began:
                late[(caller, f"{callee}.{function}")] += 1
    return {"modules": order, "entries": entries, "climbs": climbs, "late": late, "began": began}


def _estimator(module: str) -> bool:
    return module in ("<user>", "probust.estimators.base", "probust.estimators.linearised") or module in (
        "probust.estimators.taylor",
        "probust.estimators.mmse",
    )


def _package(module: str) -> str:
    for package in ("probust.mvn", EXECUTION):
        if module.startswith(package + "."):
            return package
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("taylor", "mmse"), default="taylor")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--all", action="store_true", help="keep the housekeeping modules")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model(args.classes)
    x = torch.randn(8, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    kind = probust.Taylor if args.method == "taylor" else probust.MMSE
    estimator = kind(model, 0.3)
    estimator(x)  # plans measured and kept
    edges = trace(lambda: estimator(x), args.all)
    summary = summarise(edges)
    packages = list(dict.fromkeys(_package(m) for m in summary["modules"]))
    print(
        f"{args.method}, C = {args.classes}: {len(summary['modules'])} modules entered; "
        f"{len(packages)} counting probust.mvn and probust.execution as one each"
    )
    for module in summary["modules"]:
        print(f"  {module:45s} entered {summary['entries'][module]:4d} times")
    climbs = summary["climbs"]
    print(f"calls from the maths into execution (timing, plans, the plan cache): {sum(climbs.values())}")
    for (caller, callee), count in climbs.most_common():
        print(f"  {caller} -> {callee}: {count}")
    late = summary["late"]
    if not summary["began"]:
        raise SystemExit(f"the call never entered {'.'.join(MATHS_ENTRY)}: the walk has nothing to check")
    print(
        f"calls into execution once the maths began (the plan asked after {'.'.join(MATHS_ENTRY)}): {sum(late.values())}"
    )
    for (caller, callee), count in late.most_common():
        print(f"  {caller} -> {callee}: {count}")


if __name__ == "__main__":
    main()
