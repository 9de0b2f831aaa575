"""Fixtures of the experiments' tests: the digits results of :func:`tests._helpers.build_results`,
made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from probust import experiments
from probust.experiments._results import Results
from tests._helpers import build_results


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    return build_results(tmp_path_factory.getbasetemp() / "digits-results")


@pytest.fixture(scope="session")
def results(results_dir) -> Results:
    return experiments.load_results(results_dir / "results")


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments")
