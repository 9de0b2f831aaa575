"""The core alone: run in a venv holding probust with torch, numpy and scipy only (.ci/run makes it).

    python tests/core_only/check_core.py

Checks that none of the extras' packages is installed (else this proves nothing), that
``import probust`` works, that every estimator, ``probust.estimate``, ``mvn_cdf`` / ``mvn_sf``,
the noise models, ``certify`` / ``predict`` and ``RobustLoss`` compute on a small model with
numbers that agree with an independent reference, and that what needs an extra says which.
A plain script (pytest does not collect it): the main suite runs with every extra installed,
where ``tests/test_extras.py`` hides them instead.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from probust.execution import Execution

EXTRA_MODULES = ("pandas", "pyarrow", "matplotlib", "sklearn", "torchvision", "tqdm", "PIL", "transformers")


def main() -> None:
    installed = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is not None]
    assert not installed, f"this venv is not core-only: {installed} installed"

    import numpy as np
    import scipy.stats
    import torch

    import probust
    from probust._extras import MissingExtraError

    loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(EXTRA_MODULES))
    assert not loaded, loaded
    torch.manual_seed(0)
    torch.set_num_threads(1)

    # A linear model: Taylor and MMSE are exact there, Monte Carlo agrees within its interval.
    d, c, sigma = 6, 4, 0.3
    linear = torch.nn.Linear(d, c)
    x = torch.randn(8, d)
    mc = probust.MonteCarlo(linear, sigma, n_samples=20_000)(x)
    exact = probust.Taylor(linear, sigma)(x)
    slack = 0.01 + (mc.ci_high - mc.ci_low)
    assert bool(((exact.p - mc.p).abs() <= slack).all()), (exact.p, mc.p)
    mmse = probust.MMSE(linear, sigma, n_samples=4)(x)
    assert torch.allclose(mmse.p, exact.p, atol=2e-3), (mmse.p, exact.p)

    # Every method of the registry, by class and by name, on a small non-linear network.
    net = torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.Tanh(), torch.nn.Linear(16, c))
    estimators = {
        "mc": probust.MonteCarlo(net, sigma, n_samples=2_000),
        "taylor": probust.Taylor(net, sigma),
        "mmse": probust.MMSE(net, sigma, n_samples=4),
        "taylor_mvs": probust.Taylor(net, sigma, cdf="mv-sigmoid"),
        "mmse_mvs": probust.MMSE(net, sigma, n_samples=4, cdf="mv-sigmoid"),
        "softmax": probust.Softmax(net),
        "mc_cv": probust.MonteCarloCV(net, sigma, n_samples=2_000),
        "mc_is": probust.MonteCarloIS(net, sigma, n_samples=2_000),
    }
    assert set(estimators) == set(probust.METHODS), probust.METHODS
    for name, est in estimators.items():
        r = est(x)
        assert r.p.shape == (8,) and r.p.dtype == torch.float64, name
        assert bool(((r.p >= 0) & (r.p <= 1)).all()), (name, r.p)
        by_name = probust.estimate(net, x, None if name == "softmax" else sigma, name, n_samples=est_samples(name))
        assert by_name.shape == (8,), name
        print(f"  {name:<11} p = {', '.join(f'{v:.3f}' for v in r.p[:4].tolist())}, ...")

    # Noise models other than the isotropic Gaussian.
    for noise in (probust.Uniform(sigma), probust.Laplace(sigma), probust.Gaussian(torch.full((d,), sigma))):
        p = probust.MonteCarlo(net, noise, n_samples=1_000)(x).p
        assert p.shape == (8,)

    # mvn_cdf and mvn_sf against scipy.
    cov = torch.tensor([[1.0, 0.5, 0.2], [0.5, 1.0, 0.3], [0.2, 0.3, 1.0]], dtype=torch.float64)
    upper = torch.tensor([[0.3, -0.2, 1.1], [1.5, 0.7, 0.1]], dtype=torch.float64)
    reference = np.array([scipy.stats.multivariate_normal(np.zeros(3), cov.numpy()).cdf(u) for u in upper.numpy()])
    cdf = probust.mvn_cdf(upper, cov, tol=1e-5)
    assert np.allclose(cdf.numpy(), reference, atol=5e-4), (cdf, reference)
    sf = probust.mvn_sf(upper, cov)
    assert np.allclose(sf.numpy(), 1 - reference, rtol=0.02, atol=5e-4), (sf, 1 - reference)

    # Randomized smoothing.
    cert = probust.certify(linear, x, 0.25, n0=50, n=2_000)
    assert cert.radius.shape == (8,) and cert.prediction.shape == (8,)
    pred = probust.predict(linear, x, 0.25, n=500)
    assert pred.prediction.shape == (8,)
    radius = probust.radius_estimate(exact, sigma)
    assert radius.shape == (8,) and bool(torch.isfinite(radius[exact.p < 1]).all())

    # The robust loss trains through the core only.
    loss = probust.RobustLoss(sigma, warmup_steps=0)(net, x, exact.target)
    loss.backward()
    assert math.isfinite(loss.item())

    # What needs an extra names it.
    for attempt, extra in (
        (lambda: probust.run_estimate, "run"),
        (lambda: probust.find_issues, "run"),
        (lambda: probust.Taylor(net, sigma, execution=Execution(show_progress=True))(x), "run"),
        (lambda: __import__("probust.experiments"), "report"),
    ):
        try:
            attempt()
        except MissingExtraError as exc:
            assert exc.extra == extra and f"pip install 'probust[{extra}]'" in str(exc), exc
        else:
            raise AssertionError(f"no MissingExtraError naming {extra!r}")
    cli = [sys.executable, "-m", "probust"]
    shown = subprocess.run([*cli, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "o")
        args = ["estimate", "--data", "digits", "--model", "linear", "--sigma", "0.1", "--out", out]
        shown = subprocess.run([*cli, *args], capture_output=True, text=True)
    assert shown.returncode == 1 and "pip install 'probust[run]'" in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr, shown.stderr
    print(f"core only: probust {probust.__version__} with torch {torch.__version__}: every estimator ran; ok")


def est_samples(name: str) -> int | None:
    return {"mc": 1_000, "mc_cv": 1_000, "mc_is": 1_000, "mmse": 3, "mmse_mvs": 3}.get(name)


if __name__ == "__main__":
    main()
