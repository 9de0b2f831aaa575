"""Helpers shared by the tests: small real results to run the experiments and the report on.

``build_results`` trains tiny models on scikit-learn's digits (a linear model at lambda 0 and
0.05, a small CNN, and the linear model with a RobustLoss) and scores them with the estimators;
nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from probust.experiments._results import Results

SIGMAS = [0.1, 0.3]
MAIN_POINTS = 60
POOL_POINTS = 200
PAPER = ["mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax"]
MC_N, MMSE_N = 300, 4
CONV_MC, CONV_MMSE = [100, 300, 1000], [1, 2, 4, 8]
# (name, arch, lambda, epochs, has pool and convergence rows)
MODELS = [
    ("linear-0", "linear", 0.0, 5, True),
    ("linear-0.05", "linear", 0.05, 5, False),
    ("cnn-0", "cnn", 0.0, 8, True),
]
# and the linear model trained like the family with a RobustLoss (mu, sigma), scored with mc only (experiment 11)
ROBUST = ("linear-robust", 1.0, 0.3)


def build_results(root: Path) -> Path:
    """Train the tiny models and score them (once: reused when ``root/complete`` exists)."""
    from probust.robust_loss import RobustLoss
    from probust.runner import run_estimate
    from probust.train import train

    if (root / "complete").exists():
        return root
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, arch, lam, epochs, extra in MODELS:
            ckpt = root / "models" / f"{name}.pt"
            train("digits", arch, epochs=epochs, grad_reg=lam, seed=0, out=ckpt, show_progress=False)
            kw = dict(data="digits", model=ckpt, out=root / "results" / name, device="cpu", seed=0, show_progress=False)
            run_estimate(
                sigmas=SIGMAS, methods=PAPER, mc_samples=MC_N, mmse_samples=MMSE_N, indices=f"0-{MAIN_POINTS - 1}", **kw
            )
            if extra:
                run_estimate(
                    sigmas=[0.3],
                    methods=["mmse", "softmax"],
                    mmse_samples=MMSE_N,
                    indices=f"0-{POOL_POINTS - 1}",
                    extend=True,
                    **kw,
                )
                run_estimate(
                    sigmas=[0.3],
                    methods=["mc", "mmse"],
                    mc_samples=CONV_MC,
                    mmse_samples=CONV_MMSE,
                    indices="0-5",
                    extend=True,
                    **kw,
                )
        name, mu, sigma = ROBUST
        ckpt = root / "models" / f"{name}.pt"
        train(
            "digits",
            "linear",
            epochs=5,
            seed=0,
            out=ckpt,
            show_progress=False,
            extra_loss=RobustLoss(sigma, mu, warmup_steps=20),
        )
        run_estimate(data="digits", model=ckpt, out=root / "results" / name, device="cpu", seed=0, show_progress=False, sigmas=SIGMAS,
                     methods=["mc"], mc_samples=MC_N, indices=f"0-{MAIN_POINTS - 1}")  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    (root / "complete").write_text("")
    return root


def raw(results: Results, label: str) -> pd.DataFrame:
    return results.by_label(label).table


def assert_figures(output) -> None:
    assert output.skipped is None, output.skipped
    assert output.figures, "no figure"
    for png in output.figures:
        assert png.suffix == ".png" and png.stat().st_size > 5_000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        svg = png.with_suffix(".svg")
        assert svg.stat().st_size > 5_000 and b"<svg" in svg.read_bytes()[:2000]
    csv = [f for f in output.files if f.suffix == ".csv"]
    assert csv and all(f.stat().st_size > 0 for f in csv)
    main = pd.read_csv(csv[0])
    assert len(main) == len(output.table)
