"""Fixtures of the experiments' tests: the digits results of :func:`tests._helpers.build_results`
(made once per session), and synthetic results folders written with probust.run.store."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probust import experiments
from probust.experiments.runs import Results
from probust.run.store import FORMAT, ResultStore
from tests._helpers import build_results

#: (index, sigma, method, n_samples, p) of the rows a synthetic run holds by default.
Row = tuple[int, float, str, int, float]


def _columns(rows: Sequence[Row], labels: Sequence[int] | None) -> dict[str, Any]:
    index = np.array([r[0] for r in rows], dtype=np.int64)
    label = index % 3 if labels is None else np.asarray(labels, dtype=np.int64)[index]
    n = len(rows)
    return {
        "index": index,
        "label": label,
        "prediction": label,
        "target": label,
        "sigma": np.array([r[1] for r in rows]),
        "method": [r[2] for r in rows],
        "n_samples": np.array([r[3] for r in rows], dtype=np.int64),
        "p": np.array([r[4] for r in rows]),
        "ci_low": None,
        "ci_high": None,
        "stderr": None,
        "clean_softmax": np.full(n, 0.9),
        "cdf_error": None,
        "seconds": np.full(n, 1e-3),
        "seed": np.zeros(n, dtype=np.int64),
    }


@pytest.fixture
def write_run() -> Callable[..., Path]:
    """``write_run(root, name, meta=..., run=..., model=..., data=..., rows=..., labels=...)``: a
    results folder whose config.json records those sections and whose rows are ``rows``."""

    def write(
        root: Path,
        name: str,
        *,
        meta: dict | None = None,
        run: dict | None = None,
        model: dict | None = None,
        data: dict | None = None,
        rows: Sequence[Row] = ((0, 0.1, "mc", 100, 0.9), (1, 0.1, "mc", 100, 0.8)),
        labels: Sequence[int] | None = None,
    ) -> Path:
        store = ResultStore(root / name)
        store.create()
        config: dict[str, Any] = {
            "format": FORMAT,
            "run": {"dataset": "digits", "split": "test", "seed": 0, **(run or {})},
            "model": {"meta": meta or {}, **(model or {})},
        }
        if data is not None:
            config["data"] = data
        store.write_config(config)
        if rows:
            store.write_part("rows", _columns(rows, labels))
        return store.path

    return write


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    return build_results(tmp_path_factory.getbasetemp() / "digits-results")


@pytest.fixture(scope="session")
def results(results_dir) -> Results:
    return experiments.load_results(results_dir / "results")


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments")
