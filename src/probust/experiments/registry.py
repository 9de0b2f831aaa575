"""The one ordered registry of experiments.

``probust report`` (:func:`probust.report.build_report`), the choices of its ``--only`` and
``--skip`` flags, :func:`probust.experiments.run_all` and the demo read this registry and
nothing else. The built-in experiments are listed by module, in the paper's order, and a
module is imported when its experiment is first needed (so listing the names costs no import of
matplotlib or torch). Each such module defines ``EXPERIMENT``, an :class:`Experiment` instance
whose ``name`` is the module's name.

Adding an experiment: a module with its :class:`Experiment` subclass and ``EXPERIMENT``, and
its name in :data:`BUILTIN`; or, from outside the package, :meth:`Registry.register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator

from probust.experiments.base import Experiment

__all__ = ["BUILTIN", "REGISTRY", "Registry"]

#: The built-in experiments (module names in this package), in the paper's order; the last two,
#: robust training against gradient-norm regularisation and certified accuracy by randomized
#: smoothing (from ``probust certify`` folders), go beyond the paper.
BUILTIN: tuple[str, ...] = (
    "estimation_error",
    "convergence",
    "runtime",
    "mv_sigmoid",
    "softmax_correlation",
    "robust_models",
    "class_bias",
    "vulnerable_points",
    "case_study",
    "distribution",
    "robust_training",
    "certified_accuracy",
)


class Registry:
    """Experiments by name, in order.

    Args:
        modules: names of modules of :mod:`probust.experiments` that each define ``EXPERIMENT``
            (imported when first needed).
    """

    def __init__(self, modules: Iterable[str] = ()) -> None:
        self._entries: dict[str, Experiment | None] = dict.fromkeys(modules)

    def names(self) -> tuple[str, ...]:
        """Every registered name, in order."""
        return tuple(self._entries)

    def get(self, name: str) -> Experiment:
        """The experiment called ``name``.

        Raises:
            ValueError: ``name`` is not registered (the message lists the known names).
        """
        if name not in self._entries:
            raise ValueError(f"unknown experiment {name!r}; known: {', '.join(self._entries)}")
        experiment = self._entries[name]
        if experiment is None:
            module = importlib.import_module(f"probust.experiments.{name}")
            experiment = module.EXPERIMENT
            if not isinstance(experiment, Experiment) or experiment.name != name:
                raise TypeError(f"probust.experiments.{name}.EXPERIMENT must be an Experiment named {name!r}")
            self._entries[name] = experiment
        return experiment

    def register(self, experiment: Experiment) -> Experiment:
        """Add ``experiment`` at the end of the order; returns it.

        Raises:
            ValueError: its name is taken.
        """
        if not isinstance(experiment, Experiment):
            raise TypeError(f"experiment must be an Experiment, got {type(experiment).__name__}")
        if experiment.name in self._entries:
            raise ValueError(f"experiment: the name {experiment.name!r} is already registered")
        self._entries[experiment.name] = experiment
        return experiment

    def unregister(self, name: str) -> None:
        """Remove ``name``.

        Raises:
            ValueError: ``name`` is not registered.
        """
        if name not in self._entries:
            raise ValueError(f"unknown experiment {name!r}; known: {', '.join(self._entries)}")
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Experiment]:
        return (self.get(name) for name in self.names())

    def __len__(self) -> int:
        return len(self._entries)


#: The registry every consumer reads.
REGISTRY = Registry(BUILTIN)
