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
constant): those cases check the whole chain (margins, normals, the quadratic form, the
standardisation, dropping negligible tails and their error), not the QMC. Rows
w_i = a_i (sqrt(rho) v + sqrt(1 - rho) q_i) (v, q_i orthonormal) give boundaries with pairwise
correlation rho, whose p is a one-dimensional integral (scipy.integrate.quad): there the QMC
does the work, and its tolerance and ``cdf_error`` are checked against that integral.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats
from torch import nn

import probust

CLASSES = [2, 3, 10, 30, 100]
SIGMAS = [0.1, 0.5, 2.0]
POINTS = 6  # per (classes, sigma)
RHOS = [0.3, 0.7]  # pairwise correlations of the boundaries in the equicorrelated cases
ROUNDING = 1e-14  # float64 rounding the mvn-cdf's error estimate leaves out (mvn_cdf: "~0 (<= 1e-14)")


def _model(classes: int, dtype: torch.dtype, seed: int, rho: float = 0.0) -> tuple[nn.Linear, np.ndarray, np.ndarray]:
    """The linear model (target class 0, row 0 zero, rows w_i = a_i (sqrt(rho) v + sqrt(1 - rho) q_i)
    with v, q_1, ... orthonormal: orthogonal at rho = 0, pairwise correlation rho otherwise), its
    orthonormal basis Q [d, d] (columns 0..C-2 the q_i, column C-1 v) and the row scales a_i."""
    gen = torch.Generator().manual_seed(seed)
    d = classes + 5
    q = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64)).Q
    a = 0.5 + 1.5 * torch.rand(classes - 1, generator=gen, dtype=torch.float64)
    weight = torch.zeros(classes, d, dtype=torch.float64)
    weight[1:] = a[:, None] * (rho**0.5 * q[:, classes - 1] + (1 - rho) ** 0.5 * q[:, : classes - 1].T)
    bias = torch.zeros(classes, dtype=torch.float64)
    bias[1:] = torch.randn(classes - 1, generator=gen, dtype=torch.float64)
    model = nn.Linear(d, classes).to(dtype)
    with torch.no_grad():
        model.weight.copy_(weight)
        model.bias.copy_(bias)
    return model, q.numpy(), a.numpy()


def _points(
    model: nn.Linear, q: np.ndarray, a: np.ndarray, sigma: float, seed: int, rho: float, n: int = POINTS
) -> torch.Tensor:
    """n points whose exact p is spread over about (0.05, 0.99): z-scores chosen first (up to 3
    deciding boundaries, the rest 2.5 to 8 noise units away, some far enough for the mvn-cdf to
    drop them), then x solved for them, plus a random part along the other directions."""
    rng = np.random.default_rng(seed)
    k = len(a)
    bias = model.bias.detach().double().numpy()[1:]
    rows = []
    for p_goal in np.linspace(0.06, 0.99, n):
        deciding = min(k, 3)
        z = rng.uniform(2.5, 8.0, k)
        z[:deciding] = special.ndtri(p_goal ** (1 / deciding))
        rng.shuffle(z)
        # g_i = -(w_i . x + b_i) = z_i sigma a_i, w_i . x = a_i (sqrt(rho) v . x + sqrt(1 - rho) q_i . x)
        along_v = rng.normal()
        along = (-(bias + z * sigma * a) / a - rho**0.5 * along_v) / (1 - rho) ** 0.5
        rest = rng.normal(size=q.shape[0] - k - 1)
        rows.append(q[:, :k] @ along + q[:, k] * along_v + q[:, k + 1 :] @ rest)
    return torch.tensor(np.array(rows), dtype=model.weight.dtype)


def _exact(model: nn.Linear, x: torch.Tensor, sigma: float, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(p, z [B, C-1]) for target 0 in float64 numpy, from the model's weights: the product of
    normal CDFs at rho = 0; with equicorrelated boundaries Y_i = sqrt(rho) S + sqrt(1 - rho) E_i,
    so p = int phi(s) prod_i Phi((z_i - sqrt(rho) s) / sqrt(1 - rho)) ds (scipy's quad)."""
    w = model.weight.detach().double().numpy()
    b = model.bias.detach().double().numpy()
    normals = w[:1] - w[1:]
    unit = normals / np.linalg.norm(normals, axis=1, keepdims=True)
    off = ~np.eye(len(unit), dtype=bool)
    assert np.allclose((unit @ unit.T)[off], rho, atol=1e-6), "the boundaries' correlation is not rho"
    logits = x.double().numpy() @ w.T + b
    z = (logits[:, :1] - logits[:, 1:]) / (sigma * np.linalg.norm(normals, axis=1))
    if rho == 0:
        return np.prod(special.ndtr(z), axis=1), z

    def integrand(s: float, zi: np.ndarray) -> float:
        return float(
            np.exp(-s * s / 2) / np.sqrt(2 * np.pi) * np.prod(special.ndtr((zi - rho**0.5 * s) / (1 - rho) ** 0.5))
        )

    p = [integrate.quad(integrand, -40, 40, args=(zi,), epsabs=1e-14, epsrel=1e-12, limit=200)[0] for zi in z]
    return np.array(p), z


def _cases(classes: int, dtype: torch.dtype, rho: float = 0.0):
    """(model, x, sigma, exact p, z) for each sigma."""
    model, q, a = _model(classes, dtype, seed=classes, rho=rho)
    for j, sigma in enumerate(SIGMAS):
        x = _points(model, q, a, sigma, seed=100 * classes + j, rho=rho)
        p, z = _exact(model, x, sigma, rho)
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


COVERAGE_POINTS = 24  # per (classes, rho, sigma): 4 x 3 x 24 = 288 points, most of them sampled


def _coverage_pool(tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Taylor on equicorrelated boundaries (C = 10 and 30, rho 0.3 and 0.7, every sigma): the
    actual errors against the integral [n], cdf_error [n], and which points were sampled (QMC:
    their value moves with the seed). Only those can miss: closed forms (<= 2 boundaries in reach,
    or orthogonal boundaries, whose QMC integrand is constant) and points pinned by the
    deterministic bounds carry a guaranteed error."""
    errors, bounds, sampled = [], [], []
    for classes in (10, 30):
        for rho in RHOS:
            model, q, a = _model(classes, torch.float64, seed=classes, rho=rho)
            for j, sigma in enumerate(SIGMAS):
                x = _points(model, q, a, sigma, seed=1000 + 100 * classes + j, rho=rho, n=COVERAGE_POINTS)
                exact, _ = _exact(model, x, sigma, rho)
                target = torch.zeros(len(x), dtype=torch.long)
                r = probust.Taylor(model, sigma, tol=tol)(x, target)
                other = probust.Taylor(model, sigma, tol=tol, seed=1)(x, target)
                errors.append(np.abs(r.p.numpy() - exact))
                bounds.append(r.cdf_error.numpy())
                sampled.append((r.p != other.p).numpy())
    return np.concatenate(errors), np.concatenate(bounds), np.concatenate(sampled)


def _coverage_misses(error: np.ndarray, bound: np.ndarray, sampled: np.ndarray) -> tuple[int, int]:
    """(misses among sampled points, the allowance: the 99.9% quantile of Binomial(n_sampled, 0.01)).
    Points with a guaranteed error may not miss at all (asserted here)."""
    assert not (error[~sampled] > bound[~sampled] + ROUNDING).any(), "a guaranteed error was exceeded"
    n = int(sampled.sum())
    return int((error[sampled] > bound[sampled] + ROUNDING).sum()), int(stats.binom.ppf(0.999, n, 0.01))


@pytest.mark.parametrize("tol", [1e-4, 1e-5])
def test_cdf_error_bounds_the_actual_error_in_at_least_99_percent_of_cases(tol):
    # cdf_error is "about a 99% bound" on the mvn-cdf's error, "~0 (<= 1e-14)" where at most two
    # boundaries are left; ROUNDING is that documented floor (the float64 rounding of the margins
    # and of Phi is ~1e-16). The check counts misses among the points that can miss, and holds
    # enough of them that a doubled error (a miss rate of ~12%) fails it with 99% probability.
    error, bound, sampled = _coverage_pool(tol)
    n = int(sampled.sum())
    misses, allowed = _coverage_misses(error, bound, sampled)
    assert stats.binom.cdf(allowed, n, 0.12) < 0.01, f"only {n} sampled points: cannot see a doubled error"
    assert misses <= allowed, (misses, n, error[sampled & (error > bound)])
    assert (bound <= tol).all(), bound.max()  # and it is within the tolerance asked for
    if tol == 1e-4:
        # The check sees an error twice as large (same error estimate, sampled points only). Not
        # at tol 1e-5, where these points' estimates are conservative (measured: 0 misses, and 4
        # of 288 with a doubled error): there the check's power is the assertion above.
        doubled_misses, _ = _coverage_misses(np.where(sampled, 2 * error, error), bound, sampled)
        assert doubled_misses > allowed, (doubled_misses, allowed, n)


def _check_equicorrelated(classes: int, rho: float, tol: float) -> None:
    for model, x, sigma, exact, _ in _cases(classes, torch.float64, rho):
        target = torch.zeros(len(x), dtype=torch.long)
        for name, estimator in _estimators(sigma, model, tol).items():
            if name == "mmse N=5":
                continue  # N = 2 already is exact; the QMC dominates the cost here
            error = np.abs(estimator(x, target).p.numpy() - exact)
            assert error.max() <= tol, (name, sigma, error.max())


@pytest.mark.parametrize("tol", [1e-4, 1e-5])
@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("classes", [3, 10, 30])
def test_taylor_and_mmse_equal_the_equicorrelated_integral_within_tol(classes, rho, tol):
    _check_equicorrelated(classes, rho, tol)


@pytest.mark.slow
@pytest.mark.parametrize("tol", [1e-4, 1e-5])
@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("classes", [100])
def test_taylor_and_mmse_equal_the_equicorrelated_integral_within_tol_for_many_classes(classes, rho, tol):
    _check_equicorrelated(classes, rho, tol)


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
