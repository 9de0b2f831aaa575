"""Run by test_clock.py in a fresh interpreter: every method on three models, under a clock that
runs at random speeds, printing a digest of each estimate's p (and its routes) as JSON.

Usage: python clock_child.py SEED {fixed|defaults}

Every ``time.perf_counter`` / ``time.monotonic`` interval (and their _ns forms) is scaled by a
random factor in [0.01, 100] (log-uniform, from SEED) before probust or torch is imported, so
any timing probust took would be random. With the plan fixed (``jacobian``, ``batch_size`` and
the memory format) or left to its declared defaults, nothing probust computes may change.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time


def _skewed(real, rng: random.Random, integer: bool = False):
    last = real()
    now = last

    def clock():
        nonlocal last, now
        t = real()
        now += (t - last) * 10 ** rng.uniform(-2, 2)
        last = t
        return int(now) if integer else now

    return clock


def _install(seed: int) -> None:
    rng = random.Random(seed)
    time.perf_counter = _skewed(time.perf_counter, rng)
    time.monotonic = _skewed(time.monotonic, rng)
    time.perf_counter_ns = _skewed(time.perf_counter_ns, rng, integer=True)
    time.monotonic_ns = _skewed(time.monotonic_ns, rng, integer=True)


def _models():
    import torch
    from torch import nn

    class AfterHead(nn.Module):  # logits / 1 after the last layer: no linear head to use
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) / 1.0

    torch.manual_seed(0)
    # C = 1,000 with a linear head of 128 features in which 10 classes compete (a trained head's
    # shape): the spectral screening, then each point's candidates.
    body = nn.Sequential(nn.Flatten(), nn.Linear(48, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    head = nn.Linear(128, 1000)
    with torch.no_grad():
        head.bias[10:] -= 30.0
    screened = nn.Sequential(body, head).eval()
    # A small CNN with a linear head at C = 10 (every gradient directly, one pass each).
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 10)).eval()
    # No head, C = 500 from 48 inputs, 10 classes competing: forward mode (48 probes) instead of 499 pulls.
    last = nn.Linear(256, 500)
    with torch.no_grad():
        last.bias[10:] -= 30.0
    forward = AfterHead(nn.Sequential(nn.Flatten(), nn.Linear(48, 256), nn.Tanh(), last)).eval()
    # No head, C = 500 from 768 inputs through a flat map that defeats the spectral screening:
    # the forward-mode sketch.
    sketched = AfterHead(
        nn.Sequential(nn.Flatten(), nn.Linear(768, 600), nn.Tanh(), nn.Linear(600, 500), nn.Tanh())
    ).eval()
    small = torch.randn(12, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    large = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    return {
        "screened": (screened, small),
        "cnn": (cnn, small),
        "forward": (forward, small),
        "sketch": (sketched, large),
    }


def main() -> None:
    seed, mode = int(sys.argv[1]), sys.argv[2]
    _install(seed)

    import probust

    models = _models()
    # A fixed plan: rows per pass, memory format and (for the linearisations) the Jacobian strategy.
    how = probust.Execution(batch_size=16, channels_last=False, jacobian="loop") if mode == "fixed" else None
    runs = {
        "taylor": lambda m: probust.Taylor(m, 0.3, execution=how),
        "mmse": lambda m: probust.MMSE(m, 0.3, n_samples=5, execution=how),
        "mc": lambda m: probust.MonteCarlo(m, 0.3, n_samples=200, execution=how),
        "mc_cv": lambda m: probust.MonteCarloCV(m, 0.3, n_samples=100, execution=how),
        "mc_is": lambda m: probust.MonteCarloIS(m, 0.3, n_samples=100, execution=how),
        "softmax": lambda m: probust.Softmax(m, execution=how),
    }
    out = {}
    for name, (model, x) in models.items():
        for method, make in runs.items():
            est = make(model)(x)
            p = est.p.detach().double().numpy().tobytes()
            route = None if est.route is None else est.route.tolist()
            err = None if est.cdf_error is None else est.cdf_error.detach().double().tolist()
            out[f"{name}/{method}"] = {
                "p": hashlib.sha256(p).hexdigest(),
                "values": est.p.detach().double().tolist(),
                "cdf_error": err,
                "route": route,
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
