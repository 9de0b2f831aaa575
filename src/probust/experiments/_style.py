"""Transitional: ``_results.py`` (being split by another engineer) still imports
``lambda_label`` from here. Delete this file at merge, once its replacement imports
:mod:`probust.experiments.style`."""

from probust.experiments.style import lambda_label

__all__ = ["lambda_label"]
