"""Helpers shared by test files (test files never import each other; import as
``from tests._helpers import ...``).

- Small models whose exact p_robust is known, and test points (the estimators' tests).
- ``build_results`` trains tiny models on scikit-learn's digits (a linear model at lambda 0 and
  0.05, a small CNN, and the linear model with a RobustLoss) and scores them with the
  estimators, for the experiments and the report; nothing is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import probust
from probust.data import ImageDataset
from probust.experiments.runs import Results

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


# Installed in a child interpreter before anything else: the packages named cannot be imported,
# as if they were not installed (they are, in the suite's venv).
HIDE_PACKAGES = """
import importlib.abc, sys
HIDDEN = {hidden!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def child_without(
    code: str, hidden: Iterable[str], *, cwd: Path, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a child interpreter in which the ``hidden`` top-level packages
    cannot be imported; its output is captured as text."""
    source = HIDE_PACKAGES.format(hidden=set(hidden)) + textwrap.dedent(code)  # a set: a child may show one again
    return subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def save_tiny_vit(folder: Path, *, image_size: int = 8, num_channels: int = 3) -> nn.Module:
    """A randomly initialised (seed 0) 3-class Hugging Face ViT saved with ``save_pretrained`` in
    ``folder`` and no image processor; returns it in eval mode (skips without transformers)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=image_size,
        patch_size=image_size // 2,
        num_channels=num_channels,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(folder)
    return model


def require_fashion_mnist() -> Path:
    """The real Fashion-MNIST folder, for the tests on a trained network. Where it is missing the
    test skips, except where PROBUST_REQUIRE_FASHION_MNIST=1 (set by .ci/run): there it fails,
    so that CI cannot go green with those tests silently skipped."""
    missing = [name for name in FASHION_MNIST_FILES if not (FASHION_MNIST_DIR / name).is_file()]
    if missing:
        message = f"Fashion-MNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)"
        if os.environ.get("PROBUST_REQUIRE_FASHION_MNIST") == "1":
            pytest.fail(message + f"; missing {', '.join(missing)} and PROBUST_REQUIRE_FASHION_MNIST=1")
        pytest.skip(message)
    return FASHION_MNIST_DIR


def intel_cpu() -> bool:
    """Whether this machine's CPU is Intel's: MKL's strict mode makes a row of a matrix product
    the same bits whatever the rows of the call there, and only there (an AMD EPYC still rounds
    rows of passes of 1 to 9 rows differently; tests/test_reproducible_products.py)."""
    try:
        with open("/proc/cpuinfo") as info:
            return "GenuineIntel" in info.read()
    except OSError:
        return False


def tiny_data(n: int = 20, seed: int = 0) -> ImageDataset:
    """``n`` random 1 x 4 x 4 uint8 images of 3 classes named a, b, c (the runner's tests' data)."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, 4, 4), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 3, (n,), generator=gen)
    return ImageDataset(images, labels, name="tiny", split="test", classes=["a", "b", "c"])


def tiny_model(classes: int = 3, seed: int = 0) -> nn.Module:
    """A small MLP from [B, 1, 4, 4] to ``classes`` logits (the runner's tests' model)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, classes))


def linear_model(d: int, classes: int, seed: int = 0) -> nn.Linear:
    """A random linear classifier on R^d (its decision boundaries are exactly linear)."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Linear(d, classes)
    with torch.no_grad():
        model.weight.copy_(torch.randn(classes, d, generator=gen))
        model.bias.copy_(torch.randn(classes, generator=gen))
    return model


def points_near_boundaries(model: nn.Linear, n: int, sigma: float, seed: int = 1) -> torch.Tensor:
    """Points whose p_robust is spread over (0, 1) at this sigma: small-norm inputs."""
    gen = torch.Generator().manual_seed(seed)
    d = model.in_features
    return torch.randn(n, d, generator=gen) * (sigma * 0.6)


def inside(p: torch.Tensor, mc: probust.Estimate, slack: float = 0.0) -> torch.Tensor:
    """Which of ``p`` lie in the Monte Carlo estimate's interval, widened by ``slack``."""
    return (p >= mc.ci_low - slack) & (p <= mc.ci_high + slack)


class NonFiniteAbove(nn.Module):
    """``inner``'s logits, except that logit 1 is ``value`` (NaN, inf or -inf) on every row whose
    coordinate 0 exceeds ``threshold``: only the noisy copies that cross it fail.

    ``nonfinite`` counts the rows it made non-finite in passes without autograd (the noisy copies
    of Monte Carlo; a linearisation's Jacobian passes run with autograd and are not counted)."""

    def __init__(self, inner: nn.Module, threshold: float, value: float) -> None:
        super().__init__()
        self.inner = inner
        self.threshold = threshold
        self.value = value
        self.nonfinite = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.inner(x)
        over = x[:, 0] > self.threshold
        if not torch.is_grad_enabled():
            self.nonfinite += int(over.sum())
        column = torch.arange(logits.shape[1], device=x.device) == 1
        return torch.where(over[:, None] & column, self.value, logits)


class TinyCNN(nn.Module):
    """A convolutional classifier on [B, 1, 8, 8] with a BatchNorm and a Dropout (train mode differs
    from eval mode), ``classes`` logits, and non-trivial BatchNorm running statistics."""

    def __init__(self, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(4 * 8 * 8, classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if p.ndim > 1 else 0.2))
            self.norm.running_mean.copy_(torch.randn(4, generator=gen) * 0.1)
            self.norm.running_var.copy_(torch.rand(4, generator=gen) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.tanh(self.norm(self.conv(x))))
        return self.head(h.flatten(1))


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
    from probust.run import run_estimate
    from probust.training import RobustLoss, train

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
        run_estimate(
            data="digits",
            model=ckpt,
            out=root / "results" / name,
            device="cpu",
            seed=0,
            show_progress=False,
            sigmas=SIGMAS,
            methods=["mc"],
            mc_samples=MC_N,
            indices=f"0-{MAIN_POINTS - 1}",
        )
        # A probust certify folder of the CNN (experiment 12), with the Taylor radius estimate.
        from probust.run.certify import CertifySettings, run_certify

        run_certify(
            CertifySettings(
                data="digits",
                model=root / "models" / "cnn-0.pt",
                out=root / "results" / "certify-cnn-0",
                device="cpu",
                show_progress=False,
                sigmas=[0.1, 0.3],
                n0=16,
                n=256,
                radii=[0.0, 0.25, 0.5],
                estimate="taylor",
                indices="0-19",
            )
        )
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


class Tempered(nn.Module):
    """A model's logits divided by 2 after its last layer: no linear head to take gradients through."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) / 2.0


class OldStyleSquare(torch.autograd.Function):
    """x * x without ``setup_context``: torch.func cannot transform it, plain autograd can."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad
