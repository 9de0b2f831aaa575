"""Transitional: ``_results.py`` (being split by another engineer) still imports
``ExperimentSkipped`` from here. Delete this file at merge, once its replacement imports
:mod:`probust.experiments.base`."""

from probust.experiments.base import ExperimentSkipped

__all__ = ["ExperimentSkipped"]
