"""probust.experiments.common: helpers shared by the experiments."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from probust.experiments.common import fmt, pct, sem, sort_by_method


def test_sem_is_scipys_standard_error_of_the_finite_values():
    values = np.array([0.2, 0.5, np.nan, 0.9, 0.1, np.inf])
    assert sem(values) == pytest.approx(stats.sem([0.2, 0.5, 0.9, 0.1]))
    assert np.isnan(sem([0.3])) and np.isnan(sem([]))


def test_fmt_gives_three_significant_digits_and_scientific_at_the_extremes():
    assert [fmt(v) for v in (0.123456, 12.3456, 0.0, 1.5e-4, 2.5e5, None, float("nan"))] == [
        "0.123",
        "12.3",
        "0",
        "1.50e-04",
        "2.50e+05",
        "n/a",
        "n/a",
    ]
    assert fmt(1 / 3, digits=2) == "0.33"


def test_pct_is_one_decimal_percent():
    assert pct(0.25) == "25.0%" and pct(0.123) == "12.3%" and pct(None) == "n/a" and pct(float("inf")) == "n/a"


def test_sort_by_method_orders_models_then_estimators_in_the_papers_order_then_sigma():
    frame = pd.DataFrame(
        {"model": ["b", "a", "a", "a"], "method": ["taylor", "softmax", "mc", "mc"], "sigma": [0.1, 0.1, 0.3, 0.1]}
    )
    out = sort_by_method(frame)
    assert list(zip(out["model"], out["method"], out["sigma"])) == [
        ("a", "mc", 0.1),
        ("a", "mc", 0.3),
        ("a", "softmax", 0.1),
        ("b", "taylor", 0.1),
    ]
    assert list(out.columns) == ["model", "method", "sigma"]
