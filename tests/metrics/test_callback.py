"""RobustnessCallback in a real Lightning Trainer (two epochs of a linear model on scikit-learn's 8x8
digits, CPU): what it logs equals probust.estimate / probust.certify run directly on the same
points with the model's weights of that epoch."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probust
from probust.errors import OptionError

L = pytest.importorskip("lightning.pytorch")
CSVLogger = pytest.importorskip("lightning.pytorch.loggers").CSVLogger
from probust.metrics import RobustnessCallback  # noqa: E402  (after the skip)

SIGMA = 0.5
MAX_POINTS = 40  # crosses the second validation batch (32 per batch)
RADII = (0.0, 0.25)
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:, None] / 16.0, dtype=torch.float32)  # [N, 1, 8, 8] in [0, 1]
    return x, torch.tensor(d.target, dtype=torch.int64)


def head() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


class Digits(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Snapshots(L.Callback):
    """The network's weights at each (non-sanity) validation epoch, for the oracle."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.weights[trainer.current_epoch] = copy.deepcopy(pl_module.net.state_dict())


def loaders():
    x, y = digits()
    train = torch.utils.data.TensorDataset(x[:256], y[:256])
    val = torch.utils.data.TensorDataset(x[256:320], y[256:320])
    return (
        torch.utils.data.DataLoader(train, batch_size=64),
        torch.utils.data.DataLoader(val, batch_size=32),
        (x[256 : 256 + MAX_POINTS], y[256 : 256 + MAX_POINTS]),
    )


def fit(tmp_path, callbacks, max_epochs: int = 2):
    train, val, points = loaders()
    module = Digits()
    trainer = L.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(module, train, val)
    logged = pd.read_csv(next(tmp_path.rglob("metrics.csv")))
    return trainer, module, logged, points


def model_at(weights: dict[str, torch.Tensor]) -> nn.Module:
    model = head()
    model.load_state_dict(weights)
    return model


def test_logged_values_equal_probust_on_the_same_points_and_weights(tmp_path):
    callback = RobustnessCallback(
        SIGMA, n_samples=4, max_points=MAX_POINTS, certify_radii=RADII, certify_n0=20, certify_n=200
    )
    snapshots = Snapshots()
    trainer, _, logged, (x, y) = fit(tmp_path, [callback, snapshots])
    rows = logged[logged["p_robust/mean"].notna()].set_index("epoch")
    assert list(rows.index) == [0, 1]  # every epoch, the sanity check skipped
    for epoch, weights in snapshots.weights.items():
        model = model_at(weights)
        p = probust.estimate(model, x, SIGMA, "mmse", n_samples=4).numpy()
        certified = (
            probust.certify(model, x, SIGMA, n0=20, n=200, radii=RADII, procedure="sequential")
            .certified_accuracy(y)
            .numpy()
        )
        row = rows.loc[epoch]
        # logged through Lightning in float32
        assert row["p_robust/mean"] == pytest.approx(p.mean(), abs=1e-6)
        for q, value in zip(QUANTILES, np.quantile(p, QUANTILES), strict=True):
            assert row[f"p_robust/q{100 * q:02g}"] == pytest.approx(value, abs=1e-6)
        assert row["p_robust/below_0.5"] == pytest.approx((p < 0.5).mean(), abs=1e-6)
        assert row["p_robust/count"] == MAX_POINTS
        assert row["certified_accuracy/r0"] == pytest.approx(certified[0], abs=1e-6)
        assert row["certified_accuracy/r0.25"] == pytest.approx(certified[1], abs=1e-6)
    assert 0 < rows.loc[1, "p_robust/below_0.5"] < 1 and 0 < rows.loc[1, "certified_accuracy/r0"] < 1
    assert rows.loc[0, "p_robust/mean"] != rows.loc[1, "p_robust/mean"]  # the model changed
    last = trainer.callback_metrics["p_robust/mean"].item()
    assert last == pytest.approx(rows.loc[1, "p_robust/mean"], abs=1e-6)


def test_training_is_the_same_with_and_without_the_callback(tmp_path):
    # No gradient reaches the weights and the module's mode is given back: SGD ends at the same
    # weights bit for bit.
    _, with_cb, _, _ = fit(tmp_path / "with", [RobustnessCallback(SIGMA, "taylor", max_points=MAX_POINTS)])
    _, without, _, _ = fit(tmp_path / "without", [])
    for a, b in zip(with_cb.parameters(), without.parameters(), strict=True):
        assert torch.equal(a, b)


def test_every_n_epochs_and_per_class(tmp_path):
    callback = RobustnessCallback(SIGMA, "taylor", every_n_epochs=2, max_points=None, log_per_class=True)
    snapshots = Snapshots()
    _, _, logged, _ = fit(tmp_path, [callback, snapshots])
    rows = logged[logged["p_robust/mean"].notna()].set_index("epoch")
    assert list(rows.index) == [1]
    _, val, _ = loaders()
    x, y = val.dataset.tensors
    p = probust.estimate(model_at(snapshots.weights[1]), x, SIGMA, "taylor").numpy()
    assert rows.loc[1, "p_robust/count"] == len(x)
    for c in range(10):
        if (y == c).any():
            assert rows.loc[1, f"p_robust/class_{c}"] == pytest.approx(p[(y == c).numpy()].mean(), abs=1e-6)


class _Trainer:
    sanity_checking = False


def test_get_inputs_reads_tuples_dicts_and_a_function():
    x, y = torch.zeros(2, 3), torch.tensor([0, 1])
    callback = RobustnessCallback(SIGMA)
    assert callback.get_inputs((x, y))[1] is y and callback.get_inputs([x])[1] is None
    assert callback.get_inputs({"pixel_values": x, "labels": y})[0] is x
    assert callback.get_inputs(x)[0] is x
    with pytest.raises(OptionError) as info:
        callback.get_inputs({"img": x})
    assert info.value.field == "get_inputs"
    custom = RobustnessCallback(SIGMA, get_inputs=lambda batch: (batch["img"], None))
    assert custom.get_inputs({"img": x})[0] is x


def test_bad_every_n_epochs_names_the_argument():
    with pytest.raises(OptionError) as info:
        RobustnessCallback(SIGMA, every_n_epochs=0)
    assert info.value.field == "every_n_epochs"
