"""The softmax baseline: the paper's softmax lemma, no sigma, the model's output checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import probust


@pytest.mark.parametrize("temperature", [1.0, 0.3, 4.0])
def test_softmax_is_softmax_of_the_logits_over_t_in_float64(temperature):
    # docs/estimate.md: softmax(f(x) / T)_t in float64, here from the float32 logits by numpy.
    gen = torch.Generator().manual_seed(1)
    model = nn.Linear(6, 5)
    x = torch.randn(7, 6, generator=gen) * 3
    with torch.no_grad():
        logits = model(x).double().numpy() / temperature
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected = expected.max(1) / expected.sum(1)
    r = probust.Softmax(model, temperature=temperature)(x)
    assert r.p.dtype == torch.float64 and torch.equal(r.target, torch.from_numpy(logits.argmax(1)))
    np.testing.assert_allclose(r.p.numpy(), expected, rtol=1e-14, atol=0)


def test_softmax_equals_taylor_mvs_when_boundary_norms_are_equal():
    # The paper's softmax lemma: equal ||u_i|| = k gives p_softmax(T = sigma k) = p_taylor_mvs.
    d, classes, sigma = 10, 4, 0.3
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(d, generator=gen)
    directions = torch.linalg.qr(torch.randn(d, classes - 1, generator=gen)).Q.T  # orthonormal
    model = nn.Linear(d, classes)
    with torch.no_grad():
        model.weight.copy_(torch.cat([w0[None], w0[None] - 2.0 * directions]))  # ||w_0 - w_i|| = 2
        model.bias.zero_()
    x = torch.randn(6, d, generator=gen) * 0.2
    target = torch.zeros(6, dtype=torch.long)
    mvs = probust.Taylor(model, sigma, cdf="mv-sigmoid")(x, target).p
    soft = probust.Softmax(model, temperature=sigma * 2.0)(x, target).p
    torch.testing.assert_close(mvs, soft, rtol=1e-6, atol=1e-9)


def test_softmax_takes_no_sigma_and_the_functional_form_accepts_none_for_it(small):
    model, x = small
    with pytest.raises(TypeError):
        probust.Softmax(model, sigma=0.1)
    torch.testing.assert_close(probust.estimate(model, x, None, "softmax"), probust.Softmax(model)(x).p)
    with pytest.raises(TypeError, match="sigma"):
        probust.estimate(model, x, method="taylor")
    with pytest.raises(ValueError, match="^sigma: required"):
        probust.estimate(model, x, None, "taylor")


def test_model_output_must_be_logits(small):
    _, x = small
    with pytest.raises(ValueError, match=r"\[B, C\]"):
        probust.Softmax(lambda z: z.sum(1))(x)
    with pytest.raises(ValueError, match="at least 2 classes"):
        probust.Softmax(nn.Linear(4, 1))(x)
