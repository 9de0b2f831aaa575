"""probust.training.config: TrainConfig refuses each bad value naming its argument; DEFAULTS fill the rest."""

from __future__ import annotations

import dataclasses
import math

import pytest

from probust.models import ARCHS
from probust.training import DEFAULTS, SCHEDULES, TrainConfig, train


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("epochs", 0, "epochs: must be an integer >= 1"),
        ("epochs", 2.0, "epochs: must be an integer >= 1"),
        ("epochs", True, "epochs: must be an integer >= 1"),
        ("batch_size", 0, "batch_size: must be an integer >= 1"),
        ("num_threads", 0, "num_threads: must be an integer >= 1"),
        ("lr", 0.0, "lr: must be a positive number"),
        ("lr", math.inf, "lr: must be a positive number"),
        ("lr", "0.1", "lr: must be a number"),
        ("grad_reg", -1e-3, r"grad_reg: \(lambda\) must be >= 0"),
        ("grad_reg", math.nan, r"grad_reg: \(lambda\) must be >= 0"),
        ("momentum", 1.0, r"momentum: must be in \[0, 1\)"),
        ("momentum", -0.1, r"momentum: must be in \[0, 1\)"),
        ("weight_decay", -1.0, "weight_decay: must be >= 0"),
        ("schedule", "warm", "unknown schedule 'warm'; known schedules: cosine, step, constant"),
        ("seed", 1.5, "seed: must be an integer"),
        ("seed", False, "seed: must be an integer"),
        ("arch_kwargs", [("pool", False)], "arch_kwargs: must be a dict"),
        ("device", "gpu", "device: must be 'cpu', 'cuda', 'cuda:N' or 'auto'"),
    ],
)
def test_each_bad_setting_is_refused_naming_its_argument(name, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{name: value})
    with pytest.raises(ValueError, match=message):  # the same check behind train()'s keywords, before any work
        train("no-such-data-set", "linear", **{name: value})


def test_default_config_is_valid_and_its_unset_fields_take_each_architectures_values():
    assert set(DEFAULTS) == set(ARCHS)
    for arch in ARCHS:
        resolved = TrainConfig().for_arch(arch)
        assert {k: getattr(resolved, k) for k in DEFAULTS[arch]} == DEFAULTS[arch]
    given = TrainConfig(lr=0.2, epochs=2).for_arch("cnn")
    assert (given.lr, given.epochs, given.batch_size, given.weight_decay) == (0.2, 2, 128, 5e-4)
    with pytest.raises(ValueError, match="unknown architecture 'gru'; known architectures: linear, cnn"):
        TrainConfig().for_arch("gru")


def test_numbers_are_stored_as_floats_and_arch_kwargs_as_a_copy():
    options = {"pool": False}
    config = TrainConfig(lr=1, weight_decay=0, grad_reg=0, momentum=0, augment=1, arch_kwargs=options)
    assert all(type(getattr(config, k)) is float for k in ("lr", "weight_decay", "grad_reg", "momentum"))
    assert config.augment is True
    options["pool"] = True
    assert config.arch_kwargs == {"pool": False}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 0.5  # type: ignore[misc]
    assert config == TrainConfig(
        lr=1.0, weight_decay=0.0, grad_reg=0.0, momentum=0.0, augment=True, arch_kwargs={"pool": False}
    )


def test_every_schedule_starts_at_the_base_rate_and_never_raises_it():
    for name, factor in SCHEDULES.items():
        values = [factor(t / 100) for t in range(100)]
        assert values[0] == 1.0, name
        assert all(0 < b <= a for a, b in zip(values, values[1:])), name
