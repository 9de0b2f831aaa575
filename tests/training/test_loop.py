"""probust.training.loop: training runs, their metadata, settings as keywords or a TrainConfig."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import probust.models as pm
from probust.data import _locate
from probust.training import SCHEDULES, TrainConfig, evaluate, train
from tests._helpers import require_fashion_mnist

QUICK = {"epochs": 1, "lr": 0.05, "batch_size": 64, "show_progress": False}


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_learns_digits_and_records_its_metadata(tmp_path, digits):
    path = tmp_path / "digits_linear.pt"

    result = train("digits", "linear", epochs=3, lr=0.05, batch_size=64, out=path, show_progress=False)

    meta = result.meta
    for key in (
        "dataset",
        "arch",
        "num_classes",
        "input_shape",
        "grad_reg",
        "epochs",
        "seed",
        "test_accuracy",
        "probust_version",
        "created",
        "history",
        "classes",
    ):
        assert key in meta, key
    assert (meta["dataset"], meta["arch"], meta["epochs"], meta["epochs_completed"]) == ("digits", "linear", 3, 3)
    assert meta["complete"] and len(meta["history"]) == 3
    assert meta["test_accuracy"] > 0.85  # chance is 0.1
    assert meta["test_accuracy"] == evaluate(result.model, digits[1])
    assert json.loads(pm.sidecar_path(path).read_text()) == meta
    loaded, loaded_meta = pm.load_model(path, expect_num_classes=10, expect_input_shape=(1, 8, 8))
    X, _ = digits[1].tensors()
    assert torch.equal(loaded(X), result.model(X)) and loaded_meta == meta


def test_seed_fixes_the_result(digits):
    runs = [train(digits[0], "cnn", **QUICK, seed=s).model for s in (7, 7, 8)]
    same, other = _weights(runs[1]), _weights(runs[2])
    assert all(torch.equal(v, same[k]) for k, v in _weights(runs[0]).items())
    assert not torch.equal(same["classifier.4.weight"], other["classifier.4.weight"])


def test_learning_rate_follows_the_schedule(digits):
    assert SCHEDULES["cosine"](0.0) == 1.0 and math.isclose(SCHEDULES["cosine"](0.5), 0.5)
    assert [SCHEDULES["step"](t) for t in (0.0, 0.5, 0.75)] == [1.0, 0.1, pytest.approx(0.01)]
    result = train(digits[0], "linear", **{**QUICK, "epochs": 2, "lr": 0.2}, schedule="cosine")
    steps = 2 * math.ceil(len(digits[0]) / 64)
    # After epoch 1 of 2 the per-step cosine has done half of its steps.
    assert math.isclose(result.meta["history"][0]["lr"], 0.2 * SCHEDULES["cosine"]((steps // 2) / steps), rel_tol=1e-9)


def test_bad_hyper_parameters_are_refused_before_any_work():
    with pytest.raises(ValueError, match="epochs: must be an integer >= 1"):
        train("digits", "linear", epochs=0)
    with pytest.raises(ValueError, match="lr: must be a positive number"):
        train("digits", "linear", lr=-1.0)
    with pytest.raises(ValueError, match="unknown schedule 'warm'; known schedules: cosine, step, constant"):
        train("digits", "linear", schedule="warm")
    with pytest.raises(ValueError, match="unknown architecture 'gru'"):
        train("digits", "gru")
    with pytest.raises(ValueError, match="unknown data set 'imagenet'"):
        train("imagenet", "linear")


# ---- the larger architectures on tiny data ------------------------------------------------------


def _tiny_cifar10(root: Path, per_batch: int = 2) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, per_batch).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_resnet18_trains_a_step_on_tiny_cifar_files_with_gradient_regularisation(tmp_path, monkeypatch):
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {})
    _tiny_cifar10(tmp_path / "data")
    torch.manual_seed(0)
    init = _weights(pm.build("resnet18", 10, (3, 32, 32)))

    result = train(
        "cifar10",
        "resnet18",
        epochs=1,
        batch_size=10,
        lr=0.01,
        grad_reg=1e-3,
        root=tmp_path / "data",
        out=tmp_path / "r18.pt",
        show_progress=False,
    )

    assert result.meta["augment"] is True and result.meta["dataset"] == "cifar10"
    assert result.meta["arch_kwargs"]["mean"] == [0.4914, 0.4822, 0.4465]
    assert not torch.equal(init["net.conv1.weight"], _weights(result.model)["net.conv1.weight"])
    model, _ = pm.load_model(tmp_path / "r18.pt", expect_arch="resnet18", expect_dataset="cifar10")
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_vit_trains_a_step_on_a_small_data_set(digits):
    pytest.importorskip("transformers")
    config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}

    result = train(
        digits[0].subset(range(32)),
        "vit",
        epochs=1,
        batch_size=16,
        lr=0.01,
        grad_reg=1e-3,
        test_dataset=digits[1].subset(range(16)),
        arch_kwargs={"config": config},
        show_progress=False,
    )

    assert result.meta["arch_kwargs"]["config"]["hidden_size"] == 16
    # the recorded accuracy is the trained model's on the test split (oracle: evaluate), not just a number in [0, 1]
    assert result.meta["test_accuracy"] == evaluate(result.model, digits[1].subset(range(16)))
    assert math.isfinite(result.meta["history"][0]["train_loss"])


def test_keyword_call_and_config_call_give_bitwise_identical_weights(digits):
    train_ds = digits[0].subset(list(range(100)))
    settings = dict(
        epochs=1,
        lr=0.05,
        batch_size=16,
        grad_reg=1e-2,
        seed=5,
        momentum=0.8,
        weight_decay=1e-3,
        schedule="step",
        augment=False,
        arch_kwargs={"pool": False},
    )

    by_keywords = train(train_ds, "cnn", show_progress=False, **settings)
    by_config = train(train_ds, "cnn", show_progress=False, config=TrainConfig(**settings))

    for key, value in _weights(by_keywords.model).items():
        assert torch.equal(value, _weights(by_config.model)[key]), key
    assert {k: v for k, v in by_keywords.meta.items() if k not in ("created", "history", "train_seconds")} == {
        k: v for k, v in by_config.meta.items() if k not in ("created", "history", "train_seconds")
    }


def test_config_fields_left_as_none_take_the_architectures_defaults(digits):
    result = train(digits[0].subset(list(range(40))), "linear", config=TrainConfig(epochs=1), show_progress=False)
    assert (result.meta["lr"], result.meta["batch_size"], result.meta["weight_decay"]) == (0.01, 128, 0.0)
    assert result.meta["augment"] is False  # not CIFAR


def test_settings_both_in_config_and_as_keywords_are_refused_naming_them():
    with pytest.raises(TypeError, match="got config and epochs, lr: give the settings in config or as keywords"):
        train("digits", "linear", config=TrainConfig(epochs=2), epochs=3, lr=0.1)
    with pytest.raises(TypeError, match="config must be a probust.training.TrainConfig"):
        train("digits", "linear", config={"epochs": 2})


# ---- the paper's Fashion-MNIST models (minutes: `pytest -m slow`) ----------------------------


# Accuracy floors from the spread between CPUs. Ten epochs of SGD amplify each CPU's rounding
# (its kernels round differently): the same code, seed and one thread gave these test accuracies
# on four set-ups (two build machines; and on an AMD EPYC with torch 2.14's AVX2 kernels and with
# its non-vectorised ones, ATEN_CPU_CAPABILITY=default):
#   linear, lr 0.01:         0.844 (build machine), 0.8441 (AVX2), 0.8441 (default)  spread 0.0001
#   cnn no pool, lr 0.02:    0.909 (build machine), 0.909 (AVX2), 0.9123 (default)   spread 0.0033
#   cnn, lr 0.05 (fixture):  0.905, 0.8988 (build machines), 0.902 (AVX2), 0.9026    spread 0.0062
# Each floor is the lowest measurement minus 1.5 x the largest spread (0.0093), rounded down, so
# that another CPU does not fail a correct build while a real regression (a point or more) does.
ACCURACY_SPREAD = 0.0062


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, arch_kwargs, lr, floor",
    [
        # floors: the lowest measurement - 0.0093 (linear 0.844, paper 84%; cnn no pool 0.909)
        pytest.param("linear", {}, 0.01, 0.834, marks=pytest.mark.slow(seconds=6)),
        pytest.param("cnn", {"pool": False}, 0.02, 0.899, marks=pytest.mark.slow(seconds=197)),
    ],
    ids=["linear", "cnn-no-pool"],
)
def test_fashion_mnist_models_reach_the_papers_accuracy(tmp_path, arch, arch_kwargs, lr, floor):
    # selected by its marker alone (`make test-all`, `pytest -m slow`), like every slow test
    require_fashion_mnist()
    result = train(
        "fashion-mnist",
        arch,
        epochs=10,
        lr=lr,
        batch_size=128,
        arch_kwargs=arch_kwargs,
        out=tmp_path / f"{arch}.pt",
        show_progress=False,
        num_threads=1,
    )
    assert result.meta["test_accuracy"] >= floor


@pytest.mark.slow
def test_fashion_mnist_cnn_reaches_the_papers_accuracy(fashion_mnist_cnn):
    # the same recipe as above (lr 0.05), trained once per session by the fixture in tests/conftest.py,
    # which the MMSE-against-Monte-Carlo test (tests/estimators/test_mmse_trained.py) reuses.
    # Measured 0.905 and 0.8988 on two build machines, 0.902 and 0.9026 on a third CPU's AVX2 and
    # default kernels (the table above; paper: 91%): floor 0.8988 - 1.5 x 0.0062, rounded down.
    meta = fashion_mnist_cnn.meta
    assert (meta["arch"], meta["epochs"], meta["lr"], meta["batch_size"]) == ("cnn", 10, 0.05, 128)
    assert meta["test_accuracy"] >= 0.889
    assert 0.8988 - 0.889 >= 1.5 * ACCURACY_SPREAD
