"""A bad option value is an OptionError (a ValueError) whose ``field`` is the option's name, from
every layer that checks one: estimators of each family, their execution, randomized smoothing,
the mvn functions, the noise and the robust loss. The command line maps the field to its flag."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust.errors import OptionError
from probust.execution import Execution
from probust.execution.budget import parse_bytes
from probust.noise import Uniform
from probust.smoothing import Certify, Predict
from probust.training import RobustLoss


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


CASES = [
    # (build, field)
    (lambda m: probust.MonteCarlo(m, 0.1, n_samples=0), "n_samples"),
    (lambda m: probust.MonteCarlo(m, 0.1, confidence=1.5), "confidence"),
    (lambda m: probust.MonteCarlo(m, 0.1, confidence="0.9"), "confidence"),
    (lambda m: probust.MonteCarlo(m, 0.1, interval="normal"), "interval"),
    (lambda m: probust.MonteCarlo(m, 0.1, target_half_width=-0.1), "target_half_width"),
    (lambda m: probust.MonteCarlo(m, 0.1, check_every=0), "check_every"),
    (lambda m: probust.MonteCarlo(m, 0.1, seed=1.5), "seed"),
    (lambda m: probust.Taylor(m, 0.1, cdf="probit"), "cdf"),
    (lambda m: probust.Taylor(m, 0.1, tol=0), "tol"),
    (lambda m: probust.Taylor(m, 0.1, fail_rtol=1.0), "fail_rtol"),
    (lambda m: probust.Taylor(m, 0.1, p_fail="yes"), "p_fail"),
    (lambda m: probust.Taylor(m, 0.1, gradients="fastest"), "gradients"),
    (lambda m: probust.Taylor(m, 0.1, gradients="head", differentiable=True), "gradients"),
    (lambda m: probust.Taylor(m, 0.1, gradients="forward", execution=Execution(jacobian="loop")), "gradients"),
    (lambda m: probust.Taylor(m, 0.1, prune="sometimes"), "prune"),
    (lambda m: probust.Taylor(m, 0.1, prune=False), "prune"),
    (lambda m: probust.Taylor(m, 0.1, prune="on"), "prune"),
    (lambda m: probust.Taylor(m, 0.1, prune="spectral", cdf="mv-sigmoid"), "prune"),
    (lambda m: probust.Taylor(m, 0.1, prune="sketch", gradients="head"), "prune"),
    (lambda m: probust.Taylor(m, 0.1, execution=Execution(jacobian="reverse")), "jacobian"),
    (lambda m: probust.Taylor(m, 0.1, execution=Execution(jacobian="forward")), "jacobian"),
    (lambda m: probust.Taylor(m, 0.1, execution=Execution(memory_budget="lots")), "memory_budget"),
    (lambda m: probust.MMSE(m, 0.1, n_samples=0), "n_samples"),
    (lambda m: probust.MMSE(m, 0.1, sampling="sobol"), "sampling"),
    (lambda m: probust.MonteCarloCV(m, 0.1, confidence=0), "confidence"),
    (lambda m: probust.MonteCarloCV(m, 0.1, linearisation="exact"), "linearisation"),
    (lambda m: probust.MonteCarloCV(m, Uniform(0.1)), "sigma"),
    (lambda m: probust.MonteCarloIS(m, 0.1, components=0), "components"),
    (lambda m: probust.MonteCarloIS(m, 0.1, defensive=1.0), "defensive"),
    (lambda m: probust.Softmax(m, temperature=0), "temperature"),
    (lambda m: probust.estimate(m, torch.rand(2, 4), None, "softmax", n_samples=10), "n_samples"),
    (lambda m: probust.estimate(m, torch.rand(2, 4), 0.1, "mcmc"), "method"),
    (lambda m: probust.MonteCarlo(m, 0.1)(torch.rand(2, 4), index_offset=-1), "index_offset"),
    (lambda m: Certify(m, 0.1, n0=0), "n0"),
    (lambda m: Certify(m, 0.1, n=0), "n"),
    (lambda m: Certify(m, 0.1, alpha=1.0), "alpha"),
    (lambda m: Certify(m, Uniform(0.1)), "sigma"),
    (lambda m: Predict(m, 0.1, n=-5), "n"),
    (lambda m: probust.certify(m, torch.rand(2, 4), 0.1, radii=[-1.0]), "radii"),
    (lambda m: probust.mvn_cdf(torch.zeros(2), torch.eye(2), tol=-1), "tol"),
    (lambda m: parse_bytes("lots"), "memory_budget"),
    (lambda m: RobustLoss(0.1, mu=-1.0), "mu"),
    (lambda m: RobustLoss(0.1, warmup_steps=-1), "warmup_steps"),
]


@pytest.mark.parametrize("build,field", CASES, ids=[f"{i}-{field}" for i, (_, field) in enumerate(CASES)])
def test_a_bad_option_value_is_an_option_error_naming_it(build, field):
    with pytest.raises(OptionError) as error:
        build(_model())
    assert error.value.field == field
    assert isinstance(error.value, ValueError)  # pytest.raises(ValueError) callers keep working
    assert str(error.value).startswith(f"{field}: ")


def test_a_missing_extra_is_a_probust_error_and_still_a_module_not_found_error():
    from probust._extras import MissingExtraError
    from probust.errors import ProbustError

    error = MissingExtraError("pandas", "run", "probust estimate")
    assert isinstance(error, ProbustError) and isinstance(error, ModuleNotFoundError)
    assert error.name == "pandas" and error.extra == "run"
    assert "pip install 'probust[run]'" in str(error)
    with pytest.raises(ImportError):
        raise error


def test_missing_data_names_the_root_option_in_each_callers_words(tmp_path):
    """The data layer's hint names its ``root`` argument as a Setting: Python reads ``root``,
    ``probust train`` its --root, and the run (whose option is ``data_root``) --data-root."""
    from probust.cli.flags import message
    from probust.cli.train import flags as train_flags
    from probust.data import ProbustDataError
    from probust.data._locate import not_found
    from probust.run import ConfigError
    from probust.run.sources import load_data

    error = not_found("mnist", "test", ["t10k-images"], [tmp_path], tmp_path)
    assert isinstance(error, ProbustDataError)
    assert "put the files in root (or $PROBUST_DATA_DIR)" in str(error)
    assert "put the files in --root (or $PROBUST_DATA_DIR)" in message(error, train_flags())
    try:
        load_data("mnist", "test", tmp_path / "nothing", False)
    except ConfigError as raised:
        assert "data_root" in str(raised) and "--root" not in str(raised)
    else:
        pytest.skip("mnist is installed in a system folder here")
