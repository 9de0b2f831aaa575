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
        estimator = probust.Taylor(model, 1.0, prune="off", memory_budget="20KB")
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


def test_the_rest_of_the_draws_go_only_where_the_first_leave_the_verdict_open():
    # A quadratic model at a disagreement rate of about 0.15: some points' first 8 draws all
    # agree (they stop there, at agreement 1), a few disagree on 3 or more (flagged, they stop
    # too), the others get all 32, continuing the same stream.
    d, c, k = 50, 2.0, 0.02
    model, x = Quadratic(d, c, k), torch.zeros(80, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", trust.LinearisationWarning)
        staged = probust.Taylor(model, 1.0, prune="off", check_draws=32)(x)
        first = probust.Taylor(model, 1.0, prune="off", check_draws=trust.FIRST_CHECK_DRAWS)(x)
    stopped = staged.agreement_draws == trust.FIRST_CHECK_DRAWS
    assert set(staged.agreement_draws.tolist()) == {trust.FIRST_CHECK_DRAWS, 32}
    assert 0 < int(stopped.sum()) < len(x)
    # Where the first draws all agree, or already flag the point, it stops; otherwise it goes on.
    cleared, flagged = first.agreement == 1, trust.untrusted(first)
    assert cleared.any() and flagged.any()
    assert torch.equal(stopped, cleared | flagged)
    assert torch.equal(staged.agreement[stopped], first.agreement[stopped])
    assert torch.equal(trust.untrusted(staged)[flagged], flagged[flagged])
    # The first 8 of the 32 are the first stage's own draws: their disagreements are among the 32's.
    first_k = torch.round((1 - first.agreement) * trust.FIRST_CHECK_DRAWS)
    staged_k = torch.round((1 - staged.agreement) * staged.agreement_draws)
    assert (staged_k[~stopped] >= first_k[~stopped]).all() and (staged_k > first_k).any()
    # The stages are what check_stages says, for any check_draws.
    assert trust.check_stages(None) == (trust.FIRST_CHECK_DRAWS, trust.TAYLOR_CHECK_DRAWS - trust.FIRST_CHECK_DRAWS)
    assert trust.check_stages(3) == (3, 0) and trust.check_stages(0) == (0, 0)


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
    assert set(few.agreement_draws) == {3}  # fresh draws for MMSE too, one stage
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
