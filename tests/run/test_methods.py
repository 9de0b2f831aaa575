"""What the runner asks of each method: the grid's sample counts and the estimator's keyword arguments."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import probust
from probust.execution import Execution
from probust.run import DEFAULT_METHODS, Task, methods
from probust.run.methods import make_task_estimator, sample_kind, tasks, uses_mmse_samples


def test_the_default_methods_are_the_papers_six():
    assert DEFAULT_METHODS == ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax")


def test_each_method_takes_its_own_sample_counts():
    assert {m: sample_kind(m) for m in probust.METHODS} == {
        "mc": "mc",
        "mc_cv": "mc",
        "mc_is": "mc",
        "mmse": "mmse",
        "mmse_mvs": "mmse",
        "taylor": None,
        "taylor_mvs": None,
        "softmax": None,
    }
    assert [m for m in probust.METHODS if uses_mmse_samples(m)] == [
        m for m in probust.METHODS if m in ("mmse", "mmse_mvs", "mc_cv", "mc_is")
    ]
    grid = tasks([0.1, 0.2], ["mc", "mmse", "softmax"], [10, 20], [3])
    assert [t.key for t in grid] == [
        (s, m, n) for s in (0.1, 0.2) for m, n in (("mc", 10), ("mc", 20), ("mmse", 3), ("softmax", 0))
    ]


PLAN = dict(
    seed=3,
    memory_budget="1GB",
    channels_last=None,
    batch_size=None,
    jacobian="vmap",
    temperature=2.0,
    confidence=0.9,
    interval="wilson",
    tol=1e-3,
    linearisation_samples=4,
    sampling="iid",
    p_fail=False,
    target_half_width=None,
    prune="off",
    gradients="auto",
    check_draws=None,
    model="MODEL",
    noise=None,
)
BASE = {"seed": 3, "memory_budget": "1GB"}
EXECUTION_FIELDS = {f.name for f in dataclasses.fields(Execution)}


def _plan(values: dict) -> SimpleNamespace:
    """A stand-in PreparedRun: the values as its own attributes and as its settings'."""
    return SimpleNamespace(**values, settings=SimpleNamespace(**values))


@pytest.mark.parametrize(
    ("method", "plan", "expected"),
    [
        ("mc", {}, {**BASE, "n_samples": 50, "confidence": 0.9, "interval": "wilson"}),
        # check_draws reaches the linearised methods only, 0 (no check) included.
        ("mc", {"check_draws": 12}, {**BASE, "n_samples": 50, "confidence": 0.9, "interval": "wilson"}),
        (
            "taylor",
            {"check_draws": 0},
            {**BASE, "jacobian": "vmap", "tol": 1e-3, "prune": "off", "gradients": "auto", "check_draws": 0},
        ),
        (
            "mc",
            {"target_half_width": 0.01},
            {**BASE, "n_samples": 50, "confidence": 0.9, "interval": "wilson", "target_half_width": 0.01},
        ),
        (
            "mc_cv",
            {"target_half_width": 0.01, "p_fail": True},
            {
                **BASE,
                "jacobian": "vmap",
                "n_samples": 50,
                "confidence": 0.9,
                "tol": 1e-3,
                "mmse_samples": 4,
                "target_half_width": 0.01,
            },
        ),
        (
            "mc_is",
            {"target_half_width": 0.01},
            {**BASE, "jacobian": "vmap", "n_samples": 50, "confidence": 0.9, "tol": 1e-3, "mmse_samples": 4},
        ),
        (
            "taylor",
            {"p_fail": True},
            {**BASE, "jacobian": "vmap", "tol": 1e-3, "p_fail": True, "prune": "off", "gradients": "auto"},
        ),
        ("taylor_mvs", {"gradients": "direct"}, {**BASE, "jacobian": "vmap", "tol": 1e-3, "gradients": "direct"}),
        (
            "mmse",
            {"prune": "spectral"},
            {
                **BASE,
                "jacobian": "vmap",
                "n_samples": 50,
                "tol": 1e-3,
                "sampling": "iid",
                "prune": "spectral",
                "gradients": "auto",
            },
        ),
        (
            "mmse_mvs",
            {"batch_size": 8, "channels_last": False},
            {
                **BASE,
                "channels_last": False,
                "batch_size": 8,
                "jacobian": "vmap",
                "n_samples": 50,
                "tol": 1e-3,
                "sampling": "iid",
                "gradients": "auto",
            },
        ),
        ("softmax", {"p_fail": True, "target_half_width": 0.01}, {**BASE, "temperature": 2.0}),
    ],
)
def test_the_estimator_gets_the_settings_its_method_uses(monkeypatch, method, plan, expected):
    calls = []
    monkeypatch.setattr(methods, "make_estimator", lambda *args, **kwargs: calls.append((args, kwargs)))
    make_task_estimator(_plan({**PLAN, **plan}), Task(0.25, method, 50))
    ((args, kwargs),) = calls
    assert args == (method, "MODEL", None if method == "softmax" else 0.25)
    # The settings of how the work runs arrive as one Execution.
    how = {key: value for key, value in expected.items() if key in EXECUTION_FIELDS}
    what = {key: value for key, value in expected.items() if key not in EXECUTION_FIELDS}
    assert kwargs == {**what, "execution": Execution(**how)}


def test_a_run_noise_reaches_the_estimator_as_its_noise_object_and_the_default_as_the_number(monkeypatch):
    import torch

    from probust.noise import Gaussian, Laplace
    from probust.run.noise_options import NoiseSetting

    calls = []
    monkeypatch.setattr(methods, "make_estimator", lambda *args, **kwargs: calls.append(args))
    multiplier = torch.tensor([1.0, 2.0, 0.5])
    for setting in (NoiseSetting(), NoiseSetting("laplace"), NoiseSetting(std=multiplier)):
        make_task_estimator(_plan({**PLAN, "noise": setting}), Task(0.25, "mc", 50))
    default, laplace, diagonal = (args[2] for args in calls)
    assert default == 0.25 and type(default) is float
    assert isinstance(laplace, Laplace) and laplace.sigma == 0.25
    assert isinstance(diagonal, Gaussian) and torch.equal(diagonal.std, 0.25 * multiplier)
