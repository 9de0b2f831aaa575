"""The trust signal of Taylor and MMSE (probust.estimators.trust): the model's verdict on noise
draws against the linearisation's, r.agreement, and the warning when they differ often."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch import nn

import probust
from probust.data import ImageDataset
from probust.errors import OptionError
from probust.estimators import trust
from probust.execution import Execution
from probust.run import run_estimate
from tests._helpers import linear_model, points_near_boundaries


class Quadratic(nn.Module):
    """Two classes with margin g(x) = f_0 - f_1 = c + w . x - k ||x||^2 (w = e_1).

    Taylor at x = 0 sees c + w . eps, so p_lin = Phi(c / (sigma ||w||)); the model survives only
    where c + w . eps > k ||eps||^2, a subset of the linearisation's survivals: the verdicts
    differ exactly on 0 < c + eps_1 < k ||eps||^2, whose probability is p_lin - p_true.
    """

    def __init__(self, d: int, c: float, k: float) -> None:
        super().__init__()
        self.d, self.c, self.k = d, c, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.c + x[:, 0] - self.k * (x * x).sum(dim=1)
        return torch.stack([g + 5, torch.full_like(g, 5.0)], dim=1)  # logits, not probabilities


class AbsoluteValue(nn.Module):
    """Two classes with margin g(x) = |x_0| - a: the prediction flips in a slab around x_0 = 0.

    MMSE's average gradient over copies centred at x = 0 nearly cancels, so its linearisation
    says the point always survives while the model fails whenever |eps_0| < a."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x[:, 0].abs() - self.a + 0 * x.sum(dim=1)
        return torch.stack([g + 5, torch.full_like(g, 5.0)], dim=1)


def quadratic_disagreement(d: int, c: float, k: float, sigma: float = 1.0) -> float:
    """P(0 < c + e_1 < k ||e||^2) for e ~ N(0, sigma^2 I_d), by quadrature over e_1 (scipy):
    ||e||^2 = e_1^2 + sigma^2 chi2_{d-1}."""

    def density(e1: float) -> float:
        rest = ((c + e1) / k - e1 * e1) / sigma**2
        return stats.norm.pdf(e1, scale=sigma) * stats.chi2.sf(rest, d - 1)

    value, _ = integrate.quad(density, -c, np.inf, limit=200)
    return float(value)


@pytest.mark.parametrize("estimator", [probust.Taylor, probust.MMSE])
@pytest.mark.parametrize("prune", ["auto", "off"])
def test_agreement_is_exactly_one_for_linear_models(estimator, prune):
    # The linearisation is the model: every draw gets the same verdict from both.
    model = linear_model(20, 5)
    x = points_near_boundaries(model, 12, sigma=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", trust.LinearisationWarning)
        r = estimator(model, 1.0, prune=prune)(x)
    assert torch.equal(r.agreement, torch.ones(12, dtype=torch.float64))
    # Taylor: no first draw disagrees, so no point gets the rest.
    draws = trust.FIRST_CHECK_DRAWS if estimator is probust.Taylor else 5
    assert torch.equal(r.agreement_draws, torch.full((12,), draws))
    assert not trust.untrusted(r).any()


@pytest.mark.parametrize("estimator", [probust.Taylor, probust.MMSE])
def test_agreement_is_one_on_the_kept_boundaries_of_a_pruned_linear_model(estimator):
    # 300 classes, all but 10 a thousand below: the screening drops them, the check sees the kept
    # ones (the dropped ones are crossed with probability below cdf_error's bound, ~1e-5).
    model = linear_model(30, 300, seed=3)
    with torch.no_grad():
        model.bias[10:] -= 1000.0
    x = torch.randn(6, 30, generator=torch.Generator().manual_seed(4))
    r = estimator(model, 0.5)(x)
    assert (r.boundaries_kept <= 9).all()
    assert torch.equal(r.agreement, torch.ones(6, dtype=torch.float64))


def test_taylor_disagreement_matches_the_exact_rate_on_a_quadratic_model():
    # At x = 0 the verdicts differ exactly where 0 < c + eps_1 < k ||eps||^2: the observed
    # fraction over 200 points x 8 draws (independent, per-point streams; one stage, so the
    # number of draws does not depend on what they show) is binomial with the rate computed by
    # quadrature, and that rate is p_lin - p_true exactly (the bound is tight).
    d, c, k = 50, 1.0, 0.02
    model = Quadratic(d, c, k)
    x = torch.zeros(200, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = probust.Taylor(model, 1.0, prune="off", check_draws=trust.FIRST_CHECK_DRAWS)(x)
    assert torch.equal(r.agreement_draws, torch.full((200,), trust.FIRST_CHECK_DRAWS))
    rate = quadratic_disagreement(d, c, k)
    p_lin = stats.norm.cdf(c)
    assert torch.allclose(r.p, torch.full_like(r.p, p_lin), atol=1e-6)
    # p_true = P(c + e_1 > k ||e||^2) by the same quadrature's complement within the slab.
    p_true = p_lin - rate
    assert 0.2 < rate < 0.5 and 0.3 < p_true < 0.7  # a point where the linearisation is far off
    trials = int(r.agreement_draws.sum())
    disagreements = round(float(((1 - r.agreement) * r.agreement_draws).sum()))
    # Two-sided binomial test: a correct implementation fails with probability <= 1e-6.
    assert stats.binomtest(disagreements, trials, rate).pvalue > 1e-6


def test_disagreement_bounds_the_error_on_a_nonlinear_network():
    # |p_true - p_lin| <= P(verdicts differ), p_true from Monte Carlo: with a one-sided 1e-4
    # bound on each side (Clopper-Pearson on 4,000 draws per point, 64 checked draws per point)
    # and 8 points, a correct implementation fails with probability <= 8 * 2e-4.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    x = torch.randn(8, 10) * 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = probust.Taylor(model, 1.5, check_draws=64, prune="off")(x)
    mc = probust.MonteCarlo(model, 1.5, n_samples=4000, interval="clopper-pearson", confidence=1 - 2e-4)(x)
    n = r.agreement_draws.numpy()  # 64 where a first draw disagreed, else the first 8
    k = torch.round((1 - r.agreement) * r.agreement_draws).numpy()
    upper = torch.from_numpy(np.where(k >= n, 1.0, stats.beta.ppf(1 - 1e-4, k + 1, np.maximum(n - k, 1e-300))))
    gap = torch.maximum(r.p - mc.ci_high, mc.ci_low - r.p).clamp(min=0)  # the smallest |p_true - p| allowed
    assert (gap <= upper + r.cdf_error).all()
    assert (r.agreement < 1).any()  # the network is not linear at this noise: the check sees it


def test_a_badly_linearised_model_gives_low_agreement_and_one_warning_per_call():
    d = 50
    model = Quadratic(d, 1.0, 0.05)  # p_lin = Phi(1) = 0.84, p_true ~ 0.01: error ~ 0.83
    x = torch.zeros(40, d)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A small memory budget splits the 40 points into chunks: still one warning.
        estimator = probust.Taylor(model, 1.0, prune="off", execution=Execution(memory_budget="20KB"))
        assert estimator.points_per_chunk(x) < 40
        r = estimator(x)
    assert r.agreement.mean() < 0.3
    assert trust.untrusted(r).sum() >= 35
    found = [w for w in caught if issubclass(w.category, trust.LinearisationWarning)]
    assert len(found) == 1
    message = str(found[0].message)
    assert f"of {len(x)} points" in message and "sigma=1.0" in message and "'mc'" in message
    assert found[0].filename == __file__  # points at the caller's line


def test_mmse_checks_its_own_copies_and_warns_where_its_linearisation_fails():
    # g = |x_0| - 0.5 at x = 0: the copies' gradients cancel, the linearisation always survives,
    # the model fails on |eps_0| < 0.5: P(verdicts differ) = 2 Phi(0.5) - 1 = 0.38.
    model = AbsoluteValue(0.5)
    x = torch.zeros(30, 8)
    with pytest.warns(trust.LinearisationWarning, match="more noisy copies"):
        r = probust.MMSE(model, 1.0, n_samples=40, prune="off")(x)
    assert torch.equal(r.agreement_draws, torch.full((30,), 40))
    rate = 2 * stats.norm.cdf(0.5) - 1
    disagreements = round(float(((1 - r.agreement) * 40).sum()))
    # The MMSE linearisation survives every copy here (its margin is mean |eps_0| - 0.5 > 0 by a
    # wide margin against its gradient): the disagreements are the model's failures, binomial.
    assert stats.binomtest(disagreements, 30 * 40, rate).pvalue > 1e-6


def test_mmse_reads_its_copies_verdicts_off_its_own_pass(monkeypatch):
    # The model ran on the copies to linearise them: its verdicts there are those logits'
    # argmax, with no forward pass of their own, and the same as a fresh pass gives.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 5)).eval()
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))
    est = probust.MMSE(model, 1.5, n_samples=8, prune="off")
    indices = torch.arange(len(x))
    eps = est._own_check_eps(x, indices)  # [12, 8, 6]: the draws of the copies
    lin = est.linearise(x, None, indices)
    with torch.no_grad():
        model_verdict = model(x[:, None] + eps).argmax(2) == lin.target[:, None]
    every = torch.arange(5).expand(len(x), -1)
    linear_verdict = trust.linear_survives(lin.margin, lin.normal, eps, every != lin.target[:, None])
    expected = (model_verdict == linear_verdict).double().mean(1)
    assert (expected < 1).sum() >= 3, expected  # the premise: the verdicts differ on some copies

    def no_pass(*args, **kwargs):
        raise AssertionError("MMSE's check ran the model again on its own copies")

    monkeypatch.setattr(trust, "model_survives", no_pass)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = est(x)
    assert torch.equal(r.agreement, expected)
    assert torch.equal(r.agreement_draws, torch.full((12,), 8))


@pytest.mark.parametrize("estimator", [probust.Taylor, probust.MMSE])
def test_p_is_bitwise_the_same_with_the_check_on_or_off(estimator):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 7))
    x = torch.rand(5, 1, 8, 8)
    off = estimator(model, 0.3, check_draws=0)(x)
    assert off.agreement is None and off.agreement_draws is None
    for draws in (None, 3, 40):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", trust.LinearisationWarning)
            on = estimator(model, 0.3, check_draws=draws)(x)
        for name in ("p", "target", "margin", "grad_norm", "z", "cdf_error", "boundaries_kept"):
            assert torch.equal(getattr(on, name), getattr(off, name)), name
        assert on.agreement is not None and on.agreement.dtype == torch.float64


@pytest.mark.parametrize("estimator", [probust.Taylor, probust.MMSE])
def test_agreement_does_not_depend_on_batch_split(estimator):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))
    x = torch.randn(9, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        whole = estimator(model, 2.0, check_draws=24)(x)
        parts = [estimator(model, 2.0, check_draws=24)(x[i : i + 4], index_offset=i) for i in range(0, 9, 4)]
        reordered = estimator(model, 2.0, check_draws=24)(x.flip(0)[:1], index_offset=8)
    assert torch.equal(whole.agreement, torch.cat([p.agreement for p in parts]))
    assert torch.equal(whole.agreement[8:], reordered.agreement)
    assert (whole.agreement < 1).any()  # non-trivial: a ReLU net at sigma 2 is not linear


class ShiftedQuadratic(Quadratic):
    """:class:`Quadratic` around points x = t e_1: the margin there is c + t - k ||x||^2, so a
    batch of t puts some points far from the boundary (z large, the residual -k ||eps||^2 too
    small to matter) and some near it."""


def _first_stage_stops(est, x: torch.Tensor) -> torch.Tensor:
    """Where the check should stop after its first 2 draws, recomputed apart from
    probust.estimators.trust: the verdicts of the model and of the linearisation on the draws,
    the residuals of the model's margins against the linearisation's, and the flip rate of the
    documented rule, or where both disagree (flagged: a lower bound of 0.22 on the rate) (residual range widened by 2 x its width + 0.5 x its size; union over
    boundaries of P(L_i in the interval where a residual flips it), L_i ~ N(c_i, scale_i^2),
    with scipy's normal CDF)."""
    indices = torch.arange(len(x))
    lin = est.linearise(x, None, indices)
    eps = est._check_eps(x, indices, 0, 2).double()  # the stream's first two draws
    c, u, t = lin.margin.double().numpy(), lin.normal.double().flatten(2).numpy(), lin.target.numpy()
    with torch.no_grad():
        logits = est.model((x[:, None] + eps.float()).flatten(0, 1)).view(len(x), 2, -1).double().numpy()
    e = eps.flatten(2).numpy()
    stops = []
    for b in range(len(x)):
        others = [i for i in range(c.shape[1]) if i != t[b]]
        L = c[b, others, None] + u[b, others] @ e[b].T  # [K, 2]
        G = logits[b][:, [t[b]]].T - logits[b][:, others].T  # [K, 2]
        agreeing = (L > 0).all(0) == (G > 0).all(0)
        r = G - L
        low, high = r.min(1), r.max(1)
        widen = 2.0 * (high - low) + 0.5 * np.maximum(np.abs(low), np.abs(high))
        rises, falls = np.maximum(high + widen, 0), np.maximum(widen - low, 0)
        scale = est.noise.sigma * np.linalg.norm(u[b, others], axis=1)
        rate = (stats.norm.cdf((falls - c[b, others]) / scale) - stats.norm.cdf((-rises - c[b, others]) / scale)).sum()
        # all agree and a rate of at most 1% clear the point; 2 of 2 disagreeing flag it
        stops.append(bool((agreeing.all() and min(rate, 1.0) <= 0.01) or not agreeing.any()))
    return torch.tensor(stops)


def test_the_first_two_draws_stop_a_point_only_where_they_agree_and_their_residuals_cannot_flip_it():
    # Points from far to near the boundary of a quadratic model: the far ones stop after draws
    # 0-1, the near ones go on to draws 2-7; exactly those the rule, recomputed apart, stops.
    d, c, k = 50, 0.5, 0.004
    model = ShiftedQuadratic(d, c, k)
    x = torch.zeros(40, d)
    x[:, 0] = torch.linspace(0.0, 6.0, 40)
    est = probust.Taylor(model, 1.0, prune="off", check_draws=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        r = est(x)
    expected = _first_stage_stops(est, x)
    assert 5 <= int(expected.sum()) <= 35  # both kinds of point
    assert torch.equal(r.agreement_draws == trust.FIRST_CHECK_DRAWS, expected)
    assert (r.agreement_draws[~expected] >= 8).all()


def test_later_stages_stop_where_the_draws_so_far_all_agree_or_flag_the_point():
    # A quadratic model at a disagreement rate of about 0.15 (residual -k ||eps||^2 of about -1
    # against z = 2): no point stops after its first 2 draws; after 8, those whose 8 all agree
    # stop, and so do those the 8 already flag; the others get all 32, continuing the same stream.
    d, c, k = 50, 2.0, 0.02
    model, x = Quadratic(d, c, k), torch.zeros(80, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        staged = probust.Taylor(model, 1.0, prune="off", check_draws=32)(x)
        eight = probust.Taylor(model, 1.0, prune="off", check_draws=8)(x)
        two = probust.Taylor(model, 1.0, prune="off", check_draws=2)(x)
    # After 2 draws only the points both of whose draws disagree stop (flagged: a lower bound of 0.22).
    at_two = staged.agreement_draws == 2
    assert set(staged.agreement_draws.tolist()) <= {2, 8, 32} and (staged.agreement[at_two] == 0).all()
    assert torch.equal(at_two, two.agreement == 0) and torch.equal(at_two, trust.untrusted(two))
    stopped = staged.agreement_draws == 8
    assert 0 < int(stopped.sum()) < len(x)
    cleared, flagged = eight.agreement == 1, trust.untrusted(eight)
    assert cleared.any() and flagged.any()
    assert torch.equal(stopped, (cleared | flagged) & ~at_two)
    assert torch.equal(staged.agreement[stopped], eight.agreement[stopped])
    assert trust.untrusted(staged)[flagged].all()
    # The counts add up over the stages: 8 draws hold the first 2's disagreements, 32 the first 8's.
    disagreeing = {n: torch.round((1 - r.agreement) * r.agreement_draws) for n, r in ((2, two), (8, eight))}
    staged_k = torch.round((1 - staged.agreement) * staged.agreement_draws)
    assert (disagreeing[8] >= disagreeing[2]).all() and (disagreeing[8] > disagreeing[2]).any()
    assert (staged_k[~stopped] >= disagreeing[8][~stopped]).all() and (staged_k > disagreeing[8]).any()


def test_check_stages_are_the_cumulative_draw_counts():
    assert trust.check_stages(None) == (2, 8, trust.TAYLOR_CHECK_DRAWS) == (2, 8, 32)
    assert trust.check_stages(64) == (2, 8, 64) and trust.check_stages(8) == (2, 8)
    assert trust.check_stages(5) == (2, 5) and trust.check_stages(2) == (2,) and trust.check_stages(1) == (1,)
    assert trust.check_stages(0) == ()


def test_undecided_stops_flagged_points_and_cleared_ones():
    agreeing, draws = torch.tensor([2, 2, 1, 0, 8, 7, 5]), torch.tensor([2, 2, 2, 2, 8, 8, 8])
    rate = torch.tensor([0.005, 0.02, 0.0, 0.0, 0.5, 0.0, 0.0], dtype=torch.float64)
    # all agree and a rate of at most 1%: stop; a rate above it: go on; one of 2 disagreeing: go
    # on; both (the lower bound is 0.22 > 5%): flagged, stop.
    assert trust.undecided(agreeing[:4], draws[:4], rate[:4]).tolist() == [False, True, True, False]
    # Later stages (no rate): all agree stops whatever the residuals; 1 of 8 goes on; 3 of 8 flag.
    assert trust.undecided(agreeing[4:], draws[4:]).tolist() == [False, True, False]


def test_flip_rate_is_the_union_of_the_flipping_bands():
    gen = np.random.default_rng(0)
    z = gen.normal(3.0, 2.0, (6, 4))
    scale = gen.uniform(0.5, 2.0, (6, 4))
    c = z * scale
    low = gen.normal(-0.5, 1.0, (6, 4))
    high = low + gen.uniform(0.0, 1.0, (6, 4))
    active = gen.uniform(size=(6, 4)) > 0.2
    expected = np.zeros(6)
    for b in range(6):
        for i in range(4):
            w = 2.0 * (high[b, i] - low[b, i]) + 0.5 * max(abs(low[b, i]), abs(high[b, i]))
            rises, falls = max(high[b, i] + w, 0.0), max(w - low[b, i], 0.0)
            band = stats.norm.cdf(falls, c[b, i], scale[b, i]) - stats.norm.cdf(-rises, c[b, i], scale[b, i])
            expected[b] += band * active[b, i]
    t = lambda a: torch.from_numpy(np.asarray(a))
    got = trust.flip_rate(t(z), t(scale), t(c), t(low), t(high), t(active))
    assert np.allclose(got.numpy(), np.minimum(expected, 1.0), rtol=1e-9, atol=1e-12)

    # A boundary the noise cannot move flips only where the residual reaches its margin; a
    # residual that was not finite makes the rate 1.
    def frozen(c: float, residual: float) -> float:
        return trust.flip_rate(
            t([[np.inf if c > 0 else -np.inf]]), t([[0.0]]), t([[c]]), t([[residual]]), t([[residual]]), t([[True]])
        ).item()

    # widened by 0.5 x 0.5: a residual of -0.75 at most reaches the margin 0.4; -0.15 does not
    assert frozen(0.4, -0.5) == 1.0 and frozen(0.4, -0.1) == 0.0
    assert frozen(-0.4, 0.5) == 1.0 and frozen(-0.4, 0.1) == 0.0  # the same, the other way
    nan = trust.flip_rate(t([[1.0]]), t([[1.0]]), t([[1.0]]), t([[np.nan]]), t([[np.nan]]), t([[True]]))
    assert nan.tolist() == [1.0]


def test_check_draws_is_validated():
    model = linear_model(4, 3)
    for bad in (-1, 1.5, True, "16"):
        with pytest.raises(OptionError, match="check_draws"):
            probust.Taylor(model, 0.1, check_draws=bad)


def test_disagreement_lower_is_the_clopper_pearson_bound():
    # Against scipy's exact binomial test: the bound is the rate at which k or more of n
    # disagreements has probability 1 - confidence.
    for k, n in ((0, 16), (3, 16), (5, 16), (16, 16), (3, 5)):
        bound = float(trust.disagreement_lower(torch.tensor([1 - k / n], dtype=torch.float64), torch.tensor([n]))[0])
        if k == 0:
            assert bound == 0.0
        else:
            assert math.isclose(stats.binom.sf(k - 1, n, bound), 0.05, rel_tol=1e-6)


def test_the_runner_records_agreement(tmp_path):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 1, 4, 4), generator=gen, dtype=torch.uint8)
    data = ImageDataset(
        images, torch.randint(0, 3, (6,), generator=gen), name="tiny", split="test", classes=["a", "b", "c"]
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    df = run_estimate(data, model, 0.1, ["taylor", "mmse", "mc"], out=tmp_path / "r", mc_samples=100)
    linear = df[df.method.isin(["taylor", "mmse"])]
    assert (linear.agreement == 1.0).all()  # a linear model
    assert set(linear[linear.method == "taylor"].agreement_draws) == {trust.FIRST_CHECK_DRAWS}
    assert set(linear[linear.method == "mmse"].agreement_draws) == {5}
    assert df[df.method == "mc"].agreement.isna().all()


def test_the_runner_passes_check_draws_and_keeps_it_in_the_folders_identity(tmp_path):
    from probust.run.errors import ConfigMismatchError

    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (5, 1, 4, 4), generator=gen, dtype=torch.uint8)
    data = ImageDataset(images, torch.zeros(5, dtype=torch.int64), name="tiny", split="test", classes=["a", "b"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 2))
    off = run_estimate(data, model, 0.3, ["taylor", "mmse"], out=tmp_path / "off", check_draws=0)
    assert off.agreement.isna().all() and off.agreement_draws.isna().all()
    few = run_estimate(data, model, 0.3, ["taylor", "mmse"], out=tmp_path / "few", check_draws=3)
    assert set(few.agreement_draws) <= {2, 3}  # fresh draws for MMSE too, in stages (2, 3)
    assert (few.p.to_numpy() == off.p.to_numpy()).all()  # p does not depend on the check
    with pytest.raises(ConfigMismatchError, match="check_draws"):
        run_estimate(data, model, 0.3, ["taylor", "mmse"], out=tmp_path / "few", check_draws=0)


@pytest.mark.slow(seconds=28)  # a fresh interpreter and a ResNet18 on the CPU
def test_the_docs_snippet_prints_what_the_page_shows(tmp_path):
    # docs/estimators.md, "Can I trust this estimate?": the code block, then its output (the
    # warning, wrapped for the page, on stderr; the printed lines on stdout).
    doc = (Path(__file__).resolve().parents[2] / "docs" / "estimators.md").read_text()
    section = doc[doc.index("## Can I trust this estimate?") :]
    code, output = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, flags=re.DOTALL).groups()
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert shown.returncode == 0, shown.stderr
    lines = output.strip().splitlines()
    printed = lines[next(i for i, line in enumerate(lines) if line.startswith("taylor p")) :]
    assert shown.stdout.strip().splitlines() == printed
    warning = " ".join(lines[: -len(printed)])
    assert warning in " ".join(shown.stderr.split())


def test_the_warning_points_at_the_users_line_through_score_too():
    # probust.score runs the estimator deep in the runner: the warning still names this file
    # (it used to name probust/run/work_units.py).
    model = Quadratic(50, 1.0, 0.05)
    x = torch.zeros(12, 50)
    with pytest.warns(trust.LinearisationWarning) as record:
        probust.score(model, x, 1.0, ["taylor"], prune="off", device="cpu", show_progress=False)
    found = [w for w in record if issubclass(w.category, trust.LinearisationWarning)]
    assert len(found) == 1 and found[0].filename == __file__
