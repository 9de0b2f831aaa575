"""The one list of methods: what ``probust.estimate``, the runner, the CLI, the demo and the
figures know about each estimator (its maths and options; how figures draw it is
:mod:`probust.experiments.style`'s).

Adding a method: write its estimator (one file in this package) and add one
:class:`MethodSpec` to :data:`REGISTRY` (and, for figures, its look to
``probust.experiments.style.METHOD_STYLES``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from probust.errors import OptionError
from probust.estimators.base import Estimator
from probust.estimators.control_variate import MonteCarloCV
from probust.estimators.importance import MonteCarloIS
from probust.estimators.mmse import MMSE
from probust.estimators.monte_carlo import DEFAULT_DRAWS, MonteCarlo
from probust.estimators.softmax import Softmax
from probust.estimators.taylor import Taylor

#: The run settings a method may take (names of its estimator's constructor options, or of the
#: :class:`~probust.execution.Execution` it runs by: ``jacobian``).
RUN_OPTIONS = (
    "confidence",
    "interval",
    "tol",
    "sampling",
    "temperature",
    "jacobian",
    "gradients",
    "mmse_samples",
    "p_fail",
    "target_half_width",
    "prune",
    "check_draws",
)


@dataclass(frozen=True)
class MethodSpec:
    """Everything the rest of probust needs to know about one method.

    Attributes:
        name: the method's name, as in ``Estimate.method`` and the results table ("mmse").
        estimator: the estimator class.
        options: constructor options fixed by the method (e.g. ``{"cdf": "mv-sigmoid"}``).
        samples: what ``n_samples`` counts: "mc" (Monte Carlo draws per point), "mmse" (noisy
            copies per point) or None (the method takes no sample count).
        default_samples: the estimator's default ``n_samples`` (None: no sample count).
        run_options: which run settings (of :data:`RUN_OPTIONS`) the runner passes to it.
        uses_noise: False for methods that ignore the noise (softmax: ``sigma`` may be None).
        needs_gaussian: the method refuses non-Gaussian noise (its correction is a Gaussian
            integral or density ratio).
        paper: one of the paper's six methods (run by default).
    """

    name: str
    estimator: type[Estimator]
    options: Mapping[str, Any] = field(default_factory=dict)
    samples: Literal["mc", "mmse"] | None = None
    default_samples: int | None = None
    run_options: frozenset[str] = frozenset()
    uses_noise: bool = True
    needs_gaussian: bool = False
    paper: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.run_options) - set(RUN_OPTIONS)
        if unknown:
            raise ValueError(f"run_options of {self.name!r} name unknown settings {sorted(unknown)}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def linearised(self) -> bool:
        """Monte Carlo around an MMSE linearisation: its copies are the run's smallest ``mmse_samples``."""
        return "mmse_samples" in self.run_options


#: The mvn-cdf methods also take "prune" (the mv-sigmoid has no error budget to spend on it).
_ANALYTIC = frozenset({"tol", "jacobian", "gradients", "p_fail", "prune", "check_draws"})

#: Every method, in the order tables and figures show them: the paper's six, then those beyond it.
REGISTRY: Mapping[str, MethodSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            MethodSpec(
                "mc",
                MonteCarlo,
                samples="mc",
                default_samples=DEFAULT_DRAWS,
                run_options=frozenset({"confidence", "interval", "target_half_width"}),
                paper=True,
            ),
            MethodSpec(
                "taylor",
                Taylor,
                options={"cdf": "mvn"},
                run_options=_ANALYTIC,
                paper=True,
            ),
            MethodSpec(
                "mmse",
                MMSE,
                options={"cdf": "mvn"},
                samples="mmse",
                default_samples=5,
                run_options=_ANALYTIC | {"sampling"},
                paper=True,
            ),
            MethodSpec(
                "taylor_mvs",
                Taylor,
                options={"cdf": "mv-sigmoid"},
                run_options=_ANALYTIC - {"prune"},
                paper=True,
            ),
            MethodSpec(
                "mmse_mvs",
                MMSE,
                options={"cdf": "mv-sigmoid"},
                samples="mmse",
                default_samples=5,
                run_options=(_ANALYTIC - {"prune"}) | {"sampling"},
                paper=True,
            ),
            MethodSpec(
                "softmax",
                Softmax,
                run_options=frozenset({"temperature"}),
                uses_noise=False,
                paper=True,
            ),
            MethodSpec(
                "mc_cv",
                MonteCarloCV,
                samples="mc",
                default_samples=DEFAULT_DRAWS,
                run_options=frozenset({"confidence", "tol", "jacobian", "mmse_samples", "target_half_width"}),
                needs_gaussian=True,
            ),
            MethodSpec(
                "mc_is",
                MonteCarloIS,
                samples="mc",
                default_samples=DEFAULT_DRAWS,
                run_options=frozenset({"confidence", "tol", "jacobian", "mmse_samples"}),
                needs_gaussian=True,
            ),
        )
    }
)

#: Every method's name, in :data:`REGISTRY` order.
METHODS: tuple[str, ...] = tuple(REGISTRY)
#: The paper's six methods: what a run computes unless told otherwise.
PAPER_METHODS: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if spec.paper)


def method_spec(method: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``method``; an :class:`~probust.errors.OptionError` (field
    "method") names the known methods otherwise."""
    try:
        return REGISTRY[method]
    except (KeyError, TypeError):
        raise OptionError(f"must be one of {', '.join(METHODS)}; got {method!r}", field="method") from None


def methods_with(run_option: str) -> tuple[str, ...]:
    """The methods that take the run setting ``run_option`` (e.g. "p_fail", "target_half_width")."""
    if run_option not in RUN_OPTIONS:
        raise ValueError(f"run_option must be one of {RUN_OPTIONS}, got {run_option!r}")
    return tuple(name for name, spec in REGISTRY.items() if run_option in spec.run_options)
