"""probust.demo.settings: the demo's configurations and their validation."""

from __future__ import annotations

import pytest

from probust import demo


def test_quick_configuration_is_tiny_and_default_follows_the_paper_grid():
    full, quick = demo.config_for("fashion-mnist"), demo.config_for("fashion-mnist", quick=True)
    assert full.points == 200 and full.mc_samples == 1000 and len(full.sigmas) == 4 and full.lambdas[0] == 0
    assert full.runtime_mc == (100, 1_000, 10_000) and full.runtime_mmse == (1, 5, 10, 25, 50, 100)
    assert quick.points < 50 and quick.mc_samples <= 200 and quick.train_size is not None
    assert demo.config_for("digits").pool_points == 359
    assert demo.config_for("fashion-mnist", points=300, seed=3).points == 300


def test_default_and_quick_configurations_pass_validation():
    for data in ("fashion-mnist", "digits"):
        for quick in (False, True):
            demo.check_config(demo.config_for(data, quick=quick))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"robust_sigma": 0.3}, "robust_sigma"),
        ({"robust_mus": (0.0,)}, "robust_mus"),
        ({"robust_warmup": 1.5}, "robust_warmup"),
    ],
)
def test_bad_robust_settings_are_refused(overrides, message):
    with pytest.raises(demo.DemoConfigError, match=message):
        demo.check_config(demo.config_for("fashion-mnist", **overrides))


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"points": 1}, "points"),
        ({"sigmas": ()}, "sigmas"),
        ({"sigmas": (0.1, -0.2), "case_sigma": 0.1, "robust_sigma": 0.1}, "sigmas"),
        ({"case_sigma": 0.3}, "case_sigma"),
        ({"lambdas": (0.0, -1e-3)}, "lambdas"),
        ({"robust_mus": (1.0, -1.0)}, "robust_mus"),
        ({"robust_sigma": 0.3}, "robust_sigma"),
        ({"robust_max_points": 0}, "robust_max_points"),
        ({"robust_warmup": -0.1}, "robust_warmup"),
    ],
)
def test_config_errors_start_with_the_name_of_the_bad_argument(overrides, argument):
    cfg = demo.config_for("fashion-mnist", **overrides)
    with pytest.raises(demo.DemoConfigError) as info:
        demo.check_config(cfg)
    assert str(info.value).split()[0] == argument
    assert isinstance(info.value, ValueError)


def test_robust_sigma_outside_sigmas_is_accepted_without_robust_models():
    demo.check_config(demo.config_for("fashion-mnist", robust_mus=(), robust_sigma=0.3))
