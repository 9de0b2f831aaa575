"""Would conditioning on lines beat the linearised control variate? (an exploration, not shipped)

mc_cv's saving is bounded by how often the model and its linearisation disagree on a draw (see
bench_control_variate.py). A stronger unbiased scheme conditions on all but one direction of
the noise ("line sampling" in structural reliability): write each Gaussian draw as
eps = eps_perp + t d, with d the noise-space normal of the nearest MMSE-linearised boundary,
scaled so that t ~ N(0, 1) independent of eps_perp. Along the line t -> x + eps_perp + t d the
linearisation predicts the kept set [lo, hi]; Newton steps on the model's own margins (one model
evaluation each, slope from the linearisation) move its finite ends onto the model's boundary.
The estimate of one line is

    P(lo < t < hi) + ( [model keeps x + eps] - [lo < t < hi] ),

whose second term (the plain Monte Carlo draw eps itself, t its coordinate along d) corrects
whatever the root finding missed, so the mean over lines is unbiased for any model: [lo, hi]
depends on eps_perp only, and t is independent of it. The correction may be evaluated on a
random fraction q of the lines only (weighted 1 / q), to save evaluations.

Printed per sigma, over the test points with 0.01 < p < 0.99: the median and pooled ratio of
plain Monte Carlo's variance per model evaluation to this estimator's (> 1: fewer evaluations
for the same interval), the evaluations spent per line, and the rate at which the final
[lo, hi] disagrees with the model on the Monte Carlo draw.

Measured (2026-11-22, the bench_control_variate CNN, 40 test points, 300 lines; pooled ratio
at sigma 0.05 / 0.1 / 0.2 / 0.3): with 2 Newton steps and q = 1 (3 evaluations per line),
3.2 / 1.5 / 0.8 / 0.7; with 1 step and q = 0.25 (1.25 per line), 2.7 / 1.2 / 0.7 / 0.6. The
per-line variance is 3-15x below plain Monte Carlo's and the final [lo, hi] misses the model on
only 0.1-2% of draws, so the root finding works; what remains is how far the model's boundary
along d moves with eps_perp, which the linearisation does not predict: the same non-linearity
that caps mc_cv. So line sampling was not added to probust.

Run:  .venv/bin/python benchmarks/explore_line_sampling.py [--points 40] [--lines 300] [--steps 2] [--q 1]
"""

from __future__ import annotations

import argparse

import torch
from scipy.special import ndtr

import probust
import probust.data
from bench_control_variate import MMSE_N, fmnist_cnn
from probust import _rng


def line_estimates(model, x: torch.Tensor, sigma: float, lines: int, steps: int, q: float, seed: int = 0) -> dict:
    """Per-point plain-MC and line-sampling variances per model evaluation ([B] tensors)."""
    batch, shape = x.shape[0], x.shape[1:]
    linear = probust.MMSE(model, sigma, n_samples=MMSE_N, seed=seed, batch_size=64)
    idx = torch.arange(batch)
    target, c, u = linear._linearise(x, None, idx)
    classes = c.shape[1]
    rows = torch.arange(batch)
    uf = u.flatten(2).double()
    var = sigma**2 * (uf * uf).sum(2)
    z = c.double() / var.clamp_min(1e-300).sqrt()
    z[rows, target] = torch.inf
    star = z.argmin(1)
    norm = var[rows, star].sqrt()
    d = sigma**2 * uf[rows, star] / norm[:, None]  # eps per unit of t
    slope = (uf @ d[:, :, None]).squeeze(2)  # [B, C]: d/dt of each linearised margin
    eps = linear.noise.sample(_rng.point_keys(seed, idx, _rng.STREAM_MC), 0, lines, shape).flatten(2).double()
    t_draw = (eps @ uf[rows, star][:, :, None]).squeeze(2) / norm[:, None]  # [B, n] ~ N(0, 1)
    perp = eps - t_draw[:, :, None] * d[:, None, :]
    offset = c.double()[:, None, :] + perp @ uf.transpose(1, 2)  # linearised margins at t = 0
    is_target = torch.zeros(batch, classes, dtype=torch.bool)
    is_target[rows, target] = True
    a = slope[:, None, :].expand_as(offset)
    others = ~is_target[:, None, :]
    root = -offset / torch.where(a == 0, 1.0, a)
    lo = torch.where((a > 0) & others, root, -torch.inf).amax(2)
    hi = torch.where((a < 0) & others, root, torch.inf).amin(2)
    dead = ((a == 0) & (offset <= 0) & others).any(2)

    def model_margins(t: torch.Tensor) -> torch.Tensor:
        pts = x.double().flatten(1)[:, None, :] + perp + t[:, :, None] * d[:, None, :]
        with torch.no_grad():
            logits = model(pts.float().view(-1, *shape)).view(batch, lines, classes).double()
        m = logits.gather(2, target[:, None, None].expand(batch, lines, 1)) - logits
        return m.masked_fill(is_target[:, None, :], torch.inf)

    evals = torch.full((batch, lines), q, dtype=torch.float64)
    ends = []
    for end, sign in ((lo, 1.0), (hi, -1.0)):
        for _ in range(steps):
            active = end.abs() < 8.0  # beyond 8 sd the end's probability is < 1e-15
            at = torch.where(active, end, 0.0)
            m = model_margins(at)
            evals += active.double()
            i = m.argmin(2)
            m_i = m.gather(2, i[:, :, None]).squeeze(2)
            a_i = slope.gather(1, i)
            usable = active & (sign * a_i > 0)
            end = torch.where(usable, at - m_i / torch.where(usable, a_i, 1.0), end)
        ends.append(end)
    lo, hi = ends
    p_line = torch.where(dead | (lo >= hi), 0.0, torch.from_numpy(ndtr(hi.numpy()) - ndtr(lo.numpy())))
    y = (model_margins(t_draw) > 0).all(2).double()
    inside = ((t_draw > lo) & (t_draw < hi) & ~dead).double()
    p_mc = y.mean(1)
    var_line = p_line.var(1) + ((y - inside) ** 2).mean(1) / q
    return {
        "p_mc": p_mc,
        "p_line": (p_line + y - inside).mean(1),
        "ratio": p_mc * (1 - p_mc) / (var_line * evals.mean(1)).clamp_min(1e-12),
        "evals": evals.mean(1),
        "mismatch": (y != inside).double().mean(1),
        "var_mc": p_mc * (1 - p_mc),
        "cost_line": var_line * evals.mean(1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=40)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--steps", type=int, default=2, help="Newton steps per finite end (1 model evaluation each)")
    parser.add_argument("--q", type=float, default=1.0, help="fraction of lines evaluated for the correction")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, acc = fmnist_cnn()
    model.eval()
    x = probust.data.load("fashion-mnist", "test").tensors()[0][: args.points]
    print(f"Fashion-MNIST CNN (accuracy {acc:.3f}), {args.points} points, {args.lines} lines, "
          f"{args.steps} Newton step(s), correction on a fraction {args.q:g} of lines")  # fmt: skip
    print(f"{'sigma':>6} {'0.01<p<0.99':>11} {'evals/line':>10} {'median ratio':>12} {'pooled ratio':>12} {'mismatch':>9}")
    for sigma in args.sigmas:
        r = line_estimates(model, x, sigma, args.lines, args.steps, args.q)
        mid = (r["p_mc"] > 0.01) & (r["p_mc"] < 0.99)
        if not mid.any():
            print(f"{sigma:>6.3g} {0:>11}")
            continue
        pooled = r["var_mc"][mid].sum() / r["cost_line"][mid].sum()
        print(f"{sigma:>6.3g} {int(mid.sum()):>11} {r['evals'][mid].mean():>10.2f} {r['ratio'][mid].median():>12.1f} "
              f"{pooled:>12.1f} {r['mismatch'][mid].mean():>9.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
