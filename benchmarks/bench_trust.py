"""How well the trust signal (``r.agreement``) flags the large errors of Taylor and MMSE.

For each model, sigma and method, every point's estimate p is compared with Monte Carlo's
(``probust.MonteCarlo``, ``--mc-samples`` draws, 10,000 by default: standard error <= 0.005).
A point has a *large error* where |p - p_mc| > 0.1; it is *flagged* where
:func:`probust.estimators.trust.untrusted` says so (its verdicts differ on more than 5% of the
checked draws at 95% confidence: what the LinearisationWarning counts). Printed per row:

- ``large``: points with a large error; ``flagged``: points flagged;
- ``recall``: flagged / large (the large errors the signal catches; "-" where there are none);
- ``false``: the false-alarm rate, flagged among the points without a large error;
- ``rec>.1``, ``fal>.1``: the same for a rule without a confidence bound (flag where more than
  10% of the checked draws disagree), for comparison;
- ``bound``: the share of points where |p - p_mc| is at most the 95% upper Clopper-Pearson
  bound on the disagreement rate, + 0.02 for Monte Carlo and the mvn-cdf (the bound
  P(verdicts differ) >= |p_true - p_lin|: about 95% or more expected);
- ``max_err``: the largest |p - p_mc|; ``agree``: the mean agreement;
- ``cost``: the check's extra CPU time over the same estimator with ``check_draws=0`` (least
  of ``--repeats`` calls each, one warm-up call first; the median over rows in the summary);
  ``ms/pt``: that estimator's CPU time per point without the check.

Models: the demo's Fashion-MNIST models (``probust demo``: the linear model, 5 epochs, and the
CNN, 1 epoch, at gradient-norm penalties lambda = 0 and 0.01; trained here with probust's own
training, seed 0, into ``--models``, reused when there) on the first ``--points`` test points at
the demo's sigmas (0.05, 0.1, 0.2, 0.4); and the case of issue 32, a random-weight ResNet18
(probust.models.ResNet18, 3 x 16 x 16 inputs uniform in [0, 1], seed 0) at sigma 0.5 and 2, on
``--resnet-points`` points with ``--resnet-mc-samples`` Monte Carlo draws (1,000 by default:
one ResNet forward pass costs ~15 ms on one CPU thread; p_mc is ~1 there, so +-0.03 decides
an error > 0.1). Taylor is run with ``check_draws`` in ``--taylor-draws`` (p is the same for all:
the draws only feed the check), MMSE with N in ``--mmse-samples`` (it checks its own copies).

Run:  PYTHONPATH=src .venv/bin/python benchmarks/bench_trust.py [--points 30] [--mc-samples 10000]
      [--taylor-draws 8 16 32 64] [--mmse-samples 5 10] [--resnet-points 6] [--models DIR]
      (one CPU thread; about 10 minutes with the defaults on a 2-core machine)
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch

import probust
from probust import data as pdata
from probust.estimators import trust
from probust.estimators.trust import upper_rate
from probust.models import ResNet18
from probust.training import train

LARGE = 0.1
SLACK = 0.02


def demo_models(folder: Path) -> dict[str, torch.nn.Module]:
    """The demo's Fashion-MNIST models, trained once into ``folder`` (reused when complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    train_ds, test_ds = pdata.load("fashion-mnist", "train"), pdata.load("fashion-mnist", "test")
    models = {}
    for arch, epochs, lam in (("linear", 5, 0.0), ("cnn", 1, 0.0), ("cnn", 1, 0.01)):
        name = f"fashion-mnist-{arch}" + (f"-lambda{lam:g}" if arch == "cnn" else "")
        result = train(
            train_ds,
            arch,
            epochs=epochs,
            grad_reg=lam,
            seed=0,
            out=folder / f"{name}-e{epochs}-s0.pt",
            show_progress=False,
            test_dataset=test_ds,
            num_threads=1,
        )
        models[name] = result.model.eval()
    return models


def timed(estimator, x: torch.Tensor, repeats: int) -> tuple[probust.Estimate, float]:
    """The estimate of ``x`` and the least CPU time of ``repeats`` calls (after one warm-up call).

    CPU time of this process, one thread: other processes on a shared machine move wall time
    far more than they move it."""
    estimator(x[:2])
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = estimator(x)
        best = min(best, time.process_time() - start)
    assert result is not None
    return result, best


def row(
    model: str, sigma: float, method: str, r: probust.Estimate, p_mc: torch.Tensor, cost: float, base: float
) -> dict:
    error = (r.p - p_mc).abs()
    large = error > LARGE
    flagged = trust.untrusted(r)
    assert r.agreement is not None and r.agreement_draws is not None
    observed = (1 - r.agreement) > 0.1  # a rule without a confidence bound, for comparison
    disagreeing = torch.round((1 - r.agreement) * r.agreement_draws)
    upper = upper_rate(disagreeing, r.agreement_draws, 0.95)
    bound = error <= upper + SLACK
    small = ~large
    return {
        "model": model,
        "sigma": sigma,
        "method": method,
        "points": len(r),
        "large": int(large.sum()),
        "flagged": int(flagged.sum()),
        "recall": float((flagged & large).sum() / large.sum()) if large.any() else None,
        "false": float((flagged & small).sum() / small.sum()) if small.any() else None,
        "recall_obs": float((observed & large).sum() / large.sum()) if large.any() else None,
        "false_obs": float((observed & small).sum() / small.sum()) if small.any() else None,
        "bound": float(bound.double().mean()),
        "max_err": float(error.max()),
        "agreement": float(r.agreement.mean()),
        "cost": cost,
        "base_ms": 1000 * base / len(r),
        # per point, for --csv: what other flagging rules would have said
        "per_point": list(zip(r.agreement.tolist(), r.agreement_draws.tolist(), error.tolist())),
    }


def score(name, model, x, sigmas, args, mc_samples) -> list[dict]:
    rows = []
    for sigma in sigmas:
        p_mc = probust.MonteCarlo(model, sigma, n_samples=mc_samples, seed=args.seed)(x).p
        base, base_t = timed(probust.Taylor(model, sigma, check_draws=0, seed=args.seed), x, args.repeats)
        for draws in args.taylor_draws:
            r, t = timed(probust.Taylor(model, sigma, check_draws=draws, seed=args.seed), x, args.repeats)
            assert torch.equal(r.p, base.p)  # the check never changes p
            rows.append(row(name, sigma, f"taylor m={draws}", r, p_mc, t / base_t - 1, base_t))
        for n in args.mmse_samples:
            off, off_t = timed(probust.MMSE(model, sigma, n, check_draws=0, seed=args.seed), x, args.repeats)
            r, t = timed(probust.MMSE(model, sigma, n, seed=args.seed), x, args.repeats)
            assert torch.equal(r.p, off.p)
            rows.append(row(name, sigma, f"mmse N={n}", r, p_mc, t / off_t - 1, off_t))
        for r_ in rows[-len(args.taylor_draws) - len(args.mmse_samples) :]:
            print(format_row(r_), flush=True)
    return rows


def format_row(r: dict) -> str:
    def pct(v):
        return "   -" if v is None else f"{v:4.0%}"

    return (
        f"{r['model']:<26} {r['sigma']:>5g} {r['method']:<11} {r['points']:>4} {r['large']:>5} {r['flagged']:>7} "
        f"{pct(r['recall']):>6} {pct(r['false']):>6} {pct(r['recall_obs']):>6} {pct(r['false_obs']):>6} "
        f"{r['bound']:6.0%} {r['max_err']:7.3f} {r['agreement']:6.3f} "
        f"{r['cost']:+6.0%} {r['base_ms']:7.1f}"
    )


HEADER = (
    f"{'model':<26} {'sigma':>5} {'method':<11} {'pts':>4} {'large':>5} {'flagged':>7} {'recall':>6} {'false':>6} "
    f"{'rec>.1':>6} {'fal>.1':>6} "
    f"{'bound':>6} {'max_err':>7} {'agree':>6} {'cost':>6} {'ms/pt':>7}"
)


def totals(rows: list[dict]) -> None:
    """Recall and false alarms pooled over every model and sigma, per method."""
    print("\npooled over models and sigmas:")
    print(
        f"{'method':<11} {'points':>6} {'large':>5} {'caught':>6} {'recall':>6} {'false alarms':>14} "
        f"{'caught>.1':>9} {'recall':>6} {'false alarms':>14} {'cost':>6}"
    )
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        points = sum(r["points"] for r in mine)
        large = sum(r["large"] for r in mine)
        small = points - large
        cells = []
        for suffix in ("", "_obs"):
            caught = sum(round(r["recall" + suffix] * r["large"]) for r in mine if r["recall" + suffix] is not None)
            false = sum(
                round(r["false" + suffix] * (r["points"] - r["large"])) for r in mine if r["false" + suffix] is not None
            )
            recall = f"{caught / large:6.0%}" if large else "     -"
            cells.append(f"{caught:>6} {recall} {false:>4} of {small:<4} ({false / max(small, 1):4.1%})")
        costs = sorted(r["cost"] for r in mine)
        print(f"{method:<11} {points:>6} {large:>5} {cells[0]}    {cells[1]} {costs[len(costs) // 2]:+6.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
    parser.add_argument("--mc-samples", type=int, default=10_000)
    parser.add_argument("--taylor-draws", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--mmse-samples", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--resnet-points", type=int, default=6)
    parser.add_argument("--resnet-sigmas", type=float, nargs="+", default=[0.5, 2.0])
    parser.add_argument("--resnet-mc-samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--models", type=Path, default=Path("/tmp/probust-bench-trust"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, help="also write every point's agreement, draws and |p - p_mc| here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", trust.LinearisationWarning)  # counted in the table instead

    x, _ = pdata.load("fashion-mnist", "test").tensors()
    x = x[: args.points]
    print(HEADER)
    rows = []
    for name, model in demo_models(args.models).items():
        rows += score(name, model, x, args.sigmas, args, args.mc_samples)
    if args.resnet_points:
        torch.manual_seed(args.seed)
        net = ResNet18(num_classes=10, input_shape=(3, 16, 16)).eval()
        xr = torch.rand(args.resnet_points, 3, 16, 16, generator=torch.Generator().manual_seed(args.seed))
        rows += score("random resnet18 16x16", net, xr, args.resnet_sigmas, args, args.resnet_mc_samples)
    totals(rows)
    if args.csv is not None:
        with args.csv.open("w") as f:
            f.write("model,sigma,method,agreement,draws,error\n")
            for r in rows:
                for agree, draws, error in r["per_point"]:
                    f.write(f"{r['model']},{r['sigma']},{r['method']},{agree},{draws},{error}\n")


if __name__ == "__main__":
    main()
