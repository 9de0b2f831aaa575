"""RunSettings: every argument of a run checked once, with one-line errors naming the argument."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import numpy as np
import pytest
import torch

import probust
from probust.run import DEFAULT_METHODS, ConfigError, RunSettings, run_estimate


def settings(**changes) -> RunSettings:
    args = dict(data="digits", model="model.pt", sigmas=[0.1], device="cpu")
    args.update(changes)
    return RunSettings(**args)


BAD = [
    ("sigmas", []),
    ("sigmas", [0.1, 0]),
    ("sigmas", [-1]),
    ("sigmas", [math.inf]),
    ("sigmas", [0.1, "abc"]),
    ("methods", []),
    ("methods", ["mc", "nope"]),
    ("mc_samples", 0),
    ("mc_samples", []),
    ("mc_samples", [1.5]),
    ("mc_samples", ["x"]),
    ("mmse_samples", 0),
    ("limit", 0),
    ("limit", 1.5),
    ("limit", True),
    ("unit_size", 0),
    ("batch_size", 0),
    ("memory_budget", "lots"),
    ("jacobian", "magic"),
    ("jacobian", "forward"),
    ("prune", "on"),
    ("gradients", "spectral"),
    ("channels_last", "on"),
    ("seed", 1.5),
    ("seed", True),
    ("seed", "3"),
    ("temperature", 0),
    ("temperature", "abc"),
    ("tol", -1e-4),
    ("confidence", 1.5),
    ("confidence", 0),
    ("confidence", "abc"),
    ("target", "other"),
    ("interval", "exact"),
    ("sampling", "sobol"),
    ("p_fail", "yes"),
    ("target_half_width", 0.7),
    ("target_half_width", 0),
    ("indices", "3-1"),
    ("indices", "a"),
    ("device", "nonsense"),
    ("device", "cuda:9" if torch.cuda.is_available() else "cuda"),
    ("split", "valid"),
    ("out", None),
    ("noise", "cauchy"),
    ("noise_scale", "relative"),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_each_bad_value_is_one_line_naming_the_argument(name, value):
    with pytest.raises(ConfigError, match=f"^{name}: ") as info:
        settings(**{name: value})
    assert "\n" not in str(info.value)


def test_overwrite_and_extend_exclude_each_other():
    with pytest.raises(ConfigError, match=r"^overwrite=True and extend=True exclude each other$"):
        settings(overwrite=True, extend=True)


def test_the_first_bad_argument_in_the_signatures_order_is_reported():
    with pytest.raises(ConfigError, match="^sigmas: "):
        settings(sigmas=[-1], methods=["nope"], target="other")
    with pytest.raises(ConfigError, match="^methods: "):
        settings(methods=["nope"], target="other")


def test_values_are_normalised_sorted_and_typed():
    s = settings(
        sigmas=[0.3, "0.1", 0.3],
        methods=["softmax", "mc", "taylor"],
        mc_samples=[1000, 100.0, 1000],
        mmse_samples=7,
        indices=["5-7", 2],
        seed=np.int64(4),
        limit=np.int32(3),
        temperature="2",
        p_fail=np.bool_(True),
        target_half_width=0.01,
    )
    assert s.sigmas == (0.1, 0.3) and s.mc_samples == (100, 1000) and s.mmse_samples == (7,)
    assert s.methods == tuple(m for m in probust.METHODS if m in ("softmax", "mc", "taylor"))
    assert s.indices == (2, 5, 6, 7) and s.selected.dtype == np.int64 and s.selected.tolist() == [2, 5, 6, 7]
    assert type(s.seed) is int and s.seed == 4 and type(s.limit) is int and s.limit == 3
    assert type(s.temperature) is float and s.temperature == 2.0
    assert s.p_fail is True and s.target_half_width == 0.01
    assert settings().selected is None


def test_settings_are_frozen_and_replace_checks_again():
    s = settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3  # type: ignore[misc]
    assert s.replace(seed=3).seed == 3 and s.seed == 0
    with pytest.raises(ConfigError, match="^seed: "):
        s.replace(seed="x")
    # normalised values are accepted again as they are
    assert s.replace() == s


def test_a_split_is_only_checked_for_a_named_data_set():
    x, y = torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.int64)
    assert settings(data=torch.utils.data.TensorDataset(x, y), split="valid").split == "valid"


def test_run_estimate_takes_exactly_the_fields_of_run_settings_with_the_same_defaults():
    params = inspect.signature(run_estimate).parameters
    fields = dataclasses.fields(RunSettings)
    # generated from the declarations: the five leading arguments, then every other field by keyword
    assert list(params)[:5] == ["data", "model", "sigmas", "methods", "out"]
    assert set(params) == {f.name for f in fields} and len(params) == len(fields)
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    assert set(defaults) == {f.name for f in fields} - {"data", "model", "sigmas"}
    # run_estimate's defaults and RunSettings' give the same checked settings
    base = dict(data="digits", model="model.pt", sigmas=[0.1])
    assert RunSettings(**base, **defaults) == RunSettings(**base)
    assert RunSettings(**base).methods == DEFAULT_METHODS


# A value of the wrong type for every field, as a Python caller might pass it by mistake: each
# must give the one-line ConfigError naming the field (as the CLI does), never a raw TypeError.
WRONG_TYPE = [
    ("data", 42),
    ("data", object()),
    ("data", b"digits"),
    ("model", 42),
    ("model", object()),
    ("sigmas", "a"),
    ("sigmas", object()),
    ("sigmas", None),
    ("sigmas", True),
    ("sigmas", [0.1, True]),
    ("sigmas", b"x"),
    ("methods", 3),
    ("methods", None),
    ("methods", [3]),
    ("methods", b"mc"),
    ("out", 42),
    ("out", object()),
    ("split", 3),
    ("mc_samples", [1.5]),
    ("mc_samples", 1.5),
    ("mc_samples", None),
    ("mc_samples", True),
    ("mc_samples", [object()]),
    ("mc_samples", {"n": 10}),
    ("mmse_samples", [2.5]),
    ("mmse_samples", object()),
    ("limit", "3"),
    ("limit", 2.0),
    ("indices", 1.5),
    ("indices", object()),
    ("indices", [object()]),
    ("indices", True),
    ("device", 5),
    ("device", None),
    ("device", object()),
    ("seed", "0"),
    ("seed", None),
    ("unit_size", None),
    ("unit_size", "8"),
    ("batch_size", "8"),
    ("memory_budget", object()),
    ("memory_budget", [1]),
    ("memory_budget", True),
    ("jacobian", 3),
    ("jacobian", None),
    ("channels_last", "off"),
    ("channels_last", 1),
    ("temperature", True),
    ("temperature", None),
    ("temperature", [1.0]),
    ("target", 3),
    ("target", None),
    ("target", ["label"]),
    ("tol", True),
    ("tol", "x"),
    ("confidence", "x"),
    ("confidence", True),
    ("confidence", None),
    ("confidence", object()),
    ("interval", 3),
    ("interval", ["wilson"]),
    ("sampling", None),
    ("p_fail", 1),
    ("p_fail", "no"),
    ("target_half_width", "x"),
    ("target_half_width", True),
    ("show_progress", "no"),
    ("show_progress", None),
    ("overwrite", "no"),
    ("overwrite", 1),
    ("extend", "yes"),
    ("merge", None),
    ("download", 1),
    ("data_root", 42),
    ("allow_pickle", "yes"),
    ("untrained", "yes"),
    ("allow_version_change", "yes"),
    ("data_options", 42),
    ("data_options", ["x_key"]),
    ("weights", 42),
    ("model_args", 3),
    ("noise", 3),
    ("noise", None),
    ("noise_std", object()),
    ("noise_std", 3),
    ("noise_cov", object()),
    ("noise_scale", None),
    ("prune", 3),
    ("prune", None),
    ("gradients", 3),
    ("gradients", None),
    ("gradients", True),
    ("check_draws", -1),
    ("check_draws", 2.5),
    ("check_draws", True),
    ("mean", object()),
    ("mean", True),
    ("mean", {"r": 0.5}),
    ("std", "x"),
    ("std", [True]),
]


# Ids without memory addresses: every process (pytest-xdist's workers) collects the same names.
@pytest.mark.parametrize(
    ("name", "value"), WRONG_TYPE, ids=[re.sub(r" at 0x[0-9a-f]+", "", f"{n}={v!r}") for n, v in WRONG_TYPE]
)
def test_a_value_of_the_wrong_type_is_a_config_error_naming_the_argument(name, value):
    with pytest.raises(ConfigError, match=f"^{name}: ") as info:
        settings(**{name: value})
    assert "\n" not in str(info.value)


def test_every_field_has_a_wrong_type_case():
    assert {f.name for f in dataclasses.fields(RunSettings)} == {name for name, _ in WRONG_TYPE}


@pytest.mark.parametrize(
    ("name", "value"), [("confidence", "x"), ("sigmas", "a"), ("mc_samples", [1.5]), ("seed", "0"), ("methods", 3)]
)
def test_run_estimate_gives_the_same_config_error_before_any_work(tmp_path, name, value):
    args = dict(data="digits", model=tmp_path / "none.pt", sigmas=[0.1], out=tmp_path / "r", device="cpu")
    with pytest.raises(ConfigError, match=f"^{name}: "):
        run_estimate(**{**args, name: value})
    assert not (tmp_path / "r").exists()


def test_numbers_given_as_numpy_or_torch_values_are_accepted():
    s = settings(
        sigmas=torch.tensor([0.2, 0.1], dtype=torch.float64), mc_samples=np.array([10, 20]), indices=np.arange(3)
    )
    assert s.sigmas == (0.1, 0.2) and s.mc_samples == (10, 20) and s.indices == (0, 1, 2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"noise": "uniform", "methods": ["mc", "mc_is"]}, "^noise: mc_is needs Gaussian noise"),
        ({"noise": "laplace", "methods": ["mc_cv", "mc_is"]}, "^noise: mc_cv, mc_is need Gaussian noise"),
        ({"noise": "laplace", "noise_std": "m.npy"}, "^noise_std: applies to Gaussian noise only"),
        ({"noise_std": "m.npy", "noise_cov": "c.npy"}, "^noise_cov: cannot be combined with noise_std"),
        ({"noise_cov": "c.npy", "noise_scale": "std"}, "^noise_scale: cannot be combined with noise_cov"),
    ],
)
def test_noise_settings_that_cannot_go_together_are_refused_before_any_file_is_read(changes, message):
    with pytest.raises(ConfigError, match=message):
        settings(**changes)
    settings(noise="uniform", methods=["mc", "taylor", "mmse"])  # the analytic methods take its covariance


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"prune": "spectral", "p_fail": True},
            "^prune: 'spectral' screens the boundaries, which cannot be combined with",
        ),
        ({"prune": "sketch", "noise": "uniform"}, "^prune: 'sketch' screens .* non-Gaussian noise"),
        ({"prune": "sketch", "gradients": "head"}, "^prune: 'sketch' screens .* gradients"),
        ({"gradients": "forward", "jacobian": "loop"}, "^gradients: 'forward' takes no backward passes"),
        ({"prune": "on"}, "^prune: "),
        ({"jacobian": "forward"}, "^jacobian: "),
    ],
)
def test_prune_and_gradients_are_checked_by_the_estimators_rule_before_any_work(changes, message):
    """The run's prune, gradients and jacobian are the estimators' arguments under the same names,
    checked by the same function when the settings are built (not once the first unit runs)."""
    with pytest.raises(ConfigError, match=message):
        settings(methods=["taylor"], **changes)
    # A method that takes neither leaves them unchecked against each other, as its estimator would.
    settings(methods=["mc"], prune="sketch", gradients="head")
    # The mv-sigmoid methods take gradients and jacobian, not prune: checked as their estimators get them.
    with pytest.raises(ConfigError, match="^gradients: 'forward' takes no backward passes"):
        settings(methods=["taylor_mvs"], gradients="forward", jacobian="loop")
    settings(methods=["taylor_mvs", "mmse_mvs"], prune="sketch", p_fail=True)
