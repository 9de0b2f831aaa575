"""Monte Carlo with a linearised control variate (method "mc_cv").

Oracles: the closed form Phi(z) and scipy's normal CDF of a linear model's own weights (exactness),
a long plain Monte Carlo run (unbiasedness, coverage), least squares by numpy (the statistics).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from scipy import special
from scipy.stats import multivariate_normal
from torch import nn

import probust
from probust.estimators.control_variate import cv_statistics
from probust.estimators.linearised_mc import project
from probust.execution import Execution
from probust.noise import require_gaussian
from tests._helpers import linear_model


def _toy(seed: int = 0) -> nn.Module:
    """A small tanh network on R^10 with 4 classes: clearly non-linear at sigma ~ 0.3."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 if p.ndim == 1 else 0.6))
    return model


# ---- exactness on linear models ---------------------------------------------------------------


def test_binary_linear_model_gives_phi_of_z_with_zero_variance():
    d, sigma = 12, 0.3
    model = linear_model(d, 2, seed=3)
    x = torch.randn(6, d, generator=torch.Generator().manual_seed(0)) * 0.2
    w, b = model.weight.detach().double(), model.bias.detach().double()
    logits = x.double() @ w.T + b
    t = logits.argmax(1)
    c = (logits.gather(1, t[:, None]) - logits.gather(1, (1 - t)[:, None])).squeeze(1)
    expected = special.ndtr((c / (sigma * (w[0] - w[1]).norm())).numpy())
    for linearisation in ("taylor", "mmse"):
        runs = [
            probust.MonteCarloCV(model, sigma, n_samples=300, seed=s, linearisation=linearisation)(x) for s in range(3)
        ]
        for r in runs:
            # the model and its linearisation agree on every draw: the estimate is the exact mean
            np.testing.assert_allclose(r.p.numpy(), expected, atol=1e-6)
            assert ((r.p_mc - r.p).abs() > 0).any(), "plain Monte Carlo on the same draws is noisy"
        spread = torch.stack([r.p for r in runs]).std(0)
        mc_spread = torch.stack([r.p_mc for r in runs]).std(0)
        assert (spread < 1e-6).all() and (mc_spread.max() > 1e-2)  # float32 rounding only


def test_multiclass_linear_model_equals_the_mvn_cdf_of_its_weights():
    d, classes, sigma = 20, 6, 0.5
    model = linear_model(d, classes, seed=8)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(1)) * 0.3
    w, b = model.weight.detach().double(), model.bias.detach().double()
    logits = x.double() @ w.T + b
    t = logits.argmax(1)
    upper, cov = [], []
    for row in range(len(x)):
        others = [i for i in range(classes) if i != t[row]]
        u = w[t[row]] - w[others]  # [k, d]
        upper.append(logits[row, t[row]] - logits[row, others])
        cov.append(sigma**2 * u @ u.T)
    # scipy's lattice rules at 1e-8 (not probust's mvn_cdf): the estimate is the mvn-cdf at tol
    # 1e-6 (its error about a 99% bound), plus float32 rounding of the margins (~1e-7).
    expected = torch.tensor(
        [
            multivariate_normal.cdf(c.numpy(), cov=v.numpy(), abseps=1e-8, releps=0.0, maxpts=2_000_000, rng=7)
            for c, v in zip(upper, cov)
        ],
        dtype=torch.float64,
    )
    r = probust.MonteCarloCV(model, sigma, n_samples=400, tol=1e-6, linearisation="taylor")(x)
    torch.testing.assert_close(r.p, expected, atol=2e-6, rtol=0)
    assert (r.cv_beta == 1).all()
    # the interval reflects disagreements that 400 draws could have missed: about 3.8 / n
    half = (r.ci_high - r.ci_low) / 2
    assert ((half > 0) & (half < 5.0 / 400)).all()


# ---- unbiasedness and coverage on a non-linear model ------------------------------------------

SIGMA = 0.3
REPLICATES = 40
N_CV = 200
N_REF = 200_000


@pytest.fixture(scope="module")
def replicated():
    """6 points; 40 independent mc_cv runs of 200 draws each (one batch, distinct point indices);
    a 200,000-draw plain Monte Carlo reference."""
    torch.set_num_threads(1)
    model = _toy()
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(1)) * 0.4
    x[4] = x[4] * 4  # two points far from the boundaries: p close to 1, rare disagreements
    x[5] = x[5] * 4
    ref = probust.MonteCarlo(model, SIGMA, n_samples=N_REF, seed=99)(x)
    rows = x.repeat(REPLICATES, 1)
    cv = probust.MonteCarloCV(model, SIGMA, n_samples=N_CV, seed=1)(rows, ref.target.repeat(REPLICATES))
    return ref, cv


def test_mc_cv_is_unbiased_on_a_non_linear_model(replicated):
    ref, cv = replicated
    p = cv.p.view(REPLICATES, -1)
    mean, se = p.mean(0), p.std(0) / REPLICATES**0.5
    ref_se = torch.sqrt(ref.p * (1 - ref.p) / N_REF)
    assert ((mean - ref.p).abs() <= 4 * torch.sqrt(se**2 + ref_se**2) + 1e-4).all(), (mean, ref.p, se)
    # the linearisation alone is biased on this model: the control variate is what removes it
    lin = cv.p_linearised.view(REPLICATES, -1).mean(0)
    assert (lin - ref.p).abs().max() > 0.02


def test_mc_cv_interval_covers_at_the_nominal_rate(replicated):
    ref, cv = replicated
    truth = ref.p.repeat(REPLICATES)
    covered = ((cv.ci_low <= truth) & (truth <= cv.ci_high)).double().mean().item()
    assert covered >= 0.92, covered  # nominal 0.95 over 240 intervals
    # and the interval is narrower than plain Monte Carlo's on the same draws where p is not extreme
    mid = (ref.p > 0.2) & (ref.p < 0.9)
    mc_half = 1.96 * torch.sqrt(cv.p_mc * (1 - cv.p_mc) / N_CV).view(REPLICATES, -1)
    cv_half = ((cv.ci_high - cv.ci_low) / 2).view(REPLICATES, -1)
    assert (cv_half[:, mid].mean(0) < mc_half[:, mid].mean(0)).all()


# ---- adaptive mode, draws, batching -----------------------------------------------------------


def test_adaptive_mc_cv_reaches_the_target_with_fewer_draws_than_plain_mc():
    model = _toy()
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(2)) * 0.4
    sigma, target = 0.1, 0.01  # a small sigma: the MMSE linearisation is good here
    mc = probust.MonteCarlo(model, sigma, n_samples=20_000, target_half_width=target, check_every=500)(x)
    cv = probust.MonteCarloCV(model, sigma, n_samples=20_000, target_half_width=target, check_every=500)(x)
    assert ((cv.ci_high - cv.ci_low) / 2 <= target).all()
    assert cv.n_samples.sum() * 3 <= mc.n_samples.sum(), (cv.n_samples, mc.n_samples)
    assert (cv.n_samples % 500 == 0).all()


def test_mc_cv_sees_the_draws_of_plain_monte_carlo():
    model = _toy()
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(3)) * 0.4
    mc = probust.MonteCarlo(model, 0.3, n_samples=700, seed=5)(x)
    cv = probust.MonteCarloCV(model, 0.3, n_samples=700, seed=5)(x)
    assert torch.equal(cv.p_mc, mc.p)
    assert (cv.n_samples == 700).all() and cv.method == "mc_cv"


def test_mc_cv_does_not_depend_on_batch_split():
    model = _toy()
    x = torch.randn(5, 10, generator=torch.Generator().manual_seed(4)) * 0.4
    kwargs = dict(n_samples=300, linearisation="taylor")
    whole = probust.MonteCarloCV(model, 0.3, execution=Execution(batch_size=4096), **kwargs)(x).p
    parts = torch.cat(
        [
            probust.MonteCarloCV(model, 0.3, execution=Execution(batch_size=7), **kwargs)(x[:2]).p,
            probust.MonteCarloCV(model, 0.3, execution=Execution(batch_size=1000), **kwargs)(x[2:], index_offset=2).p,
        ]
    )
    # Other rows per pass are another plan: the float32 margins round differently, measured 3.3e-8
    # in p on a 2-core Xeon (AVX-512) and 1.3e-7 on a 2-core AMD EPYC (the Monte Carlo counts
    # themselves are equal). This MLP rounds a row differently by how many rows its pass holds, so
    # even one plan is not bitwise across splits here (the contract suite proves bitwise splits on
    # models that do not); docs/estimate.md "Reproducibility".
    torch.testing.assert_close(whole, parts, rtol=0, atol=3e-7)
    assert torch.equal(probust.estimate(model, x, 0.3, "mc_cv", **kwargs), whole)


def test_mc_cv_refuses_non_gaussian_noise_and_bad_options():
    model = linear_model(4, 3)
    with pytest.raises(ValueError, match="Gaussian"):
        probust.MonteCarloCV(model, probust.Laplace(0.1))
    with pytest.raises(ValueError, match="linearisation"):
        probust.MonteCarloCV(model, 0.1, linearisation="exact")
    with pytest.raises(ValueError, match="n_samples"):
        probust.MonteCarloCV(model, 0.1, n_samples=0)


@pytest.mark.parametrize("noise", [probust.Laplace(0.1), probust.Uniform(0.1)])
def test_mc_cv_and_mc_is_refuse_non_gaussian_noise_with_one_message(noise):
    model = linear_model(4, 3)
    messages = {}
    for cls in (probust.MonteCarloCV, probust.MonteCarloIS):
        with pytest.raises(ValueError) as info:
            cls(model, noise)
        messages[cls.method] = str(info.value)
    name = type(noise).__name__
    for method, message in messages.items():
        assert re.fullmatch(
            rf"sigma: {method} needs Gaussian noise: .*, got {name}; use method='mc' for other noise", message
        )
    assert messages["mc_cv"].replace("mc_cv", "mc_is") == messages["mc_is"]
    require_gaussian(probust.Gaussian(cov=torch.eye(4)), "mc_cv")  # any Gaussian passes


def test_mc_cv_and_mc_is_default_to_the_same_mmse_linearisation():
    model = linear_model(4, 3)
    for cls in (probust.MonteCarloCV, probust.MonteCarloIS):
        est = cls(model, 0.1)
        assert est.linearisation == "mmse" and type(est.linear) is probust.MMSE and est.linear.n_samples == 5
        assert cls(model, 0.1, mmse_samples=3).linear.n_samples == 3


# ---- the statistics ---------------------------------------------------------------------------


def test_cv_statistics_is_the_least_squares_regression_estimator():
    rng = np.random.default_rng(0)
    n, mu = 500, 0.62
    xs = rng.random(n) < mu
    ys = np.where(rng.random(n) < 0.9, xs, rng.random(n) < 0.5)  # mostly agree
    slope, intercept = np.polyfit(xs.astype(float), ys.astype(float), 1)
    expected = intercept + slope * mu  # the fitted line at the known mean of X
    residual = ys - (intercept + slope * xs)
    s2 = residual @ residual / (n - 2)
    counts = [torch.tensor([v]) for v in (n, ys.sum(), xs.sum(), (xs & ys).sum())]
    s = cv_statistics(*counts, torch.tensor([mu], dtype=torch.float64), torch.zeros(1, dtype=torch.float64), 0.95)
    assert s.p.item() == pytest.approx(expected, abs=1e-12)
    assert s.beta.item() == pytest.approx(slope, abs=1e-12)
    # with ~25 disagreements the small-sample floor is inactive: the variance is s2
    assert s.stderr.item() ** 2 * n == pytest.approx(s2, rel=1e-9)


def test_cv_statistics_floors_the_variance_when_no_disagreement_was_seen():
    n = torch.tensor([1000])
    s = cv_statistics(
        n,
        torch.tensor([600]),
        torch.tensor([600]),
        torch.tensor([600]),
        torch.tensor([0.61], dtype=torch.float64),
        torch.zeros(1, dtype=torch.float64),
        0.95,
    )
    assert s.p.item() == pytest.approx(0.61) and s.beta.item() == 1.0
    # Clopper-Pearson: a disagreement rate up to 1 - 0.025^(1/n) ~ 3.69 / n is not excluded
    bound = 1 - 0.025 ** (1 / 1000)
    assert s.stderr.item() == pytest.approx((bound / 1000) ** 0.5, rel=1e-6)


def test_the_linearisation_shares_the_monte_carlo_estimators_execution_settings():
    model = torch.nn.Linear(4, 3)
    for cls in (probust.MonteCarloCV, probust.MonteCarloIS):
        given = Execution(batch_size=64, memory_budget="1GB", channels_last=False, jacobian="loop")
        outer = cls(model, 0.2, seed=7, execution=given)
        linear = outer.linear
        assert (linear.seed, linear.method) == (7, "mmse")
        assert linear.execution == given.replace(batch_size=None)  # its Jacobian's rows are measured
        with pytest.raises(ValueError, match="^linearisation: must be one of"):
            cls(model, 0.2, linearisation="quadratic")


def test_project_is_the_dot_product_of_each_normal_with_each_draw():
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(3, 5, 2, 3, generator=gen)
    eps = torch.randn(3, 7, 2, 3, generator=gen)
    got = project(u, eps)
    assert got.shape == (3, 7, 5) and got.dtype == u.dtype
    torch.testing.assert_close(got, torch.einsum("bcd,bnd->bnc", u.flatten(2), eps.flatten(2)))
    # float64 normals with float32 draws: the draws are cast up
    got64 = project(u.double(), eps)
    assert got64.dtype == torch.float64
    torch.testing.assert_close(got64, torch.einsum("bcd,bnd->bnc", u.double().flatten(2), eps.double().flatten(2)))
