"""The modules a Taylor or MMSE call walks through: issue 34's "a newcomer can follow it".

Runs one ``Taylor(model, sigma)(x)`` (or MMSE) call after the estimator is built and warmed up
(plans measured and kept: the second call is what a reader follows), twice, and prints:

- control flow: every probust module a function of which runs, in order of first entry, with
  how often each is entered, and issue 51's measure (:func:`module_changes`: the modules outside
  ``probust.mvn`` and how often the running module changes; ``--all`` counts as the issue does);
- data flow, the input's path: the modules whose functions receive the input ``x``, its rows,
  layouts or noisy copies (:func:`follow`; the issue's "the input enters at most 8 modules").
  Below execution's door the planners get ``x`` as an ``execution.engine.Inputs``, a description
  that draws rows only to measure a plan; rows drawn in a warm call would show here as the
  functions that receive them;
- where ``probust.execution`` and ``probust.mvn`` are entered from the rest of probust, and any
  call that went past their door (the names their ``__init__`` exports); a package entered only
  through its door counts as one module, the step of the call it is (the plan, the mvn-cdf);
- the calls from the maths (any module but the estimator's own and execution's) into
  ``probust.execution`` (timing, plans, the plan cache): the climbs the issue forbids;
- the calls into ``probust.execution`` from anywhere, the estimator included, once the maths
  began (the estimator's first chunk, ``Linearised._routed``): the estimator asks execution for
  its plan once, before the maths, so this is 0 too.

Helpers that only check options, raise errors, show progress or draw random streams are left
out (``--all`` keeps them in). ``tests/estimators/test_input_path.py`` runs the same walks.

Run:  PYTHONPATH=src .venv/bin/python benchmarks/walk.py [--method taylor|mmse] [--classes 10|1000]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
import weakref
from collections import Counter
from types import FrameType
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

import probust

#: Modules of housekeeping, not of the computation: options, errors, progress bars, random streams.
HOUSEKEEPING = ("probust._checks", "probust.errors", "probust._progress", "probust.noise")


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
        edges.append(
            (caller.f_globals["__name__"] if caller is not None else "<user>", module, frame.f_code.co_qualname)
        )
        return None

    sys.setprofile(None)
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return edges


class _InputTaint(TorchFunctionMode):
    """Marks the tensors that hold the input's values in its own space [*, *S]: ``x``, its rows and
    views, other layouts and dtypes of them, noisy copies ``x + eps``. A torch op's output is marked
    where one of its tensor arguments is and its shape ends in S; gradients (``torch.autograd.grad``,
    which torch.func's pulls call) and new tensors shaped like one (``*_like``, ``new_*``) are other
    quantities in the same space and are not."""

    def __init__(self, x: Tensor) -> None:
        super().__init__()
        self.space = tuple(x.shape[1:])
        self.held: dict[int, weakref.ref[Tensor]] = {}
        self.mark(x)

    def mark(self, tensor: Tensor) -> None:
        self.held[id(tensor)] = weakref.ref(tensor)

    def holds(self, value: Any) -> bool:
        for item in _leaves(value):
            ref = self.held.get(id(item)) if isinstance(item, Tensor) else None
            if ref is not None and ref() is item:
                return True
        return False

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        other = func is torch.autograd.grad or name.endswith("_like") or name.startswith("new_")
        if not other and self.holds([*args, *(kwargs or {}).values()]):
            for item in _leaves(out):
                if isinstance(item, Tensor) and tuple(item.shape[item.ndim - len(self.space) :]) == self.space:
                    self.mark(item)
        return out


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def follow(call: Any, x: Tensor, keep_housekeeping: bool) -> list[tuple[str, str]]:
    """(module, function) of every probust function that receives the input during ``call()``: an
    argument holding ``x`` or a tensor made from its values in its own space (:class:`_InputTaint`),
    alone or inside a list, tuple or dict. Data flow: the modules the input itself enters."""
    hits: list[tuple[str, str]] = []
    taint = _InputTaint(x)

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("probust") or (not keep_housekeeping and module.startswith(HOUSEKEEPING)):
            return None
        code = frame.f_code
        arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(taint.holds(frame.f_locals.get(name)) for name in arguments):
            hits.append((module, code.co_qualname))
        return None

    with taint:
        sys.settrace(tracer)
        try:
            call()
        finally:
            sys.settrace(None)
    return hits


#: The layer of each module group: the estimator asks execution for its plan, then runs the maths.
#: A call from the maths into execution (timing, the plan cache) is a climb back up.
EXECUTION = "probust.execution"

#: Where the maths begin: the estimator's linearisation of its first chunk.
MATHS_ENTRY = ("probust.estimators.linearised", "Linearised._routed")


def summarise(edges: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Modules in order of first entry, entries per module, the modules of each package
    (:data:`PACKAGES`) entered from outside it and whether each call came through its door
    (:func:`through_door`), the calls from any other module but
    the estimator's into execution (climbs), and the calls into execution from any other module
    once the maths began (late plans)."""
    order: list[str] = []
    entries: Counter[str] = Counter()
    doors: dict[str, set[str]] = {package: set() for package in PACKAGES}
    bypasses: dict[str, set[str]] = {package: set() for package in PACKAGES}
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
        package = _package(callee)
        if package in doors and _package(caller) != package:
            doors[package].add(callee)
            if not through_door(package, function):
                bypasses[package].add(f"{callee}.{function}")
        if callee.startswith(EXECUTION) and not caller.startswith(EXECUTION):
            if not _estimator(caller):
                climbs[(caller, callee)] += 1
            if began:
                late[(caller, f"{callee}.{function}")] += 1
    return {
        "modules": order,
        "entries": entries,
        "doors": doors,
        "bypasses": bypasses,
        "climbs": climbs,
        "late": late,
        "began": began,
    }


def _estimator(module: str) -> bool:
    return module in ("<user>", "probust.estimators.base", "probust.estimators.linearised") or module in (
        "probust.estimators.taylor",
        "probust.estimators.mmse",
    )


#: Packages a reader meets as one step of the call (the plan, the mvn-cdf), each entered from the
#: rest of probust through its door, the names its ``__init__`` exports: ``probust.execution``'s
#: :class:`Execution` and plan types, ``probust.mvn``'s ``mvn_cdf`` (``lint-imports`` forbids
#: importing the modules underneath). The walk counts such a package as one module only where
#: every call into it from outside went through the door (:func:`summarise`, ``bypasses``).
PACKAGES = (EXECUTION, "probust.linearisation", "probust.mvn")


def _package(module: str) -> str:
    for package in PACKAGES:
        if module.startswith(package + "."):
            return package
    return module


def through_door(package: str, qualname: str) -> bool:
    """Whether a function of ``package`` (its qualified name) is one of the names the package
    exports, or a method of one."""
    exported = getattr(importlib.import_module(package), "__all__", ())
    return qualname.split(".")[0] in exported


def count(modules: list[str], bypasses: dict[str, set[str]]) -> int:
    """Modules, a package of :data:`PACKAGES` entered only through its door counted as one."""
    closed = {package for package, calls in bypasses.items() if not calls}
    return len(dict.fromkeys(_package(m) if _package(m) in closed else m for m in modules))


def module_changes(edges: list[tuple[str, str, str]]) -> tuple[int, int]:
    """Issue 51's measure of a trace: the probust modules outside ``probust.mvn`` that run, and how
    often the running module changes from one call to the next among them (the first call counts
    as one change)."""
    called = [callee for _, callee, _ in edges if not callee.startswith("probust.mvn")]
    changes = sum(1 for i, module in enumerate(called) if i == 0 or module != called[i - 1])
    return len(set(called)), changes


def walk(method: str, classes: int, keep_housekeeping: bool = False) -> dict[str, Any]:
    """Both walks of a warm ``Taylor`` or ``MMSE`` call on :func:`_model` (``classes`` logits) and
    8 points: :func:`summarise` of the control flow, with ``path`` (:func:`follow`: the input's data
    flow) and ``path_modules`` (its modules in order of first entry)."""
    model = _model(classes)
    x = torch.randn(8, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    kind = probust.Taylor if method == "taylor" else probust.MMSE
    estimator = kind(model, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", probust.LinearisationWarning)  # the toy model's points are not at issue
        estimator(x)  # plans measured and kept
        edges = trace(lambda: estimator(x), keep_housekeeping)
        summary = summarise(edges)
        summary["outside_mvn"] = module_changes(edges)
        summary["path"] = follow(lambda: estimator(x), x, keep_housekeeping)
    summary["path_modules"] = list(dict.fromkeys(module for module, _ in summary["path"]))
    if not summary["began"]:
        raise RuntimeError(f"the call never entered {'.'.join(MATHS_ENTRY)}: the walk has nothing to check")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("taylor", "mmse"), default="taylor")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--all", action="store_true", help="keep the housekeeping modules")
    args = parser.parse_args()
    torch.set_num_threads(1)
    summary = walk(args.method, args.classes, args.all)
    modules, bypasses, entered = summary["modules"], summary["bypasses"], summary["path_modules"]
    packages = ", ".join(PACKAGES)
    print(
        f"{args.method}, C = {args.classes}: {len(modules)} modules entered (control flow); "
        f"{count(modules, bypasses)} counting each of {packages} as one where entered through its door only"
    )
    outside, changes = summary["outside_mvn"]
    print(f"outside probust.mvn: {outside} modules, {changes} changes of module (call by call)")
    for module in modules:
        print(f"  {module:45s} entered {summary['entries'][module]:4d} times")
    for package, door in summary["doors"].items():
        print(f"{package} entered from outside in: {', '.join(sorted(door)) or 'not entered'}")
        for call in sorted(bypasses[package]):
            print(f"  past its door: {call}")
    print(
        f"the input's path (data flow: the functions that receive x, its rows, layouts or noisy copies): "
        f"{len(entered)} modules; {count(entered, bypasses)} counting each of {packages} as one where entered through its door only"
    )
    for module in entered:
        functions = ", ".join(dict.fromkeys(function for m, function in summary["path"] if m == module))
        print(f"  {module:45s} {functions}")
    climbs = summary["climbs"]
    print(f"calls from the maths into execution (timing, plans, the plan cache): {sum(climbs.values())}")
    for (caller, callee), calls in climbs.most_common():
        print(f"  {caller} -> {callee}: {calls}")
    late = summary["late"]
    print(
        f"calls into execution once the maths began (the plan asked after {'.'.join(MATHS_ENTRY)}): {sum(late.values())}"
    )
    for (caller, callee), calls in late.most_common():
        print(f"  {caller} -> {callee}: {calls}")


if __name__ == "__main__":
    main()
