"""What a user would otherwise run: the references every speed ratio of ``benchmarks/`` is taken against.

- The paper's approach (AI4LIFE-GROUP/average-case-robustness, ``src/fns_sigma.py``): per point,
  one forward pass and one backward pass per class (on the N noisy copies for MMSE), then one
  scipy ``multivariate_normal.cdf`` of z = g / (sigma ||u||) with correlation U U^T (Genz,
  maxpts 10,000, abseps = releps = 1e-4, R + 1e-5 I as in the paper; ``norm.cdf`` for C = 2).
- Monte Carlo as a plain per-point loop: ``model(x_i + sigma * torch.randn(n, ...))``, one batch
  of n copies per point (the paper's own Monte Carlo has the same form).
- Cohen et al.'s CERTIFY (``locuslab/smoothing``, ``code/core.py``), one point after the other.

Each is written as its authors (or a user) write it, with torch's and scipy's own routines: no
probust code runs in them.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from scipy.stats import multivariate_normal, norm
from torch import Tensor, nn

PAPER_MVN = {"maxpts": 10_000, "abseps": 1e-4, "releps": 1e-4}  # the paper code's defaults


def paper_jacobian(model: nn.Module, x: Tensor, vectorized: bool = False) -> tuple[Tensor, Tensor]:
    """Logits [n, C] and their input gradients [n, C, D]: one backward pass per class."""
    x = x.detach().clone().requires_grad_(True)
    logits = model(x)
    if vectorized:  # what src/fns_sigma.py x_to_gradf does (a second forward, vmapped backward)
        jac = torch.autograd.functional.jacobian(lambda v: model(v).sum(0), x, vectorize=True).transpose(0, 1)
    else:
        rows = [torch.autograd.grad(logits[:, j].sum(), x, retain_graph=True)[0] for j in range(logits.shape[1])]
        jac = torch.stack(rows, 1)
    return logits.detach(), jac.flatten(2)


def paper_p(g: Tensor, u: Tensor, sigma: float, rng: np.random.Generator) -> float:
    """mvn-cdf of z = g / (sigma ||u||) with correlation U U^T (+1e-5 I, ensure_cov_psd)."""
    g64, u64 = g.double().numpy(), u.double().numpy()
    norms = np.linalg.norm(u64, axis=1)
    z = g64 / (sigma * norms)
    if z.size == 1:
        return float(norm.cdf(z[0]))
    unit = u64 / norms[:, None]
    cov = unit @ unit.T + 1e-5 * np.eye(z.size)
    return float(multivariate_normal.cdf(z, mean=np.zeros(z.size), cov=cov, rng=rng, **PAPER_MVN))


def boundaries(logits: Tensor, jac: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """g [n, C-1] and u [n, C-1, D] for the margins f_t - f_j, j != t."""
    others = [j for j in range(logits.shape[1]) if j != t]
    return logits[:, t, None] - logits[:, others], jac[:, t, None] - jac[:, others]


def paper_taylor(model: nn.Module, x: Tensor, sigma: float, seed: int = 0, vectorized: bool = False) -> Tensor:
    """The paper's Taylor estimator, point by point: float64 [B]."""
    rng, ps = np.random.default_rng(seed), []
    for xi in x:
        logits, jac = paper_jacobian(model, xi[None], vectorized)
        g, u = boundaries(logits, jac, int(logits[0].argmax()))
        ps.append(paper_p(g[0], u[0], sigma, rng))
    return torch.tensor(ps, dtype=torch.float64)


def paper_mmse(model: nn.Module, x: Tensor, sigma: float, n: int, seed: int = 0, vectorized: bool = False) -> Tensor:
    """The paper's MMSE estimator (n noisy copies per point), point by point: float64 [B]."""
    torch.manual_seed(seed)
    rng, ps = np.random.default_rng(seed), []
    for xi in x:
        with torch.no_grad():
            t = int(model(xi[None]).argmax())
        logits, jac = paper_jacobian(model, xi + sigma * torch.randn(n, *xi.shape), vectorized)
        g, u = boundaries(logits, jac, t)
        ps.append(paper_p(g.mean(0), u.mean(0), sigma, rng))
    return torch.tensor(ps, dtype=torch.float64)


def plain_monte_carlo(model: nn.Module, x: Tensor, sigma: float, n: int, seed: int = 0, batch: int = 0) -> Tensor:
    """Monte Carlo as a per-point loop with ``torch.randn`` (``batch`` copies per forward pass,
    0: all n at once): the fraction of copies predicted as the clean prediction, float64 [B]."""
    torch.manual_seed(seed)
    batch = batch or n
    ps = []
    with torch.no_grad():
        for xi in x:
            t = model(xi[None]).argmax(1)
            kept = sum(
                int((model(xi + sigma * torch.randn(b, *xi.shape)).argmax(1) == t).sum())
                for b in [batch] * (n // batch) + ([n % batch] if n % batch else [])
            )
            ps.append(kept / n)
    return torch.tensor(ps, dtype=torch.float64)


def planned_passes(
    model: nn.Module, x: Tensor, sigma: float, n: int, rows: int, channels_last: bool, seed: int = 0
) -> Tensor:
    """probust's Monte Carlo passes written plainly: the B x n noisy copies (``torch.randn``
    noise) in passes of ``rows`` rows across points, in channels_last where asked, each kept where
    its prediction is the clean one; the fraction kept per point, float64 [B]. The same model
    work as probust's plan (its rows and format), without probust's code: the ratio against it is
    probust's own overhead, which changes little from one CPU to another."""
    torch.manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    kept = torch.zeros(len(x), dtype=torch.float64)
    with torch.no_grad():
        clean = model(x.contiguous(memory_format=fmt)).argmax(1)
        for start in range(0, len(x) * n, rows):
            point = torch.arange(start, min(start + rows, len(x) * n)) // n
            noisy = (x[point] + sigma * torch.randn(len(point), *x.shape[1:])).contiguous(memory_format=fmt)
            kept += torch.bincount(point, (model(noisy).argmax(1) == clean[point]).double(), minlength=len(x))
    return kept / n


def _sample_noise(model: nn.Module, x: Tensor, num: int, batch_size: int, sigma: float, classes: int) -> np.ndarray:
    """``Smooth._sample_noise`` of the authors' core.py: class counts of ``num`` noisy copies of one input."""
    with torch.no_grad():
        counts = np.zeros(classes, dtype=int)
        remaining = num
        for _ in range(int(np.ceil(num / batch_size))):
            this_batch_size = min(batch_size, remaining)
            remaining -= this_batch_size
            batch = x.repeat((this_batch_size, 1, 1, 1))
            noise = torch.randn_like(batch) * sigma
            predictions = model(batch + noise).argmax(1)
            # (the authors count with a Python loop over the predictions; bincount is the same, faster)
            counts += np.bincount(predictions.cpu().numpy(), minlength=classes)
        return counts


def cohen_certify(
    model: nn.Module, x: Tensor, sigma: float, n0: int, n: int, alpha: float, batch: int, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``Smooth.certify`` of the authors' core.py, one point after the other: (prediction, radius)."""
    model.eval()
    predictions, radii = [], []
    for x_i in x:
        counts_selection = _sample_noise(model, x_i, n0, batch, sigma, classes)
        c_a = int(counts_selection.argmax())
        counts_estimation = _sample_noise(model, x_i, n, batch, sigma, classes)
        n_a = int(counts_estimation[c_a])
        # proportion_confint(nA, N, alpha=2 * alpha, method="beta")[0]
        p_a = float(stats.beta.ppf(alpha, n_a, n - n_a + 1)) if n_a > 0 else 0.0
        if p_a < 0.5:
            predictions.append(-1)
            radii.append(0.0)
        else:
            predictions.append(c_a)
            radii.append(sigma * float(stats.norm.ppf(p_a)))
    return np.array(predictions), np.array(radii)
