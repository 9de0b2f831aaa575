"""CertifyResult.to_pandas: one row per point, against the tensors."""

from __future__ import annotations

import numpy as np
import torch

import probust
from tests._helpers import linear_model


def test_every_field_is_a_column_with_the_tensors_values():
    model, x = linear_model(4, 3, seed=0), torch.randn(5, 4)
    result = probust.certify(model, x, sigma=0.25, n0=20, n=200, index_offset=3)
    df = result.to_pandas(3)
    assert df["index"].tolist() == [3, 4, 5, 6, 7]
    for name in ("prediction", "radius", "p_lower", "selected", "hits", "n_drawn", "seconds"):
        np.testing.assert_array_equal(df[name].to_numpy(), getattr(result, name).numpy())
    np.testing.assert_array_equal(df.abstained.to_numpy(), (result.prediction == -1).numpy())
    assert (df.sigma == 0.25).all() and (df.alpha == result.alpha).all()
    assert "certified" not in df.columns and df.attrs["radii"] is None


def test_with_radii_each_row_holds_its_certified_flags():
    model, x = linear_model(4, 3, seed=0), 3 * torch.randn(6, 4)
    result = probust.certify(model, x, sigma=0.25, n0=20, n=400, radii=[0.0, 0.1, 0.5])
    df = result.to_pandas()
    assert df.attrs["radii"] == [0.0, 0.1, 0.5] and "radii" not in df.columns
    np.testing.assert_array_equal(np.stack(df.certified.to_list()), result.certified.numpy())


def test_predict_results_rows_are_the_tensors_values():
    model, x = linear_model(4, 3, seed=0), torch.randn(5, 4)
    result = probust.predict(model, x, 0.25, n=100, index_offset=7)
    df = result.to_pandas(7)
    assert df["index"].tolist() == [7, 8, 9, 10, 11]
    for name in ("prediction", "top", "count_top", "count_second", "p_value", "n_drawn", "seconds"):
        np.testing.assert_array_equal(df[name].to_numpy(), getattr(result, name).numpy())
    np.testing.assert_array_equal(df.abstained.to_numpy(), (result.prediction == -1).numpy())
    assert (df.sigma == 0.25).all() and (df.alpha == result.alpha).all()
