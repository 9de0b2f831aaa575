"""What the runner knows about each method, read from the method registry: defaults, sample
counts, and the estimator it builds for a task.

The per-method rules of ``probust estimate`` live in :data:`probust.estimators.REGISTRY`; the run's
settings name the estimator argument each sets (:mod:`probust.run.settings`).
"""

from __future__ import annotations

from typing import Any

from probust.estimators import METHODS, PAPER_METHODS, REGISTRY, Estimator, make_estimator, methods_with
from probust.run.prepared import PreparedRun, Task

__all__ = [
    "ADAPTIVE_METHODS",
    "DEFAULT_METHODS",
    "LINEARISED_EXTRA",
    "PULL_IN_FORWARDS",
    "SCREENED_PULLS",
    "LINEARISED_MC_METHODS",
    "METHODS",
    "P_FAIL_METHODS",
    "evaluations",
    "make_task_estimator",
    "reported_as",
    "sample_kind",
    "tasks",
    "uses_mmse_samples",
]

#: The paper's six methods: what a run computes unless told otherwise (the Monte Carlo
#: variants "mc_cv" and "mc_is" cost as much as "mc" each, so they are asked for by name).
DEFAULT_METHODS = PAPER_METHODS
#: The Monte Carlo methods that stop a point early in an adaptive run (``target_half_width``).
ADAPTIVE_METHODS = methods_with("target_half_width")
#: The analytic methods that compute ``p_fail`` on request (``p_fail=True``, ``--p-fail``).
P_FAIL_METHODS = methods_with("p_fail")
#: The Monte Carlo methods around an MMSE linearisation: its copies are the smallest ``mmse_samples``.
LINEARISED_MC_METHODS = methods_with("mmse_samples")


def sample_kind(method: str) -> str | None:
    """Which sample counts a method takes: "mc" (Monte Carlo draws), "mmse" (copies) or None."""
    return REGISTRY[method].samples


def uses_mmse_samples(method: str) -> bool:
    """Whether ``mmse_samples`` changes a method's rows: MMSE's copies or its linearisation's."""
    return sample_kind(method) == "mmse" or method in LINEARISED_MC_METHODS


#: The declared cost of one row's backward pass (a "pull") in forward passes of one row, for the
#: run's progress bar only (no number depends on it): about twice a forward pass's arithmetic,
#: plus the forward pass it pulls through.
PULL_IN_FORWARDS = 3
#: The most exact gradients a linearisation is declared to pull per point: past a few dozen
#: classes the screenings (:mod:`probust.linearisation`) leave the rest out.
SCREENED_PULLS = 32
#: The rest of a Taylor or MMSE point in forward passes: the trust check's draws and the map's
#: arithmetic (the mvn-cdf of C - 1 dimensions).
LINEARISED_EXTRA = 16


def evaluations(task: Task, classes: int = 2) -> int:
    """The declared cost of one point of ``task`` in model evaluations (forward passes of one row),
    as the run's progress bar counts it, so that methods of very different costs share one bar
    without it reaching 99% while the slower ones still work.

    Monte Carlo (mc, mc_cv, mc_is): its draws. Softmax: one. Taylor and MMSE, for a model of
    ``classes`` classes: per linearisation (one for Taylor, one per copy for MMSE) a forward pass
    and up to :data:`SCREENED_PULLS` backward passes at :data:`PULL_IN_FORWARDS` each, plus
    :data:`LINEARISED_EXTRA`. Declared, never timed: on a 2-core CPU (a small CNN at 1 x 28 x 28
    with C = 10 and at 3 x 32 x 32 with C = 100) Taylor and MMSE(5) cost within 10% of these
    figures against Monte Carlo's forward passes.
    """
    kind = sample_kind(task.method)
    if kind == "mc":
        return task.n_samples
    if not REGISTRY[task.method].uses_noise:
        return 1
    linearisation = 1 + PULL_IN_FORWARDS * min(max(classes - 1, 1), SCREENED_PULLS)
    copies = task.n_samples if kind == "mmse" else 1
    return copies * linearisation + LINEARISED_EXTRA


def reported_as(task: Task, classes: int = 2) -> int:
    """The evaluations (:func:`evaluations`) each unit ``task``'s estimator reports to its progress
    bar stands for: the Monte Carlo methods report draws (1), the linearised ones points (a point
    is its declared cost)."""
    return 1 if sample_kind(task.method) == "mc" else evaluations(task, classes)


def tasks(sigmas: list[float], methods: list[str], mc: list[int], mmse: list[int]) -> list[Task]:
    """The (sigma, method, sample count) grid, in the order it is computed."""
    counts = {"mc": mc, "mmse": mmse, None: [0]}
    return [Task(s, m, n) for s in sigmas for m in methods for n in counts[sample_kind(m)]]


def make_task_estimator(plan: PreparedRun, task: Task) -> Estimator:
    """The estimator that computes ``task``'s rows with the plan's settings.

    Its keyword arguments are those the settings declare for estimators (see
    :func:`probust.run.settings.estimator_parameters`), plus the task's sample count and, for the
    Monte Carlo methods around an MMSE linearisation, its copies."""
    from probust.run.settings import estimator_parameters

    spec = REGISTRY[task.method]
    kwargs: dict[str, Any] = estimator_parameters(plan.settings, spec.run_options)
    if "mmse_samples" in spec.run_options:
        kwargs["mmse_samples"] = plan.linearisation_samples
    if spec.samples is not None:
        kwargs["n_samples"] = task.n_samples
    noise = task.sigma if plan.noise is None else plan.noise.at(task.sigma)
    return make_estimator(task.method, plan.model, noise if spec.uses_noise else None, **kwargs)
