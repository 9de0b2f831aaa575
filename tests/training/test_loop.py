"""probust.train and `probust train`: objective, resumption, checkpoints, the CLI."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probust.data as pdata
import probust.models as pm
from probust.cli import main
from probust.data import _locate
from probust.train import (
    SCHEDULES,
    _augment,
    evaluate,
    input_gradient_penalty,
    objective,
    train,
)

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
QUICK = {"epochs": 1, "lr": 0.05, "batch_size": 64, "show_progress": False}



@pytest.fixture(scope="module")
def digits():
    return pdata.load("digits", "train"), pdata.load("digits", "test")


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---- the objective ----------------------------------------------------------------------------


def test_penalty_is_the_mean_squared_norm_of_each_examples_loss_gradient():
    torch.manual_seed(0)
    model = pm.build("cnn", 10, (1, 8, 8))
    x, y = torch.rand(5, 1, 8, 8), torch.tensor([0, 3, 3, 9, 1])

    ce, penalty, logits = input_gradient_penalty(model, x, y)

    norms = []
    for i in range(5):  # one example at a time: no batch effects possible
        xi = x[i : i + 1].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xi), y[i : i + 1]), xi)
        norms.append(g.pow(2).sum())
    assert torch.allclose(penalty, torch.stack(norms).mean(), rtol=1e-5)
    assert torch.allclose(ce, F.cross_entropy(model(x), y)) and torch.allclose(logits, model(x))


def test_penalty_matches_the_closed_form_for_a_linear_model():
    torch.manual_seed(1)
    model = pm.build("linear", 4, (1, 2, 3)).double()
    x, y = torch.rand(6, 1, 2, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1])

    _, penalty, _ = input_gradient_penalty(model, x, y)

    # d CE / dx = W^T (softmax(Wx + b) - onehot(y)) for logits Wx + b.
    W, b = model.fc.weight, model.fc.bias
    p = torch.softmax(x.flatten(1) @ W.T + b, dim=1)
    grad = (p - F.one_hot(y, 4).double()) @ W
    assert torch.allclose(penalty, grad.pow(2).sum(1).mean(), rtol=1e-10)


def test_penalty_is_differentiable_in_the_weights():
    torch.manual_seed(2)
    layer = nn.Linear(5, 3).double()
    x, y = torch.rand(4, 5, dtype=torch.float64), torch.tensor([0, 2, 1, 2])

    def penalty_of(weight, bias):
        return input_gradient_penalty(lambda z: F.linear(z, weight, bias), x, y)[1]

    weight = layer.weight.detach().requires_grad_(True)
    bias = layer.bias.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(penalty_of, (weight, bias))  # double backprop is exact


def test_objective_adds_lambda_times_penalty_and_the_extra_loss():
    torch.manual_seed(3)
    model = pm.build("cnn", 10, (1, 8, 8))
    x, y = torch.rand(4, 1, 8, 8), torch.tensor([1, 2, 3, 4])
    seen = {}

    def extra(m, xb, yb, logits):
        seen.update(model=m, x=xb, y=yb, logits=logits)
        return torch.tensor(0.75)

    ce, penalty, _ = input_gradient_penalty(model, x, y)
    loss, logits = objective(model, x, y, grad_reg=1e-2, extra_loss=extra)

    assert torch.allclose(loss, ce + 1e-2 * penalty + 0.75)
    assert seen["model"] is model and torch.equal(seen["x"], x) and seen["logits"] is logits
    assert torch.allclose(objective(model, x, y)[0], F.cross_entropy(model(x), y))


def test_gradient_regularisation_makes_the_model_flatter(digits):
    train_ds, test_ds = digits
    penalties = []
    X, Y = test_ds.tensors()
    for lam in (0.0, 1e-1, 1.0):
        result = train(train_ds, "linear", **{**QUICK, "epochs": 3}, grad_reg=lam, test_dataset=test_ds)
        penalties.append(float(input_gradient_penalty(result.model, X, Y)[1].detach()))
        assert result.meta["grad_reg"] == lam
    assert penalties[0] > penalties[1] > penalties[2] and penalties[2] < 0.5 * penalties[0]


# ---- training runs ----------------------------------------------------------------------------


def test_training_learns_digits_and_records_its_metadata(tmp_path, digits):
    path = tmp_path / "digits_linear.pt"

    result = train("digits", "linear", epochs=3, lr=0.05, batch_size=64, out=path, show_progress=False)

    meta = result.meta
    for key in ("dataset", "arch", "num_classes", "input_shape", "grad_reg", "epochs", "seed", "test_accuracy",
                "probust_version", "created", "history", "classes"):  # fmt: skip
        assert key in meta, key
    assert (meta["dataset"], meta["arch"], meta["epochs"], meta["epochs_completed"]) == ("digits", "linear", 3, 3)
    assert meta["complete"] and len(meta["history"]) == 3
    assert meta["test_accuracy"] > 0.85  # chance is 0.1
    assert meta["test_accuracy"] == evaluate(result.model, digits[1])
    assert json.loads(pm.sidecar_path(path).read_text()) == meta
    loaded, loaded_meta = pm.load_model(path, expect_num_classes=10, expect_input_shape=(1, 8, 8))
    X, _ = digits[1].tensors()
    assert torch.equal(loaded(X), result.model(X)) and loaded_meta == meta


class CrashAt:
    """An extra loss of zero that raises on its n-th call, like a run killed mid-epoch."""

    def __init__(self, n: int | None) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model, x, y, logits):
        self.calls += 1
        if self.n is not None and self.calls == self.n:
            raise KeyboardInterrupt
        return logits.sum() * 0.0


def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(tmp_path, digits):
    train_ds, test_ds = digits
    settings = dict(arch="cnn", epochs=2, lr=0.05, batch_size=128, show_progress=False, test_dataset=test_ds)
    whole = train(train_ds, **settings, extra_loss=CrashAt(None), out=tmp_path / "whole.pt")

    with pytest.raises(KeyboardInterrupt):  # 12 batches per epoch: dies in epoch 2
        train(train_ds, **settings, extra_loss=CrashAt(15), out=tmp_path / "cut.pt")
    partial = pm.read_checkpoint(tmp_path / "cut.pt")
    assert partial["meta"]["epochs_completed"] == 1 and not partial["meta"]["complete"]
    assert partial["train_state"] is not None

    resumed_epochs = []
    resumed = train(train_ds, **settings, extra_loss=CrashAt(None), out=tmp_path / "cut.pt",
                    on_epoch_end=lambda epoch, meta: resumed_epochs.append(epoch))  # fmt: skip

    assert resumed_epochs == [2]
    for key, value in _weights(whole.model).items():
        assert torch.equal(value, _weights(resumed.model)[key]), key
    assert resumed.meta["test_accuracy"] == whole.meta["test_accuracy"]
    assert pm.read_checkpoint(tmp_path / "cut.pt")["train_state"] is None  # finished: no optimiser state kept


def test_finished_run_is_returned_without_training_again(tmp_path, digits):
    path = tmp_path / "m.pt"
    first = train(digits[0], "linear", **QUICK, test_dataset=digits[1], out=path)
    calls = []

    again = train(digits[0], "linear", **QUICK, test_dataset=digits[1], out=path, on_epoch_end=lambda *a: calls.append(a))

    assert calls == [] and again.meta == first.meta
    assert all(torch.equal(a, b) for a, b in zip(_weights(first.model).values(), _weights(again.model).values()))


def test_resume_refuses_a_run_with_other_settings(tmp_path, digits):
    path = tmp_path / "m.pt"
    train(digits[0], "linear", **QUICK, out=path)

    with pytest.raises(pm.CheckpointMismatchError, match=r"lr=0\.05 there, 0\.1 asked.*resume=False"):
        train(digits[0], "linear", **{**QUICK, "lr": 0.1}, out=path)
    restarted = train(digits[0], "linear", **{**QUICK, "lr": 0.1}, out=path, resume=False)
    assert restarted.meta["lr"] == 0.1


def test_resume_over_a_foreign_file_says_how_to_overwrite_it(tmp_path, digits):
    path = tmp_path / "notes.pt"
    path.write_text("not a checkpoint")
    with pytest.raises(pm.CheckpointError, match="not a probust checkpoint.*resume=False"):
        train(digits[0], "linear", **QUICK, out=path)


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


def test_augmentation_crops_and_flips_each_image():
    x = torch.rand(6, 3, 8, 8)
    out = _augment(x, torch.Generator().manual_seed(0), pad=2)
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(6):
        views = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], v) or torch.equal(out[i], v.flip(-1)) for v in views)


def test_bad_hyper_parameters_are_refused_before_any_work():
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        train("digits", "linear", epochs=0)
    with pytest.raises(ValueError, match="lr must be a positive number"):
        train("digits", "linear", lr=-1.0)
    with pytest.raises(ValueError, match="unknown schedule 'warm'; known schedules: cosine, step, constant"):
        train("digits", "linear", schedule="warm")
    with pytest.raises(ValueError, match="unknown architecture 'mlp'"):
        train("digits", "mlp")
    with pytest.raises(ValueError, match="unknown data set 'imagenet'"):
        train("imagenet", "linear")


# ---- the larger architectures on tiny data ------------------------------------------------------


def _tiny_cifar10(root: Path, per_batch: int = 2) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, per_batch).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_resnet18_trains_a_step_on_tiny_cifar_files_with_gradient_regularisation(tmp_path, monkeypatch):
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {})
    _tiny_cifar10(tmp_path / "data")
    torch.manual_seed(0)
    init = _weights(pm.build("resnet18", 10, (3, 32, 32)))

    result = train("cifar10", "resnet18", epochs=1, batch_size=10, lr=0.01, grad_reg=1e-3, root=tmp_path / "data",
                   out=tmp_path / "r18.pt", show_progress=False)  # fmt: skip

    assert result.meta["augment"] is True and result.meta["dataset"] == "cifar10"
    assert result.meta["arch_kwargs"]["mean"] == [0.4914, 0.4822, 0.4465]
    assert not torch.equal(init["net.conv1.weight"], _weights(result.model)["net.conv1.weight"])
    model, _ = pm.load_model(tmp_path / "r18.pt", expect_arch="resnet18", expect_dataset="cifar10")
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_vit_trains_a_step_on_a_small_data_set(digits):
    pytest.importorskip("transformers")
    config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}

    result = train(digits[0].subset(range(32)), "vit", epochs=1, batch_size=16, lr=0.01, grad_reg=1e-3,
                   test_dataset=digits[1].subset(range(16)), arch_kwargs={"config": config}, show_progress=False)  # fmt: skip

    assert result.meta["arch_kwargs"]["config"]["hidden_size"] == 16
    assert 0.0 <= result.meta["test_accuracy"] <= 1.0 and math.isfinite(result.meta["history"][0]["train_loss"])


# ---- the CLI ----------------------------------------------------------------------------------


def test_cli_trains_saves_and_then_finds_the_run_complete(tmp_path, capsys):
    out = tmp_path / "models" / "digits_linear.pt"
    argv = ["train", "--data", "digits", "--arch", "linear", "--epochs", "2", "--out", str(out), "--threads", "1", "--device", "cpu"]

    assert main(argv) == 0
    first = json.loads(pm.sidecar_path(out).read_text())
    assert main(argv) == 0

    assert first["epochs_completed"] == 2 and first["test_accuracy"] > 0.5
    assert json.loads(pm.sidecar_path(out).read_text()) == first
    assert "test accuracy" in capsys.readouterr().out


def test_cli_names_the_known_data_sets_and_architectures(tmp_path, capsys):
    assert main(["train", "--data", "svhn", "--arch", "cnn", "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "known data sets: mnist, fashion-mnist, cifar10, cifar100, digits" in err
    assert main(["train", "--data", "digits", "--arch", "mlp", "--out", str(tmp_path / "m.pt")]) == 2
    assert "known architectures: linear, cnn, resnet18, vit" in capsys.readouterr().err
    assert main(["train", "--data", "digits", "--arch", "cnn", "--out", str(tmp_path / "m.pt"), "--grad-reg", "-1"]) == 2


def test_cli_passes_architecture_options_and_refuses_unknown_ones(tmp_path, capsys):
    out = tmp_path / "m.pt"
    base = ["train", "--data", "digits", "--arch", "cnn", "--epochs", "1", "--out", str(out), "--quiet"]
    assert main(base + ["--arch-kwargs", '{"pool": false}']) == 0
    assert pm.load_model(out)[1]["arch_kwargs"]["pool"] is False
    assert main(base + ["--arch-kwargs", '{"poool": false}', "--no-resume"]) == 2
    assert "unexpected keyword argument 'poool'" in capsys.readouterr().err
    assert main(base + ["--arch-kwargs", "{pool: no}"]) == 2


def test_cli_missing_data_set_exits_1_with_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {})
    code = main(["train", "--data", "mnist", "--arch", "cnn", "--out", str(tmp_path / "m.pt"), "--root", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "train-images-idx3-ubyte" in err and "--download" in err and "Traceback" not in err


# ---- the paper's Fashion-MNIST models (minutes: `pytest -m slow`) ----------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, arch_kwargs, lr, floor",
    [
        ("linear", {}, 0.01, 0.835),  # measured 0.844 (paper: 84%)
        # measured 0.905 on one build machine, 0.8988 on another with the same code, seed and
        # one thread (each CPU's kernels round differently; ten epochs of SGD amplify it); paper: 91%
        ("cnn", {}, 0.05, 0.895),
        ("cnn", {"pool": False}, 0.02, 0.905),  # measured 0.909
    ],
    ids=["linear", "cnn", "cnn-no-pool"],
)
def test_fashion_mnist_models_reach_the_papers_accuracy(tmp_path, arch, arch_kwargs, lr, floor):
    # selected by its marker alone (`make test-all`, `pytest -m slow`), like every slow test
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not installed in {FMNIST_DIR} (apt-get install dataset-fashion-mnist)")
    result = train("fashion-mnist", arch, epochs=10, lr=lr, batch_size=128, arch_kwargs=arch_kwargs,
                   out=tmp_path / f"{arch}.pt", show_progress=False, num_threads=1)  # fmt: skip
    assert result.meta["test_accuracy"] >= floor
