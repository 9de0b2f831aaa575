"""Training for average-case robustness: RobustLoss through probust.train and `probust train`.

The oracle for "it works" is plain Monte Carlo on held-out points: the robustly trained model
keeps its predictions under noise more often than the same model trained without the term.
"""

from __future__ import annotations

import json

import pytest
import torch

import probust
import probust.data as pdata
import probust.models
from probust.cli import main
from probust.train import train

SIGMA = 0.3



@pytest.fixture(scope="module")
def digits():
    return pdata.load("digits", "train"), pdata.load("digits", "test")


def _fit(digits, extra_loss=None, grad_reg=0.0):
    train_ds, test_ds = digits
    return train(train_ds, "cnn", epochs=4, lr=0.05, batch_size=64, seed=0, test_dataset=test_ds,
                 show_progress=False, extra_loss=extra_loss, grad_reg=grad_reg)  # fmt: skip


def test_robust_loss_raises_monte_carlo_p_robust_on_held_out_digits(digits):
    plain = _fit(digits)
    # 4 epochs of 22 steps; the weight ramps up over the first two
    robust = _fit(digits, extra_loss=probust.RobustLoss(SIGMA, mu=1.0, warmup_steps=44))
    x = digits[1].tensors()[0][:150]
    mc = lambda m: probust.MonteCarlo(m, SIGMA, n_samples=400, seed=3)(x).p  # noqa: E731
    p_plain, p_robust = mc(plain.model), mc(robust.model)
    assert p_robust.median() > p_plain.median() + 0.02, (p_plain.median(), p_robust.median())
    assert p_robust.mean() > p_plain.mean() + 0.02
    assert robust.meta["test_accuracy"] > plain.meta["test_accuracy"] - 0.03  # at little accuracy cost
    assert robust.meta["extra_loss"].startswith(f"RobustLoss(sigma={SIGMA}, mu=1, cdf='mv-sigmoid'")


def test_without_warmup_a_strong_robust_term_costs_much_accuracy(digits):
    # Documents why warmup_steps exists: from a random initialisation the full term flattens
    # the network towards a constant classifier (p_robust = 1, accuracy towards chance).
    plain = _fit(digits)
    flattened = _fit(digits, extra_loss=probust.RobustLoss(SIGMA, mu=1.0, warmup_steps=0))
    assert flattened.meta["test_accuracy"] < plain.meta["test_accuracy"] - 0.25, (plain.meta["test_accuracy"], flattened.meta["test_accuracy"])


def test_cli_trains_with_the_robust_loss_and_records_it(tmp_path, capsys):
    out = tmp_path / "m.pt"
    argv = ["train", "--data", "digits", "--arch", "linear", "--out", str(out), "--epochs", "1",
            "--robust-loss", "0.5", "--robust-sigma", "0.2", "--robust-warmup", "10", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads(probust.models.sidecar_path(out).read_text())
    assert "RobustLoss(sigma=0.2, mu=0.5, cdf='mv-sigmoid'" in saved["extra_loss"]
    assert "warmup_steps=10" in saved["extra_loss"]
    assert "extra loss RobustLoss" in capsys.readouterr().out
    # the same command finds the run complete; another mu is another run
    assert main(argv) == 0
    other = argv[:]
    other[other.index("0.5")] = "0.7"
    assert main(other) == 1  # CheckpointMismatchError: exit 1 with a message


def test_config_names_the_settings_and_is_stored_in_the_checkpoint(tmp_path, digits):
    loss = probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=7)
    cfg = loss.config()
    assert cfg == {"name": "RobustLoss", "mu": 0.5, "sigma": 0.2, "noise": {"noise": "gaussian", "sigma": 0.2}, "cdf": "mv-sigmoid",
                   "linearisation": "taylor", "target": "label", "tol": 1e-3, "max_points": 16, "min_p": 1e-4, "mmse_samples": 5,
                   "warmup_steps": 7}  # fmt: skip
    diagonal = probust.RobustLoss(torch.full((1, 8, 8), 0.1), mu=1.0).config()
    assert diagonal["sigma"] is None and diagonal["noise"]["noise"] == "gaussian-diagonal"
    json.dumps(diagonal)
    train_ds, test_ds = digits
    out = tmp_path / "m.pt"
    kwargs = dict(epochs=1, batch_size=64, seed=0, test_dataset=test_ds, show_progress=False, out=out)
    result = train(train_ds, "linear", extra_loss=loss, **kwargs)
    assert result.meta["extra_loss_config"] == cfg and result.meta["extra_loss"] == repr(loss)
    saved = json.loads(probust.models.sidecar_path(out).read_text())
    assert saved["extra_loss_config"] == cfg
    # the same settings find the run complete; other settings are another run
    again = train(train_ds, "linear", extra_loss=probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=7), **kwargs)
    assert again.meta["created"] == result.meta["created"]
    with pytest.raises(probust.models.CheckpointMismatchError, match="extra_loss"):
        train(train_ds, "linear", extra_loss=probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=8), **kwargs)
    # a plain callable has no config: only its name is recorded
    plain = train(train_ds, "linear", extra_loss=lambda m, x, y, logits: x.new_zeros(()), **{**kwargs, "out": None})
    assert plain.meta["extra_loss"].endswith("<lambda>") and "extra_loss_config" not in plain.meta


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--robust-loss", "0.5"], "--robust-sigma"),
        (["--robust-loss", "-1", "--robust-sigma", "0.2"], "--robust-loss must be >= 0"),
        (["--robust-loss", "1", "--robust-sigma", "0"], "--robust-sigma must be a positive number"),
        (["--robust-loss", "1", "--robust-sigma", "0.2", "--robust-warmup", "-5"], "--robust-warmup must be >= 0"),
    ],
)
def test_cli_refuses_bad_robust_loss_flags(tmp_path, capsys, extra, message):
    argv = ["train", "--data", "digits", "--arch", "linear", "--out", str(tmp_path / "m.pt"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_resumed_robust_training_continues_the_warmup_and_ends_with_the_same_weights(tmp_path, digits):
    train_ds, test_ds = digits
    train_ds = train_ds.subset(list(range(256)))  # 4 steps per epoch at batch 64
    settings = dict(epochs=3, lr=0.05, batch_size=64, seed=0, test_dataset=test_ds, show_progress=False)
    loss = lambda: probust.RobustLoss(SIGMA, mu=1.0, max_points=16, warmup_steps=10)  # noqa: E731
    whole = train(train_ds, "linear", extra_loss=loss(), out=tmp_path / "whole.pt", **settings)

    def stop_after_first_epoch(epoch, meta):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the checkpoint of epoch 1 (4 of the 10 warm-up steps) is written
        train(train_ds, "linear", extra_loss=loss(), out=tmp_path / "cut.pt", on_epoch_end=stop_after_first_epoch, **settings)
    assert probust.models.read_checkpoint(tmp_path / "cut.pt")["train_state"]["extra_loss"] == {"calls": 4}
    resumed_loss = loss()  # a new process: a new loss object, its count back at 0
    resumed = train(train_ds, "linear", extra_loss=resumed_loss, out=tmp_path / "cut.pt", **settings)
    assert resumed_loss.calls == 12
    assert [h["train_loss"] for h in resumed.meta["history"]] == [h["train_loss"] for h in whole.meta["history"]]
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


def test_robust_loss_state_round_trips_and_refuses_a_bad_count():
    loss = probust.RobustLoss(SIGMA, mu=2.0, warmup_steps=10)
    other = probust.RobustLoss(SIGMA, mu=2.0, warmup_steps=10)
    loss.calls = 7
    other.load_state_dict(loss.state_dict())
    assert other.calls == 7 and other.weight() == loss.weight() == 2.0 * 8 / 10
    with pytest.raises(ValueError, match="calls"):
        other.load_state_dict({"calls": -1})
