"""The method registry: names, look-ups, the settings each method takes, and its estimator's defaults."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from probust.estimators import (
    METHODS,
    PAPER_METHODS,
    REGISTRY,
    MethodSpec,
    MonteCarlo,
    make_estimator,
    method_spec,
    methods_with,
)
from probust.estimators.registry import RUN_OPTIONS
from probust.execution import Execution


def _init_parameters(cls: type) -> set[str]:
    """Every keyword its constructor accepts along the class hierarchy (through **kwargs)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            names |= set(inspect.signature(klass.__init__).parameters)
    return names


def test_the_paper_methods_are_the_six_of_the_design_in_order():
    # the paper's methods (docs/design.md): mc, taylor, mmse, taylor_mvs, mmse_mvs, softmax
    assert PAPER_METHODS == ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax")
    assert METHODS[: len(PAPER_METHODS)] == PAPER_METHODS and METHODS == tuple(REGISTRY)


def test_method_spec_finds_each_method_and_names_the_known_ones_otherwise():
    for name in METHODS:
        assert method_spec(name) is REGISTRY[name] and REGISTRY[name].name == name
    for bad in ("exact", None, ["mc"]):
        with pytest.raises(ValueError, match=r"^method: must be one of mc, taylor, mmse"):
            method_spec(bad)  # type: ignore[arg-type]  # the error is the point


def test_methods_with_lists_the_methods_that_take_a_setting():
    for option in RUN_OPTIONS:
        assert methods_with(option) == tuple(n for n in METHODS if option in REGISTRY[n].run_options)
    assert methods_with("p_fail") == ("taylor", "mmse", "taylor_mvs", "mmse_mvs")
    with pytest.raises(ValueError, match=r"^run_option must be one of"):
        methods_with("colour")


@pytest.mark.parametrize("name", METHODS)
def test_every_run_option_and_fixed_option_is_an_argument_of_the_estimator(name):
    spec = REGISTRY[name]
    accepted = _init_parameters(spec.estimator)
    # "jacobian" reaches the estimator through its Execution.
    runs_by = {f.name for f in dataclasses.fields(Execution)}
    assert set(spec.run_options) <= accepted | runs_by, set(spec.run_options) - accepted - runs_by
    assert set(spec.options) <= accepted
    est = make_estimator(name, torch.nn.Linear(3, 2), 0.1)
    for option, value in spec.options.items():
        assert getattr(est, option) == value


@pytest.mark.parametrize("name", METHODS)
def test_default_samples_is_the_estimators_default(name):
    spec = REGISTRY[name]
    est = make_estimator(name, torch.nn.Linear(3, 2), 0.1)
    assert (spec.samples is None) == (spec.default_samples is None)
    if spec.samples is not None:
        assert est.n_samples == spec.default_samples  # type: ignore[attr-defined]


def test_spec_linearised():
    assert [n for n in METHODS if REGISTRY[n].linearised] == [n for n in METHODS if n in ("mc_cv", "mc_is")]


def test_a_spec_is_immutable_and_refuses_unknown_run_options():
    spec = REGISTRY["taylor_mvs"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]  # frozen on purpose
    with pytest.raises(TypeError):
        spec.options["cdf"] = "mvn"  # type: ignore[index]  # a read-only mapping
    with pytest.raises(ValueError, match=r"run_options of 'x' name unknown settings \['colour'\]"):
        MethodSpec("x", MonteCarlo, run_options=frozenset({"colour"}))
