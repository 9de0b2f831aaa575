"""The estimator contract, proved for every method in :data:`probust.estimators.REGISTRY`.

A newly registered method joins every test here automatically. Each test builds its estimator
through :func:`probust.make_estimator` with small settings (a pinned plan: ``batch_size``,
``memory_budget``, ``channels_last``, the Jacobian strategy) on two small models: a linear
classifier (C = 10) and a tiny CNN with a BatchNorm and a Dropout on 8x8 inputs (C = 3).

The properties (docs/design.md, "Conventions"): the numbers do not depend on how the points are
batched (exactly: same bits, at one thread and at the user's thread count; these two models
compute a row the same whatever else its pass holds, which a float32 CPU matrix product of other
shapes does not promise, see docs/estimate.md "Reproducibility"); a point's random stream depends on (seed, its index) only; the
same seed gives the same numbers; the model is computed in eval mode and given back in its own
modes; every bad argument fails before any work with an error that names it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import probust
from probust.errors import OptionError
from probust.estimators import (
    REGISTRY,
    Estimate,
    MethodSpec,
    make_estimator,
    method_spec,
)
from probust.execution import Execution
from tests._helpers import TinyCNN, linear_model, points_near_boundaries

METHODS = list(REGISTRY)
POINTS = 6
# Where a batch of POINTS points is cut in two. Each part keeps at least two rows: a pass of a
# single row may round differently inside the model itself (PyTorch computes a one-row Linear
# as a matrix-vector product), see test_a_batch_of_one_point_agrees_to_float_rounding.
SPLITS = (2, 4)
# Noisy rows per forward pass: 16 splits one point's draws over several passes, 128 groups
# several points in one pass (with 64 draws per point), so both of plan_blocks' cases are split.
BATCH_SIZES = (16, 128)


def _linear() -> tuple[nn.Module, Tensor, float]:
    model = linear_model(12, 10, seed=3)
    return model, points_near_boundaries(model, POINTS, 0.3), 0.3


def _cnn() -> tuple[nn.Module, Tensor, float]:
    # At sigma = 2 every point's p_robust is well inside (0, 1), so the noise matters.
    x = torch.randn(POINTS, 1, 8, 8, generator=torch.Generator().manual_seed(2)) * 0.5
    return TinyCNN(classes=3, seed=0).eval(), x, 2.0


MODELS = {"linear": _linear, "cnn": _cnn}


def small_settings(spec: MethodSpec, *, seed: int = 0, batch_size: int = 32, **how: Any) -> dict[str, Any]:
    """Few samples and a fixed execution plan (nothing measured), for any registered method;
    ``how`` changes the execution's settings."""
    fixed = dict(batch_size=batch_size, memory_budget="256MB", channels_last=False)
    if "jacobian" in spec.run_options:
        fixed["jacobian"] = "vmap"
    settings: dict[str, Any] = dict(seed=seed, execution=Execution(**(fixed | how)))
    if spec.samples == "mc":
        settings["n_samples"] = 64
    elif spec.samples == "mmse":
        settings["n_samples"] = 3
    if "tol" in spec.run_options:
        settings["tol"] = 1e-3
    if "mmse_samples" in spec.run_options:
        settings["mmse_samples"] = 3
    return settings


#: The settings of how the work runs (an Execution's), as keywords of :func:`build`.
EXECUTION_FIELDS = {f.name for f in dataclasses.fields(Execution)}


def build(name: str, model: nn.Module, sigma: float, **overrides: Any) -> probust.Estimator:
    spec = REGISTRY[name]
    how = {key: overrides.pop(key) for key in list(overrides) if key in EXECUTION_FIELDS}
    settings = small_settings(spec, seed=overrides.pop("seed", 0), **how)
    return make_estimator(name, model, sigma, **(settings | overrides))


def assert_same_estimate(a: Estimate, b: Estimate) -> None:
    """Every field identical: tensors bit for bit (same dtype, shape and values; NaN equals NaN)."""
    for field in dataclasses.fields(Estimate):
        u, v = getattr(a, field.name), getattr(b, field.name)
        if isinstance(u, Tensor) or isinstance(v, Tensor):
            assert isinstance(u, Tensor) and isinstance(v, Tensor), field.name
            assert u.dtype == v.dtype and u.shape == v.shape, (field.name, u.dtype, v.dtype, u.shape, v.shape)
            if u.is_floating_point():
                assert torch.equal(u.isnan(), v.isnan()), (field.name, u, v)
                u, v = torch.where(u.isnan(), 0.0, u), torch.where(v.isnan(), 0.0, v)
            assert torch.equal(u, v), (field.name, u, v)
        else:
            assert u == v, (field.name, u, v)


def rows(r: Estimate, index: slice) -> Estimate:
    """The estimate of some rows: every tensor field indexed along the batch."""
    values = {f.name: getattr(r, f.name) for f in dataclasses.fields(Estimate)}
    return Estimate(**{k: v[index] if isinstance(v, Tensor) else v for k, v in values.items()})


class CountCalls:
    """Counts the forward passes of a module (a forward pre-hook)."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, args: object) -> None:
        self.calls += 1


# ---------------------------------------------------------------- batching and random streams


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_estimate_does_not_depend_on_batch_split(name, model_name, batch_size):
    model, x, sigma = MODELS[model_name]()
    est = build(name, model, sigma, batch_size=batch_size)
    whole = est(x)
    for k in SPLITS:
        assert_same_estimate(whole, Estimate.cat([est(x[:k]), est(x[k:], index_offset=k)]))
    # the same with the target given: the least likely class of each point, not the prediction
    with torch.no_grad():
        target = model(x).argmin(1)
    whole = est(x, target)
    assert torch.equal(whole.target, target)
    for k in SPLITS:
        assert_same_estimate(whole, Estimate.cat([est(x[:k], target[:k]), est(x[k:], target[k:], index_offset=k)]))


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_a_points_estimate_depends_on_its_index_not_its_row(name, model_name):
    model, x, sigma = MODELS[model_name]()
    est = build(name, model, sigma)
    whole = est(x)
    for k in (1, 3, POINTS - 2):
        assert_same_estimate(rows(whole, slice(k, None)), est(x[k:], index_offset=k))


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_a_batch_of_one_point_agrees_to_float_rounding(name, model_name):
    # The random streams are the same; only the model's float32 arithmetic on a one-row pass may
    # differ in the last bits from the same row inside a larger pass.
    model, x, sigma = MODELS[model_name]()
    est = build(name, model, sigma)
    whole = est(x)
    for k in (0, 2, POINTS - 1):
        alone = est(x[k : k + 1], index_offset=k)
        assert torch.equal(alone.target, whole.target[k : k + 1])
        # measured at most 1.4e-7 (taylor, linear model); softmax 8.3e-8, the sampling methods 0
        torch.testing.assert_close(alone.p, whole.p[k : k + 1], rtol=0, atol=2e-7)


@pytest.fixture
def users_threads():
    """The thread count a user's process gets (torch's default: one per core), for the test and
    then the suite's one thread again (tests/conftest.py sets one thread for every test)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield torch.get_num_threads()
    torch.set_num_threads(previous)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_batch_splits_are_bitwise_at_the_users_thread_count(name, model_name, users_threads):
    # What test_estimate_does_not_depend_on_batch_split proves at one thread, with the threads a
    # user's process runs; and those threads change a sampled count nowhere, the analytic
    # numbers by float rounding at most (bitwise here; docs/estimate.md "Reproducibility").
    model, x, sigma = MODELS[model_name]()
    est = build(name, model, sigma, batch_size=16)
    whole = est(x)
    for k in SPLITS:
        assert_same_estimate(whole, Estimate.cat([est(x[:k]), est(x[k:], index_offset=k)]))
    torch.set_num_threads(1)
    alone = est(x)
    assert torch.equal(alone.target, whole.target)
    if name == "mc":
        assert_same_estimate(alone, whole)
    torch.testing.assert_close(alone.p, whole.p, rtol=0, atol=2e-7)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_the_same_seed_gives_the_same_estimate(name, model_name):
    model, x, sigma = MODELS[model_name]()
    a = build(name, model, sigma, seed=5)(x)
    b = build(name, model, sigma, seed=5)(x)
    assert_same_estimate(a, b)
    # and calling one estimator twice changes nothing either
    est = build(name, model, sigma, seed=5)
    assert_same_estimate(est(x), est(x))


@pytest.mark.parametrize("name", [n for n, spec in REGISTRY.items() if spec.samples in ("mc", "mmse")])
def test_a_different_seed_draws_different_noise(name):
    # On the (non-linear) CNN at sigma = 2 every point is far from p = 0 and 1, so new draws move p.
    model, x, sigma = _cnn()
    a = build(name, model, sigma, seed=0)(x).p
    b = build(name, model, sigma, seed=1)(x).p
    assert not torch.equal(a, b), (a, b)
    # and the stream is the point's index: the same rows at other indices draw other noise
    c = build(name, model, sigma, seed=0)(x, index_offset=1000).p
    assert not torch.equal(a, c), (a, c)


# ---------------------------------------------------------------- eval mode


@pytest.mark.parametrize("name", METHODS)
def test_model_is_computed_in_eval_mode_and_given_back_in_its_own_modes(name):
    model, x, sigma = _cnn()
    expected = build(name, model, sigma)(x)  # the model in eval mode
    model.train()
    model.head.eval()  # a mix of modes, each to be given back
    modes = [m.training for m in model.modules()]
    stats = [t.clone() for t in (model.norm.running_mean, model.norm.running_var, model.norm.num_batches_tracked)]
    got = build(name, model, sigma)(x)
    assert [m.training for m in model.modules()] == modes
    assert model.training and model.norm.training and model.drop.training and not model.head.training
    # BatchNorm in train mode would have updated its statistics, and Dropout would change the numbers
    for before, after in zip(stats, (model.norm.running_mean, model.norm.running_var, model.norm.num_batches_tracked)):
        assert torch.equal(before, after)
    assert_same_estimate(got, expected)


# ---------------------------------------------------------------- the output


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_output_is_one_probability_per_point_for_the_clean_prediction(name, model_name):
    model, x, sigma = MODELS[model_name]()
    spec = REGISTRY[name]
    est = build(name, model, sigma)
    assert isinstance(est, spec.estimator) and est.method == name
    r = est(x)
    assert isinstance(r, Estimate)
    assert r.method == name and len(r) == POINTS
    assert r.p.dtype == torch.float64 and r.p.shape == (POINTS,)
    assert ((r.p >= 0) & (r.p <= 1)).all(), r.p
    with torch.no_grad():
        prediction = model(x).argmax(1)
    assert r.target.dtype == torch.int64 and torch.equal(r.target, prediction)
    for field in dataclasses.fields(Estimate):  # every diagnostic is one row per point
        value = getattr(r, field.name)
        if isinstance(value, Tensor):
            assert value.shape[0] == POINTS, (field.name, value.shape)
    # the functional form is the same computation
    settings = small_settings(spec)
    assert torch.equal(probust.estimate(model, x, sigma, name, **settings), r.p)
    assert torch.equal(make_estimator(name, model, sigma, **settings)(x).p, r.p)


# ---------------------------------------------------------------- bad input

BAD_X = {
    "not-a-tensor": (lambda x: x.tolist(), TypeError),
    "one-dimensional": (lambda x: x[0], ValueError),
    "zero-dimensional": (lambda x: x[0, 0], ValueError),
    "empty": (lambda x: x[:0], ValueError),
    "integer": (lambda x: (x * 10).to(torch.int64), ValueError),
    "nan": (lambda x: x.clone().index_fill_(0, torch.tensor([2]), math.nan), ValueError),
    "inf": (lambda x: x.clone().index_fill_(0, torch.tensor([1]), math.inf), ValueError),
}


@pytest.mark.parametrize("case", list(BAD_X))
@pytest.mark.parametrize("name", METHODS)
def test_bad_x_is_refused_by_name_before_the_model_runs(name, case):
    model, x, sigma = _linear()
    est = build(name, model, sigma)
    bad, error = BAD_X[case]
    counter = CountCalls(model)
    with pytest.raises(error, match=r"^x: ") as info:
        est(bad(x))
    assert info.value.field == "x"  # type: ignore[attr-defined]  # a probust._inputs error
    assert counter.calls == 0


BAD_TARGET = {
    "too-short": lambda b: torch.zeros(b - 1, dtype=torch.int64),
    "too-long": lambda b: torch.zeros(b + 1, dtype=torch.int64),
    "0-dim": lambda b: torch.tensor(0),
    "2-dim": lambda b: torch.zeros(b, 1, dtype=torch.int64),
    "float": lambda b: torch.zeros(b),
    "negative": lambda b: torch.full((b,), -1),
    "too-large": lambda b: torch.full((b,), 10),  # the linear model has classes 0..9
}


@pytest.mark.parametrize("case", list(BAD_TARGET))
@pytest.mark.parametrize("name", METHODS)
def test_bad_target_is_refused_by_name(name, case):
    model, x, sigma = _linear()
    with pytest.raises(ValueError, match=r"^target: "):
        build(name, model, sigma)(x, BAD_TARGET[case](POINTS))


@pytest.mark.parametrize("name", METHODS)
def test_bad_index_offset_is_refused_by_name_before_the_model_runs(name):
    model, x, sigma = _linear()
    est = build(name, model, sigma)
    counter = CountCalls(model)
    for offset in (-1, True, 1.5, "3", None):
        with pytest.raises(ValueError, match=r"^index_offset: "):
            est(x, index_offset=offset)
    assert counter.calls == 0


# Each: the constructor argument, bad values, and the error's start.
BAD_SETTINGS = {
    "seed": (["0", 1.5, True, None], r"^seed: "),
    "batch_size": ([0, -4, 2.5, True, "8"], r"^batch_size: "),
    "memory_budget": (["lots", "2 parsecs", 0, -1, 0.5, math.nan, math.inf, True, [1]], r"^memory_budget: "),
    "channels_last": (["yes", 1, 0], r"^channels_last: "),
}


@pytest.mark.parametrize("setting", list(BAD_SETTINGS))
@pytest.mark.parametrize("name", METHODS)
def test_bad_execution_settings_are_refused_by_name_at_construction(name, setting):
    model, _, sigma = _linear()
    values, match = BAD_SETTINGS[setting]
    for value in values:
        with pytest.raises(OptionError, match=match) as error:  # a ValueError
            build(name, model, sigma, **{setting: value})
        assert error.value.field == setting


@pytest.mark.parametrize("name", [n for n, spec in REGISTRY.items() if spec.uses_noise])
def test_bad_sigma_is_refused_by_name(name):
    model, _, _ = _linear()
    bad = [0, -0.1, math.nan, math.inf, "a", True, None, torch.zeros(12), torch.full((12,), -0.1), torch.tensor(0.0)]
    for sigma in bad:
        with pytest.raises(ValueError, match=r"^sigma: "):
            build(name, model, sigma)
    with pytest.raises(TypeError, match="sigma"):
        make_estimator(name, model)  # type: ignore[call-arg]  # sigma is required


@pytest.mark.parametrize("name", [n for n, spec in REGISTRY.items() if not spec.uses_noise])
def test_methods_without_noise_take_sigma_none(name):
    model, x, _ = _linear()
    assert torch.equal(build(name, model, None)(x).p, build(name, model, 0.3)(x).p)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [n for n, spec in REGISTRY.items() if spec.samples is not None])
def test_bad_n_samples_is_refused_by_name(name):
    model, _, sigma = _linear()
    for n in (0, -5, 2.5, True, "64"):
        with pytest.raises(ValueError, match=r"^n_samples: "):
            build(name, model, sigma, n_samples=n)


@pytest.mark.parametrize("name", [n for n, spec in REGISTRY.items() if spec.samples is None])
def test_n_samples_is_refused_by_methods_that_draw_no_samples(name):
    model, _, sigma = _linear()
    with pytest.raises(ValueError, match=r"^n_samples: does not apply"):
        make_estimator(name, model, sigma, n_samples=10)


@pytest.mark.parametrize("method", ["exact", "MC", "", None, 3])
def test_unknown_method_is_refused_by_name(method):
    model, x, sigma = _linear()
    with pytest.raises(ValueError, match=r"^method: must be one of mc, taylor"):
        make_estimator(method, model, sigma)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^method: must be one of"):
        probust.estimate(model, x, sigma, method)  # type: ignore[arg-type]


def test_every_registered_method_is_a_public_name():
    assert tuple(REGISTRY) == probust.METHODS
    for name, spec in REGISTRY.items():
        assert spec.name == name and method_spec(name) is spec


# ---------------------------------------------------------------- ties at the clean point


def _tied_model() -> tuple[nn.Module, Tensor]:
    """A linear model whose classes 0 and 1 have identical weights: its two largest logits are
    exactly equal wherever x[0] > 0.5 (rows 1 and 3 here); elsewhere class 2 wins alone."""
    model = nn.Linear(12, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.weight[0, 0] = model.weight[1, 0] = 1.0
        model.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)) * 0.1
    x[:, 0] = torch.tensor([0.0, 1.0, 0.0, 1.0])
    return model, x


@pytest.mark.parametrize("name", METHODS)
def test_a_tied_prediction_is_refused_naming_its_rows_unless_a_target_is_given(name):
    model, x = _tied_model()
    logits = model(x).detach()
    assert torch.equal(logits[[1, 3], 0], logits[[1, 3], 1])  # the model ties exactly there
    estimator = build(name, model, 0.3)
    with pytest.raises(ValueError, match=r"tied between two classes at rows \[1, 3\].*pass target="):
        estimator(x)
    target = torch.tensor([2, 1, 2, 0])
    result = estimator(x, target=target)
    assert torch.equal(result.target.cpu(), target) and result.p.shape == (4,)
