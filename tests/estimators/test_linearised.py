"""Taylor and MMSE (and their mv-sigmoid variants) against independent oracles: closed forms,
long Monte Carlo, the paper's propositions."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import probust
from probust.execution import Execution
from probust.noise import Gaussian, Laplace, Uniform
from tests._helpers import inside, linear_model, points_near_boundaries


@pytest.mark.parametrize("classes", [2, 3, 10, 100])
def test_taylor_and_mmse_are_exact_for_linear_models(classes):
    d, sigma = 30, 0.5
    model = linear_model(d, classes, seed=classes)
    x = points_near_boundaries(model, 6, sigma)
    mc = probust.MonteCarlo(model, sigma, n_samples=100_000, confidence=0.999, interval="clopper-pearson")(x)
    assert ((mc.p > 0.02) & (mc.p < 0.98)).sum() >= 2, "test points should not all be trivially robust"
    # At k = 99 a mid-range probability to 1e-4 costs seconds per point; 1e-3 keeps the test fast.
    tol = 1e-4 if classes <= 10 else 1e-3
    for estimator in (probust.Taylor(model, sigma, tol=tol), probust.MMSE(model, sigma, n_samples=5, tol=tol)):
        r = estimator(x)
        assert torch.equal(r.target, mc.target)
        # The mvn-cdf's own tolerance is added to the Monte Carlo interval.
        assert inside(r.p, mc, slack=2 * tol).all(), (estimator.method, r.p, mc.ci_low, mc.ci_high)


def test_binary_case_equals_phi_of_z():
    d, sigma = 12, 0.3
    model = linear_model(d, 2, seed=3)
    x = points_near_boundaries(model, 8, sigma)
    r = probust.Taylor(model, sigma)(x)
    w, b = model.weight.double(), model.bias.double()
    logits = x.double() @ w.T + b
    t = logits.argmax(1)
    other = 1 - t
    c = logits.gather(1, t[:, None]).squeeze(1) - logits.gather(1, other[:, None]).squeeze(1)
    u_norm = (w[t] - w[other]).norm(dim=1)
    expected = torch.special.ndtr(c / (sigma * u_norm))
    torch.testing.assert_close(r.p, expected, rtol=0, atol=1e-6)


def test_mmse_iid_sampling_is_not_exact_but_centred_is():
    model = linear_model(20, 4, seed=5)
    x = points_near_boundaries(model, 10, 0.5)
    taylor = probust.Taylor(model, 0.5)(x).p
    centred = probust.MMSE(model, 0.5, n_samples=3)(x).p
    iid = probust.MMSE(model, 0.5, n_samples=3, sampling="iid")(x).p
    assert (centred - taylor).abs().max() < 1e-4
    assert (iid - taylor).abs().max() > 1e-2


@pytest.mark.parametrize(
    "noise",
    [
        lambda d: Gaussian(torch.linspace(0.1, 0.9, d)),
        lambda d: Gaussian(cov=_random_covariance(d)),
    ],
    ids=["diagonal", "full"],
)
def test_non_isotropic_gaussian_analytic_matches_monte_carlo(noise):
    d = 16
    model = linear_model(d, 5, seed=7)
    x = points_near_boundaries(model, 6, 0.4)
    noise = noise(d)
    mc = probust.MonteCarlo(model, noise, n_samples=100_000, confidence=0.999)(x)
    for estimator in (probust.Taylor(model, noise), probust.MMSE(model, noise, n_samples=4)):
        assert inside(estimator(x).p, mc, slack=2e-4).all()


def _random_covariance(d: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(d, d, generator=gen, dtype=torch.float64) * 0.2
    return a @ a.T + 0.01 * torch.eye(d, dtype=torch.float64)


@pytest.mark.parametrize("noise_cls", [Uniform, Laplace])
def test_non_gaussian_noise_follows_the_clt_in_high_dimension(noise_cls):
    # The paper's CLT lemma: in high dimension u . eps is nearly Gaussian, so Taylor applies.
    d, sigma = 1000, 0.05
    model = linear_model(d, 4, seed=2)
    with torch.no_grad():
        model.weight.mul_(1 / math.sqrt(d))
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(4)) * 0.03
    noise = noise_cls(sigma)
    mc = probust.MonteCarlo(model, noise, n_samples=5_000, confidence=0.999)(x)
    taylor = probust.Taylor(model, noise)(x)
    assert inside(taylor.p, mc, slack=0.005).all()
    # and the draws really have the documented standard deviation
    keys = torch.arange(3)
    eps = noise.sample(keys, 0, 1000, torch.Size([10]))
    assert abs(eps.std().item() - sigma) < 0.02 * sigma


class _Quadratic(nn.Module):
    """Logits f_0 = 0 and f_i = -(x^T A_i x + u_i^T x + c_i), so g_i = x^T A_i x + u_i^T x + c_i."""

    def __init__(self, eigenvalues: torch.Tensor, u: torch.Tensor, c: torch.Tensor):
        super().__init__()
        self.register_buffer("eig", eigenvalues)  # [k, d]: A_i = diag(eig_i)
        self.register_buffer("u", u)  # [k, d]
        self.register_buffer("c", c)  # [k]

    def forward(self, x):
        g = (x[:, None, :] ** 2 * self.eig).sum(-1) + x @ self.u.T + self.c
        return torch.cat([torch.zeros(len(x), 1, dtype=x.dtype), -g], dim=1)


def _quadratic_errors(eigenvalues: torch.Tensor) -> tuple[float, float]:
    """Max |p - p_mc| for Taylor and MMSE at x = 0 over a few offsets c."""
    k, d = eigenvalues.shape
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(k, d, generator=gen)
    u = u / u.norm(dim=1, keepdim=True)
    sigma = 0.05
    worst_taylor = worst_mmse = 0.0
    for c0 in (0.02, 0.05, 0.08):
        model = _Quadratic(eigenvalues, u, torch.full((k,), c0))
        x = torch.zeros(1, d)
        target = torch.zeros(1, dtype=torch.long)
        mc = probust.MonteCarlo(model, sigma, n_samples=10_000, seed=1)(x, target)
        taylor = probust.Taylor(model, sigma)(x, target)
        mmse = probust.MMSE(model, sigma, n_samples=16)(x, target)
        worst_taylor = max(worst_taylor, (taylor.p - mc.p).abs().item())
        worst_mmse = max(worst_mmse, (mmse.p - mc.p).abs().item())
    return worst_taylor, worst_mmse


def test_mmse_is_near_exact_for_isotropic_quadratic_boundaries_while_taylor_is_not():
    # A_i = a I in d = 1000: eps^T A eps concentrates at a sigma^2 d, a constant shift that
    # MMSE's mean margin absorbs (the paper's MMSE proposition with lambda_max = lambda_mean).
    d = 1000
    eigenvalues = torch.full((3, d), 0.6)
    taylor, mmse = _quadratic_errors(eigenvalues)
    assert mmse < 0.02
    assert taylor > 0.2


def test_mmse_beats_taylor_for_anisotropic_quadratic_boundaries():
    d = 1000
    gen = torch.Generator().manual_seed(3)
    eigenvalues = torch.rand(3, d, generator=gen) * 1.2  # PSD, lambda_max > lambda_mean
    taylor, mmse = _quadratic_errors(eigenvalues)
    assert mmse < taylor
    assert mmse < 0.05


def test_mv_sigmoid_is_the_paper_formula():
    # z from the weights in float64 (not the estimator's own r.z): z_i = g_i / (sigma ||w_t - w_i||).
    model = linear_model(8, 5, seed=9)
    x = points_near_boundaries(model, 4, 0.3)
    r = probust.Taylor(model, 0.3, cdf="mv-sigmoid")(x)
    w, b = model.weight.detach().double(), model.bias.detach().double()
    logits = x.double() @ w.T + b
    t = logits.argmax(1)
    assert torch.equal(r.target, t)
    z = (logits.gather(1, t[:, None]) - logits) / (0.3 * (w[t][:, None, :] - w[None]).norm(dim=2))
    expected = 1 / (1 + torch.where(z.isfinite(), torch.exp(-z), 0.0).sum(1))  # z = 0/0 (NaN) at t
    # float32 margins and gradients: z to ~1e-6 relative, p to ~1e-6
    torch.testing.assert_close(r.p, expected, rtol=0, atol=2e-6)
    assert r.method == "taylor_mvs"


def test_torchscript_models_give_the_same_numbers():
    model = linear_model(8, 4, seed=4)
    x = points_near_boundaries(model, 5, 0.3)
    scripted = torch.jit.trace(model, x)
    # the same operations in the same plan: the same bits
    assert torch.equal(probust.Taylor(scripted, 0.3)(x).p, probust.Taylor(model, 0.3)(x).p)


class _OldStyleRelu(torch.autograd.Function):
    # An autograd.Function without setup_context: torch.func cannot transform it.
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0)


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(_OldStyleRelu.apply(self.a(x)))


def test_models_torch_func_cannot_trace_fall_back_to_autograd():
    model = _Untraceable()
    reference = nn.Sequential(model.a, nn.ReLU(), model.b)
    x = torch.randn(5, 6)
    expected = probust.Taylor(reference, 0.3, execution=Execution(jacobian="loop"))(x).p
    with pytest.warns(RuntimeWarning, match="one backward pass per cotangent"):
        got = probust.Taylor(model, 0.3, execution=Execution(jacobian="vmap"))(x).p
    assert torch.equal(got, expected)  # the fallback is the "loop" plan: the same bits
    # Measuring strategies ("auto") on enough work drops the one the model cannot run, silently.
    many = torch.randn(600, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        measured = probust.Taylor(model, 0.3)(many).p
    # "loop" is the only strategy left to measure; the reference in that plan gives the same bits
    assert torch.equal(measured, probust.Taylor(reference, 0.3, execution=Execution(jacobian="loop"))(many).p)


def test_the_fallback_warning_is_a_standard_warning_without_module_state():
    """torch.func's failure is reported with warnings.warn (a TraceFallbackWarning): Python's
    filters decide how often it shows (the default: once per place and message), nothing in
    probust remembers it, so a filter that records every warning sees it on every call."""
    from probust.linearisation.pullback import Pullback, TraceFallbackWarning

    model, x = _Untraceable(), torch.randn(3, 6)
    for _ in range(2):  # a new estimator warns again: no warn-once set left behind
        with pytest.warns(TraceFallbackWarning, match="one backward pass per cotangent"):
            probust.Taylor(model, 0.3, execution=Execution(jacobian="vmap"))(x)
        with pytest.warns(TraceFallbackWarning, match="one backward pass per cotangent"):
            Pullback(model, x, model.b, strategy="vmap")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            probust.Taylor(model, 0.3, execution=Execution(jacobian="vmap"))(x)
    assert sum(issubclass(w.category, TraceFallbackWarning) for w in seen) == 1
    assert issubclass(TraceFallbackWarning, RuntimeWarning)


def test_diagnostics_have_documented_shapes():
    model = linear_model(8, 5, seed=4)
    x = points_near_boundaries(model, 3, 0.3)
    r = probust.Taylor(model, 0.3)(x)
    assert r.p.dtype == torch.float64 and r.p.shape == (3,)
    assert r.target.dtype == torch.int64
    assert r.z.shape == (3, 5) and r.margin.shape == (3, 5) and r.grad_norm.shape == (3, 5)
    assert torch.isinf(r.z.gather(1, r.target[:, None])).all()
    assert r.cdf_error.shape == (3,) and (r.cdf_error >= 0).all()


def test_zero_gradient_boundary_drops_out_instead_of_nan():
    # Class 2's logit equals class 0's minus a constant: g_2 is constant and positive.
    model = nn.Linear(5, 3)
    with torch.no_grad():
        model.weight[2] = model.weight[0]
        model.bias[2] = model.bias[0] - 1.0
    x = torch.randn(4, 5) * 0.1
    target = torch.zeros(4, dtype=torch.long)
    r = probust.Taylor(model, 0.2)(x, target)
    assert torch.isfinite(r.p).all()
    assert torch.isinf(r.z[:, 2]).all()
    # What is left is the binary problem of class 1, from the weights (not r.margin, r.grad_norm).
    w, b = model.weight.detach().double(), model.bias.detach().double()
    c = (x.double() @ (w[0] - w[1]) + (b[0] - b[1])) / (0.2 * (w[0] - w[1]).norm())
    torch.testing.assert_close(r.p, torch.special.ndtr(c), atol=1e-6, rtol=0)


def test_ties_at_the_clean_point_need_an_explicit_target():
    model = nn.Linear(3, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([1.0, 1.0, 0.0]))
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="tied"):
        probust.Taylor(model, 0.1)(x)
    r = probust.Softmax(model)(x, target=torch.tensor([0, 1]))
    assert torch.equal(r.target, torch.tensor([0, 1]))


def test_unknown_cdf_is_refused(small):
    model, x = small
    with pytest.raises(ValueError, match="^cdf: must be one of"):
        probust.Taylor(model, 0.1, cdf="probit")


@pytest.mark.parametrize("method", ["taylor", "taylor_mvs", "mmse", "mmse_mvs"])
def test_a_jacobian_that_is_not_finite_is_refused_naming_the_point(method):
    class SqrtModel(nn.Module):
        """Finite logits everywhere, an infinite derivative where x_0 = 0 (sqrt at 0)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([x[:, 0].abs().sqrt(), 0.5 * x[:, 1], -x[:, 1]], dim=1)

    x = torch.tensor([[1.0, 3.0], [0.0, 1.0], [4.0, 0.5]])
    est = probust.make_estimator(method, SqrtModel(), 0.1, **({"n_samples": 1} if "mmse" in method else {}))
    if "mmse" in method:  # one copy at a noisy point: the derivative is finite there
        assert torch.isfinite(est(x).p).all()
        return
    with pytest.raises(ValueError, match=r"NaN or inf at data-set index 11\b"):
        est(x, index_offset=10)
