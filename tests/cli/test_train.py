"""`probust train`: it trains, saves, resumes, and maps bad flags to exit 2 and missing data to exit 1."""

from __future__ import annotations

import json

import pytest

import probust.models as pm
from probust.cli import main
from probust.data import _locate


def test_cli_trains_saves_and_then_finds_the_run_complete(tmp_path, capsys):
    out = tmp_path / "models" / "digits_linear.pt"
    argv = [
        "train",
        "--data",
        "digits",
        "--arch",
        "linear",
        "--epochs",
        "2",
        "--out",
        str(out),
        "--threads",
        "1",
        "--device",
        "cpu",
    ]

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
    assert main(["train", "--data", "digits", "--arch", "gru", "--out", str(tmp_path / "m.pt")]) == 2
    assert "known architectures: linear, cnn, resnet18, vit" in capsys.readouterr().err
    assert (
        main(["train", "--data", "digits", "--arch", "cnn", "--out", str(tmp_path / "m.pt"), "--grad-reg", "-1"]) == 2
    )


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
    code = main(
        [
            "train",
            "--data",
            "mnist",
            "--arch",
            "cnn",
            "--out",
            str(tmp_path / "m.pt"),
            "--root",
            str(tmp_path),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "train-images-idx3-ubyte" in err and "--download" in err and "Traceback" not in err


def test_cli_trains_with_the_robust_loss_and_records_it(tmp_path, capsys):
    out = tmp_path / "m.pt"
    argv = [
        "train",
        "--data",
        "digits",
        "--arch",
        "linear",
        "--out",
        str(out),
        "--epochs",
        "1",
        "--robust-loss",
        "0.5",
        "--robust-sigma",
        "0.2",
        "--robust-warmup",
        "10",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    saved = json.loads(pm.sidecar_path(out).read_text())
    assert "RobustLoss(sigma=0.2, mu=0.5, cdf='mv-sigmoid'" in saved["extra_loss"]
    assert "warmup_steps=10" in saved["extra_loss"]
    assert "extra loss RobustLoss" in capsys.readouterr().out
    # the same command finds the run complete; another mu is another run
    assert main(argv) == 0
    other = argv[:]
    other[other.index("0.5")] = "0.7"
    assert main(other) == 1  # CheckpointMismatchError: exit 1 with a message


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--robust-loss", "0.5"], "--robust-sigma"),
        (["--robust-loss", "-1", "--robust-sigma", "0.2"], "--robust-loss: must be a number >= 0"),
        (["--robust-loss", "1", "--robust-sigma", "0"], "--robust-sigma: must be a positive"),
        (
            ["--robust-loss", "1", "--robust-sigma", "0.2", "--robust-warmup", "-5"],
            "--robust-warmup: must be an integer >= 0",
        ),
    ],
)
def test_cli_refuses_bad_robust_loss_flags(tmp_path, capsys, extra, message):
    argv = ["train", "--data", "digits", "--arch", "linear", "--out", str(tmp_path / "m.pt"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
