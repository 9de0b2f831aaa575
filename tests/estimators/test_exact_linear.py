"""Taylor and MMSE on multi-class linear models against an exact, independent closed form.

A linear model f(x) = W x + b whose target row is w_t = 0 and whose other rows are mutually
orthogonal (w_i = a_i q_i, q_i orthonormal) has boundary normals w_t - w_i = -a_i q_i that are
mutually orthogonal, so under Gaussian noise N(0, sigma^2 I) the C - 1 events "boundary i not
crossed" are independent and

    p = prod_{i != t} Phi(g_i(x) / (sigma ||w_t - w_i||)),   g_i(x) = f_t(x) - f_i(x),

computed here in float64 with scipy.special.ndtr from the model's own weights and the points,
never through probust. Taylor is exact for linear models and MMSE with "centred" draws is too
at N >= 2, so the only error left is the mvn-cdf's (``tol``; ``cdf_error`` is its "about 99%"
bound, :func:`probust.mvn.mvn_cdf`) and float rounding of the margins. The mv-sigmoid variants
are compared with their closed form 1 / (1 + sum_i exp(-z_i)), z_i the same standardised margins.

With orthogonal boundaries the mvn-cdf's correlation is the identity (its QMC integrand is then
constant): these tests check the whole chain (margins, normals, the quadratic form, the
standardisation, dropping negligible tails and their error), not the QMC's variance, which
tests/mvn covers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import special, stats
from torch import nn

import probust

CLASSES = [2, 3, 10, 30, 100]
SIGMAS = [0.1, 0.5, 2.0]
POINTS = 6  # per (classes, sigma)
ROUNDING = 1e-14  # float64 rounding the mvn-cdf's error estimate leaves out (mvn_cdf: "~0 (<= 1e-14)")


def _orthogonal_model(classes: int, dtype: torch.dtype, seed: int) -> tuple[nn.Linear, np.ndarray, np.ndarray]:
    """The linear model (target class 0, row 0 zero, rows 1.. orthogonal), its orthonormal
    basis Q [d, d] (columns 0..C-2 are the rows' directions) and the row scales a_i."""
    gen = torch.Generator().manual_seed(seed)
    d = classes + 5
    q = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64)).Q
    a = 0.5 + 1.5 * torch.rand(classes - 1, generator=gen, dtype=torch.float64)
    weight = torch.zeros(classes, d, dtype=torch.float64)
    weight[1:] = a[:, None] * q[:, : classes - 1].T
    bias = torch.zeros(classes, dtype=torch.float64)
    bias[1:] = torch.randn(classes - 1, generator=gen, dtype=torch.float64)
    model = nn.Linear(d, classes).to(dtype)
    with torch.no_grad():
        model.weight.copy_(weight)
        model.bias.copy_(bias)
    return model, q.numpy(), a.numpy()


def _points(model: nn.Linear, q: np.ndarray, a: np.ndarray, sigma: float, seed: int) -> torch.Tensor:
    """Points whose exact p is spread over about (0.05, 0.99): z-scores chosen first (up to 3
    deciding boundaries, the rest 2.5 to 8 noise units away, some far enough for the mvn-cdf to
    drop them), then x solved for them, plus a random part along the boundaries."""
    rng = np.random.default_rng(seed)
    k = len(a)
    bias = model.bias.detach().double().numpy()[1:]
    rows = []
    for p_goal in np.linspace(0.06, 0.99, POINTS):
        deciding = min(k, 3)
        z = rng.uniform(2.5, 8.0, k)
        z[:deciding] = special.ndtri(p_goal ** (1 / deciding))
        rng.shuffle(z)
        # g_i = -(a_i q_i . x + b_i) = z_i sigma a_i  <=>  q_i . x = -(b_i + z_i sigma a_i) / a_i
        along = -(bias + z * sigma * a) / a
        rest = rng.normal(size=q.shape[0] - k)
        rows.append(q[:, :k] @ along + q[:, k:] @ rest)
    return torch.tensor(np.array(rows), dtype=model.weight.dtype)


def _exact(model: nn.Linear, x: torch.Tensor, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(p, z [B, C-1]) for target 0 in float64 numpy: the product of normal CDFs and the z-scores."""
    w = model.weight.detach().double().numpy()
    b = model.bias.detach().double().numpy()
    xs = x.double().numpy()
    logits = xs @ w.T + b
    g = logits[:, :1] - logits[:, 1:]
    z = g / (sigma * np.linalg.norm(w[:1] - w[1:], axis=1))
    return np.prod(special.ndtr(z), axis=1), z


def _cases(classes: int, dtype: torch.dtype):
    """(model, x, sigma, exact p, z) for each sigma."""
    model, q, a = _orthogonal_model(classes, dtype, seed=classes)
    for j, sigma in enumerate(SIGMAS):
        x = _points(model, q, a, sigma, seed=100 * classes + j)
        p, z = _exact(model, x, sigma)
        yield model, x, sigma, p, z


def _estimators(sigma: float, model: nn.Module, tol: float, cdf: str = "mvn") -> dict[str, probust.Estimator]:
    return {
        "taylor": probust.Taylor(model, sigma, tol=tol, cdf=cdf),
        "mmse N=2": probust.MMSE(model, sigma, n_samples=2, tol=tol, cdf=cdf),
        "mmse N=5": probust.MMSE(model, sigma, n_samples=5, tol=tol, cdf=cdf),
    }


def test_the_test_points_spread_p_over_the_range():
    for classes in CLASSES:
        ps = np.concatenate([p for *_, p, _ in _cases(classes, torch.float64)])
        assert ps.min() < 0.1 and ps.max() > 0.95 and ((ps > 0.3) & (ps < 0.7)).any(), (classes, ps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("tol", [1e-4, 1e-5])
@pytest.mark.parametrize("classes", CLASSES)
def test_taylor_and_mmse_equal_the_product_of_normal_cdfs_within_tol(classes, tol, dtype):
    for model, x, sigma, exact, _ in _cases(classes, dtype):
        target = torch.zeros(len(x), dtype=torch.long)
        for name, estimator in _estimators(sigma, model, tol).items():
            r = estimator(x, target)
            error = np.abs(r.p.numpy() - exact)
            assert error.max() <= tol, (name, sigma, error.max(), r.p, exact)


@pytest.mark.parametrize("tol", [1e-4, 1e-5])
def test_cdf_error_bounds_the_actual_error_in_at_least_99_percent_of_cases(tol):
    # cdf_error is "about a 99% bound" on the mvn-cdf's error, "~0 (<= 1e-14)" where at most two
    # boundaries are left: there it is exactly 0 (C = 2 here), while the float64 rounding of the
    # margins and of Phi is ~1e-16. ROUNDING is that documented floor. Failures may be at most
    # what a 1% failure rate gives with probability 0.999.
    errors, bounds = [], []
    for classes in CLASSES:
        for model, x, sigma, exact, _ in _cases(classes, torch.float64):
            target = torch.zeros(len(x), dtype=torch.long)
            r = probust.Taylor(model, sigma, tol=tol)(x, target)
            errors.append(np.abs(r.p.numpy() - exact))
            bounds.append(r.cdf_error.numpy())
    error, bound = np.concatenate(errors), np.concatenate(bounds)
    misses = int((error > bound + ROUNDING).sum())
    assert misses <= stats.binom.ppf(0.999, len(error), 0.01), (misses, len(error), error[error > bound + ROUNDING])
    assert (bound <= tol).all(), bound.max()  # and it is within the tolerance asked for


# Rounding allowed against the closed form. Float32 models: the margins' rounding. MMSE of a
# float64 model: the noise is drawn in float32, so the centred draws cancel the linear part only
# to float32 rounding (~1e-8 in p); Taylor of a float64 model is exact to float64 rounding.
MVS_ATOL = {
    (torch.float32, "taylor"): 1e-6,
    (torch.float32, "mmse"): 1e-6,
    (torch.float64, "taylor"): 1e-12,
    (torch.float64, "mmse"): 1e-7,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("classes", CLASSES)
def test_mv_sigmoid_variants_equal_their_closed_form(classes, dtype):
    for model, x, sigma, _, z in _cases(classes, dtype):
        target = torch.zeros(len(x), dtype=torch.long)
        closed = 1 / (1 + np.exp(-z).sum(axis=1))
        for name, estimator in _estimators(sigma, model, 1e-4, cdf="mv-sigmoid").items():
            r = estimator(x, target)
            assert r.method.endswith("_mvs")
            error = np.abs(r.p.numpy() - closed)
            assert error.max() <= MVS_ATOL[dtype, name.split()[0]], (name, sigma, error.max())
