"""Execution plans: every Jacobian strategy, row count and memory format gives the same numbers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust import _user_model
from probust.execution import Execution, jacobian_plans
from probust.execution import tuning as _tuning
from probust.execution.engine import Inputs
from probust.linearisation import JacobianPlan
from probust.linearisation.margins import logit_jacobian
from probust.models import build
from tests.execution._clock import freeze_planning_clock

#: How far two execution plans (Jacobian strategy, rows per pass, memory format) move a float32
#: model's analytic p: float rounding of its passes. Measured at most 4.2e-7 on the CNN below on a
#: 2-core Xeon (AVX-512) and 7.7e-7 on a 2-core AMD EPYC, whose MKL rounds rows of small passes
#: differently (taylor, "vmap" at 1 row per pass against "loop" at 4; benchmarks/plan_agreement.py
#: measures every method and model, docs/estimate.md "Reproducibility" quotes it).
PLAN_ATOL = 1e-6


def _mlp(d: int, classes: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, classes)).eval()


@pytest.mark.parametrize("strategy", ["loop", "vmap", "forward"])
def test_every_jacobian_strategy_equals_autograd_functional(strategy):
    model = _mlp(6, 9, seed=0)
    x = torch.randn(5, 6)
    logits, jac = logit_jacobian(model, x, strategy=strategy)
    expected = torch.autograd.functional.jacobian(lambda v: model(v).sum(0), x).transpose(0, 1)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(jac, expected, rtol=1e-5, atol=1e-6)


def test_class_subsets_give_those_rows_of_the_jacobian():
    model = _mlp(6, 9, seed=1)
    x = torch.randn(4, 6)
    _, full = logit_jacobian(model, x, strategy="loop")
    subset = torch.tensor([2, 7])
    for strategy in ("loop", "vmap"):
        _, part = logit_jacobian(model, x, strategy=strategy, classes=subset)
        torch.testing.assert_close(part, full[:, subset], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_estimates_do_not_depend_on_jacobian_strategy_or_rows(method):
    torch.manual_seed(3)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(9, 1, 12, 12)
    sigma = 0.3
    reference = probust.estimate(model, x, sigma, method, execution=Execution(jacobian="loop", batch_size=4))
    for jacobian, rows in (("vmap", 1), ("vmap", None), ("auto", 7), ("auto", None)):
        got = probust.estimate(model, x, sigma, method, execution=Execution(jacobian=jacobian, batch_size=rows))
        torch.testing.assert_close(got, reference, rtol=0, atol=PLAN_ATOL)
    # Every gradient by forward mode (another source, the same numbers up to rounding).
    got = probust.estimate(model, x, sigma, method, gradients="forward", prune="off", execution=Execution(batch_size=5))
    torch.testing.assert_close(got, reference, rtol=0, atol=PLAN_ATOL)


def test_measured_plans_are_kept_per_model(monkeypatch):
    calls = _fake_timings(monkeypatch, 1e-4)  # a real clock on a loaded machine can leave a plan unfinished
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(300, 1, 12, 12)  # enough work to be worth measuring
    first = probust.Taylor(model, 0.2)(x).p
    measured = len(calls)
    assert measured > 0
    second = probust.Taylor(model, 0.2)(x).p  # a new estimator on the same model: no new timing
    assert len(calls) == measured
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_channels_last_hands_the_weights_back_untouched():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 28, 28)).eval()
    before = {name: (p, p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    x = torch.rand(3, 1, 28, 28)
    with _user_model.weights_in_format(model, True):
        assert any(p.is_contiguous(memory_format=torch.channels_last) and p.ndim == 4 for p in model.parameters())
        inside = model(_user_model.to_format(x, True))
    for name, p in model.named_parameters():
        assert p is before[name][0] and p.data_ptr() == before[name][1] and p.stride() == before[name][2]
    torch.testing.assert_close(inside, model(x), rtol=1e-5, atol=1e-5)


def test_monte_carlo_counts_do_not_depend_on_rows_or_memory_format(monkeypatch):
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 16, 16)).eval()
    x = torch.rand(5, 1, 16, 16)
    reference = probust.MonteCarlo(model, 0.2, n_samples=400, execution=Execution(batch_size=64))(x).p
    for rows, channels_last in ((7, False), (400, True), (1000, True)):
        monkeypatch.setattr(
            probust.MonteCarlo,
            "_forward_plan",
            lambda self, x, total, noise=None, r=rows, c=channels_last: _tuning.ForwardPlan(r, c),
        )
        got = probust.MonteCarlo(model, 0.2, n_samples=400)(x).p
        # Same noise; channels_last may move a logit by float rounding, so allow one flipped draw.
        torch.testing.assert_close(got, reference, rtol=0, atol=1 / 400 + 1e-12)


@pytest.mark.parametrize("strategy", ["loop", "vmap", "forward"])
def test_margin_jacobian_equals_differences_of_logit_gradients(strategy):
    from probust.linearisation.margins import margin_jacobian

    model = _mlp(6, 5, seed=2)
    x = torch.randn(7, 6)
    full = torch.autograd.functional.jacobian(lambda v: model(v).sum(0), x).transpose(0, 1)  # [B, C, d]
    for target in (None, torch.tensor([0, 1, 2, 3, 4, 0, 4])):
        logits, t, u = margin_jacobian(model, x, target, strategy=strategy)
        expected_t = model(x).argmax(1) if target is None else target
        assert torch.equal(t, expected_t)
        expected = full[torch.arange(7), expected_t][:, None] - full
        torch.testing.assert_close(u, expected, rtol=1e-5, atol=1e-6)
        assert (u[torch.arange(7), t] == 0).all()
    _, t, u = margin_jacobian(model, x, strategy=strategy)
    _, t, first_two = margin_jacobian(model, x, strategy=strategy, limit=2)
    others = torch.stack([torch.tensor([c for c in range(5) if c != int(b)]) for b in t])
    torch.testing.assert_close(first_two, u.gather(1, others[:, :2, None].expand(-1, -1, 6)), rtol=1e-5, atol=1e-6)


def test_plans_persist_on_disk_for_models_of_the_same_structure(monkeypatch, tmp_path):
    from probust.execution import plan_cache as _plan_cache

    monkeypatch.setenv("PROBUST_CACHE_DIR", str(tmp_path))
    calls = _fake_timings(monkeypatch, 1e-4)  # a real clock on a loaded machine can leave a plan unfinished
    x = torch.rand(300, 1, 12, 12)
    torch.manual_seed(0)
    first_model = build("cnn", 10, (1, 12, 12)).eval()
    probust.Taylor(first_model, 0.2)(x)
    assert calls and (tmp_path / "plans.json").is_file()
    measured = len(calls)
    # Another process would start with an empty memory: a model of the same structure (other
    # weights) finds the plan on disk and measures nothing.
    torch.manual_seed(1)
    second_model = build("cnn", 10, (1, 12, 12)).eval()
    _plan_cache.forget(second_model)
    probust.Taylor(second_model, 0.2)(x)
    assert len(calls) == measured
    # A different structure is measured anew.
    probust.Taylor(build("cnn", 7, (1, 12, 12)).eval(), 0.2)(x)
    assert len(calls) > measured
    # An unreadable cache is ignored, not an error.
    (tmp_path / "plans.json").write_text("{not json")
    probust.Taylor(build("cnn", 5, (1, 12, 12)).eval(), 0.2)(x)


def test_channels_last_can_be_fixed_either_way():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 16, 16)).eval()
    x = torch.rand(6, 1, 16, 16)
    # sigma = 2: every p in (0.69, 0.81), so rounding in z reaches p (at 0.2 every p is 1.0).
    on = probust.Taylor(model, 2.0, execution=Execution(channels_last=True, jacobian="loop"))(x)
    off = probust.Taylor(model, 2.0, execution=Execution(channels_last=False, jacobian="loop"))(x)
    assert ((off.p > 0.5) & (off.p < 0.9)).all(), off.p
    torch.testing.assert_close(on.p, off.p, rtol=0, atol=PLAN_ATOL)  # measured 4.7e-8
    # z to float32 rounding: measured 2.3e-7 relative (two ulps)
    torch.testing.assert_close(on.z, off.z, rtol=5e-7, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="channels_last"):
        probust.Taylor(model, 0.2, execution=Execution(channels_last="yes"))


def _fake_timings(monkeypatch, seconds: float) -> list[tuple]:
    """Every timed call takes ``seconds`` (no pass runs) and the planning allowance's clock
    stands still (the machine's load changes nothing); returns the log of what was timed."""
    timed: list[tuple] = []

    def fake(run, device):
        timed.append(run)
        return seconds

    monkeypatch.setattr(_tuning, "_seconds", fake)
    freeze_planning_clock(monkeypatch)
    return timed


def _plan(model: nn.Module, x: torch.Tensor, total_rows: int) -> JacobianPlan:
    return jacobian_plans.plan_jacobian(
        model, Inputs.of(x, len(x)), 10, budget=2**30, total_rows=total_rows, run=lambda plan, rows, k: None, passes=9
    )


def test_a_call_too_small_to_repay_every_timing_gets_the_default_plan_and_times_nothing(monkeypatch):
    model, x = _mlp(6, 10, seed=0), torch.randn(8, 6)
    timed = _fake_timings(monkeypatch, 0.01)
    # 50 rows x 9 passes: less than ten times what timing the three candidates would cost.
    plan = _plan(model, x, 50)
    assert timed == [] and (plan.strategy, plan.channels_last) == ("loop", False)
    assert not _tuning.plan_cache._MEMORY.holds(model)  # not kept: a larger call may measure them all


def test_a_call_large_enough_times_every_candidate_and_keeps_the_plan(monkeypatch):
    model, x = _mlp(12, 10, seed=0), torch.randn(8, 12)
    monkeypatch.setattr(_tuning, "torch_func_startup", lambda: 0.0)  # torch.func already imported
    timed = _fake_timings(monkeypatch, 1e-5)
    plan = _plan(model, x, 10_000)
    assert len(timed) == 2  # loop and vmap (12 inputs, 10 classes: no forward mode)
    assert _tuning.plan_cache._MEMORY.holds(model)
    again = _plan(model, x, 10_000)
    assert again == plan and len(timed) == 2  # kept: nothing timed again


@pytest.mark.parametrize(("vmap_share", "chosen"), [(0.8, "loop"), (0.5, "vmap")])
def test_on_a_cpu_vmap_is_chosen_only_where_it_wins_the_trial_clearly(monkeypatch, vmap_share, chosen):
    # The trial (4 rows, 2 margins) flatters vmap on a CPU: ResNet18's vmap / loop was 1.0 there
    # and 1.8 at the plan's 32 rows. A 20% win on the trial keeps the loop; a 2x win takes vmap.
    model, x = _mlp(12, 10, seed=0), torch.randn(8, 12)
    monkeypatch.setattr(_tuning, "torch_func_startup", lambda: 0.0)
    strategies: list[str] = []

    def fake(run, device):
        run()
        return {"loop": 1e-5, "vmap": vmap_share * 1e-5}[strategies[-1]]

    monkeypatch.setattr(_tuning, "_seconds", fake)
    plan = jacobian_plans.plan_jacobian(
        model,
        Inputs.of(x, len(x)),
        10,
        budget=2**30,
        total_rows=10_000,
        run=lambda plan, rows, k: strategies.append(plan.strategy),
        passes=9,
    )
    assert sorted(set(strategies)) == ["loop", "vmap"] and plan.strategy == chosen


@pytest.mark.parametrize(("inputs", "forward"), [(4, True), (7, False)])
def test_forward_mode_is_chosen_by_counts_and_never_timed(monkeypatch, inputs, forward):
    """Forward mode computes the gradients another way (a different route), so "auto" takes it by
    counts alone, at the door (:meth:`probust.execution.Execution.jacobian_plan`): D probes at the
    declared cost (1.5 pulls on a CPU) against C - 1 pulls. 4 x 1.5 < 9 takes it without timing a
    thing; 7 x 1.5 >= 9 times loop and vmap only."""
    model, x = _mlp(inputs, 10, seed=0), torch.randn(8, inputs)
    monkeypatch.setattr(_tuning, "torch_func_startup", lambda: 0.0)
    timed = _fake_timings(monkeypatch, 1e-5)
    execution = probust.execution.Execution(memory_budget=2**30)
    plan = execution.jacobian_plan(model, x, 10_000, run=lambda plan, rows, k: None, passes=9)
    if forward:
        assert plan.strategy == "forward" and timed == []
    else:
        assert plan.strategy in ("loop", "vmap") and len(timed) == 2


def test_vmap_is_timed_only_where_torch_funcs_start_up_fits_the_allowance(monkeypatch):
    """torch.func's first call imports torch._dynamo (about 1.6 s here), vmap's as much as
    forward mode's: a first call too small to repay it keeps the loop and times nothing more."""
    model, x = _mlp(12, 10, seed=0), torch.randn(8, 12)  # 12 inputs > 10 classes: loop and vmap only
    monkeypatch.setattr(_tuning, "torch_func_startup", lambda: 2.0)
    timed = _fake_timings(monkeypatch, 1e-3)
    plan = _plan(model, x, 2_000)
    assert len(timed) == 1 and plan.strategy == "loop" and not _tuning.plan_cache._MEMORY.holds(model)
    monkeypatch.setattr(_tuning, "torch_func_startup", lambda: 0.0)
    _tuning._FIRST_TIMINGS.forget(model)
    timed.clear()
    _plan(model, x, 2_000)
    assert len(timed) == 2  # loop and vmap


def test_torch_func_start_up_is_what_a_fresh_process_pays_before_its_first_vmap():
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from probust.execution.tuning import torch_func_startup\n"
        "before = torch_func_startup()\n"
        "m = torch.nn.Linear(3, 2)\n"
        "out, pull = torch.func.vjp(m, torch.ones(1, 3))\n"
        "torch.func.vmap(pull)(torch.eye(2).unsqueeze(1))\n"
        "print(before > 0, torch_func_startup() == 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_the_forward_plan_times_both_formats_or_neither(monkeypatch):
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(8, 1, 12, 12)
    timed = _fake_timings(monkeypatch, 0.05)  # 64 rows in 50 ms
    plan = _tuning.plan_forward(model, Inputs.of(x, len(x)), budget=2**30, total_rows=3_000)
    assert timed == [] and plan.channels_last is False  # too small to time both formats: the default
    timed.clear()
    _tuning.plan_forward(model, Inputs.of(x, len(x)), budget=2**30, total_rows=200_000)
    assert len(timed) >= 2  # both formats, then as much of the rows ladder as the allowance pays
