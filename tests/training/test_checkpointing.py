"""probust.training.checkpointing: resumption is exact, refuses other settings, and reads the old layout."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
import probust.models as pm
from probust.training import RESUME_KEYS, train

QUICK = {"epochs": 1, "lr": 0.05, "batch_size": 64, "show_progress": False}


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


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
    resumed = train(
        train_ds,
        **settings,
        extra_loss=CrashAt(None),
        out=tmp_path / "cut.pt",
        on_epoch_end=lambda epoch, meta: resumed_epochs.append(epoch),
    )

    assert resumed_epochs == [2]
    for key, value in _weights(whole.model).items():
        assert torch.equal(value, _weights(resumed.model)[key]), key
    assert resumed.meta["test_accuracy"] == whole.meta["test_accuracy"]
    assert pm.read_checkpoint(tmp_path / "cut.pt")["train_state"] is None  # finished: no optimiser state kept


def test_finished_run_is_returned_without_training_again(tmp_path, digits):
    path = tmp_path / "m.pt"
    first = train(digits[0], "linear", **QUICK, test_dataset=digits[1], out=path)
    calls = []

    again = train(
        digits[0], "linear", **QUICK, test_dataset=digits[1], out=path, on_epoch_end=lambda *a: calls.append(a)
    )

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


# ---- checkpoints written before probust.training existed (probust.train) ----------------------

# The metadata keys probust.train wrote, in its order (extra_loss_config from 0.1.0 on, only with a
# loss that has config()).
OLD_META_KEYS = (
    "dataset",
    "arch",
    "num_classes",
    "input_shape",
    "arch_kwargs",
    "classes",
    "epochs",
    "lr",
    "batch_size",
    "momentum",
    "weight_decay",
    "schedule",
    "grad_reg",
    "grad_reg_form",
    "augment",
    "seed",
    "train_size",
    "extra_loss",
    "extra_loss_config",
    "epochs_completed",
    "history",
    "train_seconds",
    "created",
    "complete",
    "test_accuracy",
    "device",
    "torch_version",
    "probust_version",
)
# What probust.train recorded as meta["extra_loss"] for RobustLoss(0.3, mu=1.0, max_points=16, warmup_steps=10).
OLD_LOSS_NAME = (
    "RobustLoss(sigma=0.3, mu=1, cdf='mv-sigmoid', linearisation='taylor', target='label', max_points=16, "
    "min_p=0.0001, warmup_steps=10)"
)


def _robust_loss():
    return probust.RobustLoss(0.3, mu=1.0, max_points=16, warmup_steps=10)


def test_metadata_keeps_the_layout_that_older_checkpoints_have(tmp_path, digits):
    result = train(
        digits[0].subset(list(range(256))), "linear", **QUICK, extra_loss=_robust_loss(), out=tmp_path / "m.pt"
    )
    assert list(result.meta) == list(OLD_META_KEYS)
    assert result.meta["extra_loss"] == OLD_LOSS_NAME
    assert set(RESUME_KEYS) < set(OLD_META_KEYS)


@pytest.mark.parametrize("with_loss_config", [True, False], ids=["with-extra_loss_config", "before-extra_loss_config"])
def test_a_checkpoint_in_the_old_layout_resumes_to_the_weights_of_an_uninterrupted_run(
    tmp_path, digits, with_loss_config
):
    train_ds = digits[0].subset(list(range(256)))  # 4 steps per epoch at batch 64
    settings = dict(epochs=3, lr=0.05, batch_size=64, seed=0, test_dataset=digits[1], show_progress=False)
    whole = train(train_ds, "linear", extra_loss=_robust_loss(), **settings)

    def stop(epoch, meta):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(train_ds, "linear", extra_loss=_robust_loss(), out=tmp_path / "cut.pt", on_epoch_end=stop, **settings)
    # Rewrite epoch 1's checkpoint the way probust.train wrote it: its meta keys, its loss name,
    # train_state {"optimizer", "scheduler", "extra_loss"}, through probust.models.save_checkpoint.
    cut = pm.read_checkpoint(tmp_path / "cut.pt")
    keys = [k for k in OLD_META_KEYS if with_loss_config or k != "extra_loss_config"]
    old_meta = {k: cut["meta"][k] for k in keys} | {
        "extra_loss": OLD_LOSS_NAME,
        "epochs_completed": 1,
        "complete": False,
    }
    old_state = {
        "optimizer": cut["train_state"]["optimizer"],
        "scheduler": cut["train_state"]["scheduler"],
        "extra_loss": {"calls": 4},
    }
    model, _ = pm.load_model(tmp_path / "cut.pt")
    pm.save_checkpoint(tmp_path / "old.pt", model, old_meta, train_state=old_state)

    loss, epochs = _robust_loss(), []
    resumed = train(
        train_ds,
        "linear",
        extra_loss=loss,
        out=tmp_path / "old.pt",
        on_epoch_end=lambda epoch, meta: epochs.append(epoch),
        **settings,
    )

    assert epochs == [2, 3] and loss.calls == 12  # the warm-up count continued from 4
    for key, value in _weights(whole.model).items():
        assert torch.equal(value, _weights(resumed.model)[key]), key
    assert resumed.meta["created"] == old_meta["created"]
