"""The GPU suite: every estimator on CUDA against the CPU, bitwise repetition on one GPU, CUDA memory
budgets, the execution plans chosen there, the runtime experiment's CUDA timing and a 2-rank nccl
torchrun against one process.

Run it with ``pytest -m cuda`` (``make test-cuda``) on a machine with a CUDA device; without one every
test here is collected and skipped. ``PROBUST_TEST_DEVICE=cpu pytest -m cuda`` runs the same tests
with the CPU standing in for the GPU (the CPU against itself, the CUDA-only checks skipped): a check
of the suite's own code on a machine without a GPU, not of CUDA.

Oracles: the CPU computation of the same estimator on the same points (its numbers are checked
against closed forms and long Monte Carlo elsewhere), ``torch.cuda.mem_get_info`` and the CUDA
allocator's peak, and the single-process table. The tolerances are the documented ones
(docs/estimate.md, "What probust guarantees"): the analytic maps move by float32 rounding between
kinds of device (a few 1e-7; 2e-6 allowed) plus, for the mvn-cdf, each side's own ``cdf_error``;
Monte Carlo counts stay the same (the noise is counter-based, the same integers on every device)
except for a copy within rounding of a boundary (2 copies allowed per point); mc_cv and mc_is within
their own intervals' half-width. On one GPU with the same plan everything is bitwise identical.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import probust
from probust.execution import Execution
from probust.execution.budget import DEFAULT_FRACTION, peak_memory, resolve_budget, row_cost, rows_within
from probust.execution.engine import FORWARD_MODE_ROWS, Inputs
from probust.execution.plans import jacobian_row_bytes, plan_forward, plan_jacobian
from probust.linearisation import counting as cost_model
from tests._helpers import TinyCNN, linear_model, points_near_boundaries

DEVICE = torch.device(os.environ.get("PROBUST_TEST_DEVICE", "cuda"))
ON_CUDA = DEVICE.type == "cuda"
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="no CUDA device (pytest -m cuda on a GPU)"),
]
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="checks CUDA itself (PROBUST_TEST_DEVICE is not cuda)")
REPO = Path(__file__).resolve().parents[2]
SIGMA = 0.5
ROUNDING = 2e-6  # float32 margins and logits computed by other kernels: a few 1e-7 in p
MC_COPIES = 2  # noisy copies per point whose prediction may flip by rounding between devices
N_MC = 2000
PINNED = {"batch_size": 64}  # rows per pass fixed: a plan measured on each side may differ


def _models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """A linear model (10 classes) on R^20 and a small CNN with BatchNorm and Dropout (5 classes),
    each with 8 points whose p spreads over (0, 1) at SIGMA."""
    linear = linear_model(20, 10, seed=3)
    cnn = TinyCNN(classes=5, seed=1)
    x_cnn = torch.randn(8, 1, 8, 8, generator=torch.Generator().manual_seed(2)) * 0.4
    return {"linear": (linear, points_near_boundaries(linear, 8, SIGMA)), "cnn": (cnn.eval(), x_cnn)}


def _estimator(method: str, model: nn.Module, **kwargs) -> probust.Estimator:
    samples = {"mc": N_MC, "mc_cv": 400, "mc_is": 400, "mmse": 4, "mmse_mvs": 4}.get(method)
    sigma = None if method == "softmax" else SIGMA
    how = {} if method in ("softmax",) else dict(PINNED)
    if method in ("taylor", "mmse", "taylor_mvs", "mmse_mvs", "mc_cv", "mc_is"):
        how["jacobian"] = "loop"
    return probust.make_estimator(method, model, sigma, n_samples=samples, execution=Execution(**how), **kwargs)


def _on(device: torch.device, method: str, model: nn.Module, x: torch.Tensor, target: torch.Tensor):
    moved = model.to(device)
    try:
        return _estimator(method, moved)(x.to(device), target.to(device)).cpu()
    finally:
        model.to("cpu")


def _half_width(r) -> torch.Tensor:
    return (r.ci_high - r.ci_low) / 2


@pytest.mark.parametrize("method", list(probust.METHODS))
@pytest.mark.parametrize("kind", ["linear", "cnn"])
def test_every_estimator_on_cuda_agrees_with_the_cpu_within_the_stated_tolerance(kind, method):
    model, x = _models()[kind]
    with torch.no_grad():
        target = model(x).argmax(1)
    cpu = _on(torch.device("cpu"), method, model, x, target)
    gpu = _on(DEVICE, method, model, x, target)
    assert torch.equal(gpu.target, cpu.target)
    diff = (gpu.p - cpu.p).abs()
    if method == "mc":
        assert (diff * N_MC <= MC_COPIES).all(), (diff * N_MC, cpu.p)
    elif method in ("taylor", "mmse"):
        assert (diff <= cpu.cdf_error + gpu.cdf_error + ROUNDING).all(), (diff, cpu.cdf_error, gpu.cdf_error)
    elif method in ("mc_cv", "mc_is"):
        assert (diff <= torch.maximum(_half_width(cpu), _half_width(gpu))).all(), (diff, _half_width(cpu))
    else:  # softmax, taylor_mvs, mmse_mvs: closed forms of float32 quantities
        assert (diff <= ROUNDING).all(), diff
    assert ((cpu.p > 0.02) & (cpu.p < 0.98)).any() or method == "softmax", "points should not all be trivial"


@cuda_only
def test_sums_into_slots_are_the_cpus_sequential_sums_on_cuda():
    # MMSE averages each point's copies and the mvn-cdf sums split terms by index: index_add on
    # CUDA adds by atomics in any order, probust.mvn.add_rows in the rows' order.
    from probust.mvn import add_rows

    gen = torch.Generator().manual_seed(0)
    index = torch.randint(0, 7, (300,), generator=gen)
    values = torch.randn(300, 5, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(
        -8, 9, (300, 5), generator=gen
    )
    for dtype in (torch.float64, torch.float32):
        want = torch.zeros(7, 5, dtype=dtype).index_add_(0, index, values.to(dtype))
        got = [
            add_rows(torch.zeros(7, 5, dtype=dtype, device=DEVICE), index.to(DEVICE), values.to(DEVICE, dtype)).cpu()
            for _ in range(3)
        ]
        assert all(torch.equal(g, want) for g in got), dtype


@pytest.mark.parametrize("method", list(probust.METHODS))
def test_estimates_are_bitwise_reproducible_on_the_same_gpu(method):
    # The same call twice: bitwise (docs/estimate.md: the same device, torch build and plan; the
    # plan is pinned here). Split into two batches, the Monte Carlo counts are bitwise too; the
    # other methods' float32 passes over batches of other shapes round differently (docs: the same
    # --unit-size is needed), which the batch-split tests of the execution plans cover.
    model, x = _models()["cnn"]
    with torch.no_grad():
        target = model(x).argmax(1)
    model = model.to(DEVICE)
    try:
        xd, td = x.to(DEVICE), target.to(DEVICE)
        first = _estimator(method, model)(xd, td).cpu()
        again = _estimator(method, model)(xd, td).cpu()
        head = _estimator(method, model)(xd[:3], td[:3]).cpu()
        tail = _estimator(method, model)(xd[3:], td[3:], index_offset=3).cpu()
    finally:
        model.to("cpu")
    assert torch.equal(first.p, again.p)
    if method == "mc":
        assert torch.equal(torch.cat([head.p, tail.p]), first.p)
    for name in ("cdf_error", "ci_low", "ci_high", "p_fail"):
        a, b = getattr(first, name), getattr(again, name)
        assert (a is None and b is None) or torch.equal(a, b), name


def test_routes_take_the_declared_figures_of_their_device_kind():
    # The screenings' share and the sketch's rows per forward-mode pass are declared per device kind
    # (CUDA: 0.2 and 512, the CPU: 0.5 and 8; docs/performance.md, "On a GPU"). A 1,000-class model
    # with a narrow head routes, and its context carries the figures of the device it runs on.
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 1000)
    )
    model = model.to(DEVICE).eval()
    x = torch.randn(4, 3, 16, 16, device=DEVICE)
    ctx = probust.Taylor(model, 0.1).route_context(x)
    assert ctx is not None
    assert ctx.share == cost_model.SCREENING_SHARE[DEVICE.type]
    # A tiny model: the budget holds the device's rows, so they are the plan's raised to them.
    assert ctx.probe_rows == max(ctx.plan.rows, FORWARD_MODE_ROWS[DEVICE.type])
    if ON_CUDA:
        assert ctx.share < cost_model.SCREENING_SHARE["cpu"]
        assert FORWARD_MODE_ROWS["cuda"] > FORWARD_MODE_ROWS["cpu"]


@cuda_only
def test_default_memory_budget_is_half_of_cuda_free_memory():
    # Free memory moves as the allocator works: half of a value read just before or just after.
    before, total = torch.cuda.mem_get_info(DEVICE)
    budget = resolve_budget(None, DEVICE)
    after, _ = torch.cuda.mem_get_info(DEVICE)
    slack = 0.01 * total
    assert DEFAULT_FRACTION * min(before, after) - slack <= budget <= DEFAULT_FRACTION * max(before, after) + slack


@cuda_only
def test_mmse_on_resnet18_inputs_stays_under_a_cuda_memory_budget():
    # The allocator's peak during the call (probust.execution.budget.peak_memory on CUDA).
    from probust.models import build

    torch.manual_seed(0)
    model = build("resnet18", 10, (3, 32, 32)).eval().to(DEVICE)
    x = torch.rand(6, 3, 32, 32, device=DEVICE)
    budget = 256 * 2**20
    est = probust.MMSE(model, 0.1, n_samples=5, execution=Execution(memory_budget=budget))
    with peak_memory(DEVICE) as peak:
        r = est(x)
    assert torch.isfinite(r.p).all()
    assert peak.bytes is not None and 0 < peak.bytes <= budget, peak.bytes


def test_plans_declared_on_the_gpu_fit_the_budget_and_take_vmap():
    # Declared plans (rows per pass, Jacobian strategy, memory format) on the device: within the
    # budget, the same on a second call, vmap by default on a GPU (one vectorised pass).
    model = TinyCNN(classes=5, seed=1).eval().to(DEVICE)
    x = torch.rand(16, 1, 8, 8, device=DEVICE)
    budget = 64 * 2**20
    inputs = Inputs.of(x)
    cost = row_cost(model, inputs)
    forward = plan_forward(model, inputs, budget=budget)
    assert 1 <= forward.rows <= rows_within(budget, cost.inference, what="one forward pass")
    assert plan_forward(model, inputs, budget=budget) == forward
    jac = plan_jacobian(model, inputs, 5, budget=budget, total_rows=5000)
    assert jac.strategy == ("vmap" if ON_CUDA else "loop")
    assert jac.rows * jacobian_row_bytes(cost, jac.strategy, 5, jac.class_chunk) <= budget
    assert plan_jacobian(model, inputs, 5, budget=budget, total_rows=5000) == jac
    # The estimates under the declared plans agree with a pinned plan to rounding.
    target = torch.zeros(16, dtype=torch.long, device=DEVICE)
    measured = probust.Taylor(model, SIGMA, execution=Execution(memory_budget=budget))(x, target).p
    pinned = probust.Taylor(model, SIGMA, execution=Execution(memory_budget=budget, jacobian="loop", batch_size=16))(
        x, target
    ).p
    torch.testing.assert_close(measured, pinned, rtol=0, atol=ROUNDING)


def test_runtime_experiment_times_estimators_on_the_device():
    # Experiment 3 synchronises the device around each timed call: the timings are real, and its
    # peak memory is the CUDA allocator's.
    from probust.experiments.runtime import measure

    model, x = _models()["cnn"]
    model = model.to(DEVICE)
    try:
        t = measure(model, x.to(DEVICE), SIGMA, mc_counts=[50], mmse_counts=[2], methods=["mc", "taylor", "softmax"])
    finally:
        model.to("cpu")
    assert set(t["method"]) == {"mc", "taylor", "softmax"}
    assert (t["seconds"] > 0).all() and np.isfinite(t["peak_mb"]).all() and (t["peak_mb"] >= 0).all()
    assert t["mean_p"].between(0, 1).all()


ARGS = [
    "--data",
    "digits",
    "--methods",
    "mc",
    "taylor",
    "mmse",
    "mc_cv",
    "taylor_mvs",
    "mmse_mvs",
    "softmax",
    "--sigma",
    "0.1",
    "0.3",
    "--p-fail",
    "--mc-samples",
    "200",
    "--mmse-samples",
    "3",
    "--limit",
    "24",
    "--unit-size",
    "4",
    "--batch-size",
    "64",
    "--jacobian",
    "loop",
    "--quiet",
]


@cuda_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl needs a GPU per rank: 2 GPUs")
def test_two_nccl_ranks_give_the_single_process_table(tmp_path):
    # torchrun on two GPUs (nccl, each rank on cuda:LOCAL_RANK) against one process on cuda:0,
    # the plan pinned: the same kind of device, so the same table bit for bit (docs/estimate.md).
    from probust import models
    from probust.cli import main
    from probust.run.reading import read_config, read_results

    torch.manual_seed(0)
    model = models.save_checkpoint(tmp_path / "cnn.pt", models.build("cnn", 10, (1, 8, 8)), {"dataset": "digits"})
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    out = tmp_path / "two"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:0",
            "--max-restarts",
            "0",
            "-m",
            "probust",
            "estimate",
            *ARGS,
            "--device",
            "cuda",
            "--model",
            str(model),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    history = read_config(out)["history"][-1]
    assert history["world_size"] == 2
    assert main(["estimate", *ARGS, "--device", "cuda:0", "--model", str(model), "--out", str(tmp_path / "one")]) == 0
    one = read_results(tmp_path / "one").drop(columns="seconds")
    two = read_results(out).drop(columns="seconds")
    assert len(two) == 24 * 2 * 7
    assert two.equals(one)
