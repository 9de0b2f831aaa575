"""Estimate.to_pandas: one row per point, every set field a column, against the tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import probust
from probust.errors import OptionError
from probust.estimators.result import Estimate
from tests._helpers import linear_model


def test_every_per_point_field_is_a_column_with_the_tensors_values():
    model, x = linear_model(4, 3, seed=0), torch.randn(5, 4)
    est = probust.MonteCarlo(model, 0.5, n_samples=300)(x, index_offset=7)
    df = est.to_pandas(index_offset=7)
    assert df["index"].tolist() == [7, 8, 9, 10, 11] and df["index"].dtype == np.int64
    np.testing.assert_array_equal(df.p.to_numpy(), est.p.numpy())
    np.testing.assert_array_equal(df.target.to_numpy(), est.target.numpy())
    np.testing.assert_array_equal(df.ci_low.to_numpy(), est.ci_low.numpy())
    np.testing.assert_array_equal(df.stderr.to_numpy(), est.stderr.numpy())
    # Renamed to the runner's table's name for the same quantity.
    np.testing.assert_array_equal(df.n_drawn.to_numpy(), est.n_samples.numpy())
    assert (df.confidence == est.confidence).all() and (df.method == "mc").all()
    assert "n_samples" not in df.columns
    # Fields left None have no column.
    assert "cdf_error" not in df.columns and "margin" not in df.columns


def test_every_set_field_has_a_column_whatever_fields_the_estimate_has():
    # Generic over the dataclass's fields: one set at random values each.
    values = {}
    for f in dataclasses.fields(Estimate):
        if f.name == "method":
            values[f.name] = "taylor"
        elif f.name == "confidence":
            values[f.name] = 0.9
        elif f.name in ("margin", "grad_norm", "z"):
            values[f.name] = torch.rand(4, 3)
        elif f.name == "route":
            values[f.name] = torch.tensor([3, 0, 1, 2])
        else:
            values[f.name] = torch.rand(4, dtype=torch.float64)
    est = Estimate(**values)
    df = est.to_pandas(per_class=True)
    renamed = {"n_samples": "n_drawn"}
    assert df.columns.tolist() == ["index", *(renamed.get(f.name, f.name) for f in dataclasses.fields(Estimate))]
    for name in ("margin", "grad_norm", "z"):
        np.testing.assert_array_equal(np.stack(df[name].to_list()), values[name].numpy())
    assert df.route.tolist() == ["candidates", "direct", "head", "forward"]  # by name, as in the table
    assert len(df) == 4


def test_per_class_fields_are_left_out_unless_asked_for():
    model, x = linear_model(4, 3, seed=0), torch.randn(5, 4)
    est = probust.Taylor(model, 0.5)(x)
    assert est.z is not None and est.margin is not None
    df = est.to_pandas()
    assert not {"margin", "grad_norm", "z"} & set(df.columns)
    np.testing.assert_array_equal(df.cdf_error.to_numpy(), est.cdf_error.numpy())
    wide = est.to_pandas(per_class=True)
    np.testing.assert_array_equal(np.stack(wide.z.to_list()), est.z.numpy())
    np.testing.assert_array_equal(np.stack(wide.margin.to_list()), est.margin.numpy())
    assert wide["index"].tolist() == list(range(5))


def test_the_index_is_the_data_set_index_of_the_points_random_streams():
    # index_offset + row is the index each point's stream derived from: a point estimated
    # alone at its index gives the row's number.
    model, x = linear_model(4, 3, seed=0), torch.randn(6, 4)
    df = probust.MonteCarlo(model, 0.8, n_samples=200)(x, index_offset=100).to_pandas(100)
    for _, row in df.iterrows():
        i = int(row["index"])
        alone = probust.MonteCarlo(model, 0.8, n_samples=200)(x[i - 100 : i - 99], index_offset=i)
        assert row.p == alone.p.item()


def test_a_bad_index_offset_is_refused():
    est = Estimate(p=torch.ones(2, dtype=torch.float64), target=torch.zeros(2, dtype=torch.int64), method="mc")
    with pytest.raises(OptionError, match="index_offset: must be an int >= 0"):
        est.to_pandas(-1)
