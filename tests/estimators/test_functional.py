"""``probust.estimate``: the functional form, its batching and its method names."""

from __future__ import annotations

import pytest
import torch

import probust
from probust.execution import Execution
from tests._helpers import linear_model, points_near_boundaries


@pytest.mark.parametrize("method", ["mc", "mmse", "taylor"])
def test_estimate_does_not_depend_on_batch_split(method):
    model = linear_model(10, 6, seed=1)
    x = points_near_boundaries(model, 7, 0.4)
    kwargs = {"n_samples": 300} if method == "mc" else {}
    whole = probust.estimate(model, x, 0.4, method, execution=Execution(batch_size=64), **kwargs)
    parts = torch.cat(
        [
            probust.estimate(model, x[:3], 0.4, method, execution=Execution(batch_size=5), **kwargs),
            probust.estimate(model, x[3:], 0.4, method, index_offset=3, execution=Execution(batch_size=1000), **kwargs),
        ]
    )
    # The noise is identical; only the model's float rounding may differ with the BLAS batch size.
    torch.testing.assert_close(whole, parts, rtol=0, atol=1e-5)
    # and a point's number depends on its index, not on its row
    reordered = probust.estimate(model, x[[3]], 0.4, method, index_offset=3, **kwargs)
    torch.testing.assert_close(reordered, whole[[3]], rtol=0, atol=1e-5)


def test_unknown_method_is_refused(small):
    model, x = small
    with pytest.raises(ValueError, match="^method: must be one of"):
        probust.estimate(model, x, 0.1, "exact")


def test_functional_estimate_matches_the_classes(small):
    model, x = small
    torch.testing.assert_close(
        probust.estimate(model, x, 0.2, "taylor_mvs"), probust.Taylor(model, 0.2, cdf="mv-sigmoid")(x).p
    )
    torch.testing.assert_close(
        probust.estimate(model, x, None, method="softmax", temperature=2.0), probust.Softmax(model, 2.0)(x).p
    )
