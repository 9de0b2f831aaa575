"""What the runner knows about each method: defaults, sample counts, and the estimator it builds.

The per-method rules of ``probust estimate`` live here and nowhere else in :mod:`probust.run`.
"""

from __future__ import annotations

from typing import Any

from probust.functional import METHODS, make_estimator
from probust.run.plan import RunPlan, Task

__all__ = [
    "ADAPTIVE_METHODS",
    "DEFAULT_METHODS",
    "LINEARISED_MC_METHODS",
    "METHODS",
    "P_FAIL_METHODS",
    "make_task_estimator",
    "sample_kind",
    "tasks",
    "uses_mmse_samples",
]

#: The paper's six methods: what a run computes unless told otherwise (the Monte Carlo
#: variants "mc_cv" and "mc_is" cost as much as "mc" each, so they are asked for by name).
DEFAULT_METHODS = tuple(m for m in ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax") if m in METHODS)
#: The Monte Carlo methods that stop a point early in an adaptive run (``mc_half_width``).
ADAPTIVE_METHODS = ("mc", "mc_cv")
#: The analytic methods that compute ``p_fail`` on request (``p_fail=True``, ``--p-fail``).
P_FAIL_METHODS = ("taylor", "mmse", "taylor_mvs", "mmse_mvs")
#: The Monte Carlo methods around an MMSE linearisation: its copies are the smallest ``mmse_samples``.
LINEARISED_MC_METHODS = ("mc_cv", "mc_is")


def sample_kind(method: str) -> str | None:
    """Which sample counts a method takes: "mc" (Monte Carlo draws), "mmse" (copies) or None."""
    return "mc" if method.startswith("mc") else "mmse" if method.startswith("mmse") else None


def uses_mmse_samples(method: str) -> bool:
    """Whether ``mmse_samples`` changes a method's rows: MMSE's copies or its linearisation's."""
    return sample_kind(method) == "mmse" or method in LINEARISED_MC_METHODS


def tasks(sigmas: list[float], methods: list[str], mc: list[int], mmse: list[int]) -> list[Task]:
    """The (sigma, method, sample count) grid, in the order it is computed."""
    counts = {"mc": mc, "mmse": mmse, None: [0]}
    return [Task(s, m, n) for s in sigmas for m in methods for n in counts[sample_kind(m)]]


def make_task_estimator(plan: RunPlan, task: Task):
    """The estimator that computes ``task``'s rows with the plan's settings."""
    kwargs: dict[str, Any] = {"seed": plan.seed, "memory_budget": plan.memory_budget}
    if plan.channels_last is not None:
        kwargs["channels_last"] = plan.channels_last
    if plan.eval_batch_size is not None:
        kwargs["batch_size"] = plan.eval_batch_size
    if task.method not in ("mc", "softmax"):
        kwargs["jacobian"] = plan.jacobian
    kind = sample_kind(task.method)
    if task.method == "softmax":
        kwargs["temperature"] = plan.temperature
    elif task.method == "mc":
        kwargs.update(n_samples=task.n_samples, confidence=plan.ci_level, interval=plan.interval)
    elif kind == "mc":  # mc_cv, mc_is: Monte Carlo around an MMSE linearisation (mvn-cdf)
        kwargs.update(
            n_samples=task.n_samples, confidence=plan.ci_level, tol=plan.tol, mmse_samples=plan.linearisation_samples
        )
    elif kind == "mmse":
        kwargs.update(n_samples=task.n_samples, tol=plan.tol, sampling=plan.mmse_sampling)
    else:
        kwargs["tol"] = plan.tol
    if task.method in P_FAIL_METHODS and plan.p_fail:
        kwargs["p_fail"] = True
    if task.method in ADAPTIVE_METHODS and plan.mc_half_width is not None:
        kwargs["target_half_width"] = plan.mc_half_width
    sigma = None if task.method == "softmax" else task.sigma
    return make_estimator(task.method, plan.model, sigma, **kwargs)
