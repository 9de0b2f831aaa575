"""probust.issues.Tracker: the history's numbers against hand computations (a linear model, whose
margin gradient is exact), planted errors on a real training, resumption, shards and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import ndtr
from sklearn.metrics import roc_auc_score
from torch import nn

from probust.issues import COLUMNS, HISTORY_COLUMNS, Tracker
from probust.run import ConfigError, ConfigMismatchError
from tests._helpers import linear_model

SIGMA = 0.5


def _data(n: int = 30, d: int = 6, classes: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def _by_hand(model: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """Margin over the strongest rival, z = margin / (sigma ||w_y - w_j||), loss, for a linear model."""
    w, b = model.weight.detach().double(), model.bias.detach().double()
    logits = x.double() @ w.T + b
    rows = torch.arange(len(y))
    rival = logits.clone()
    rival[rows, y] = -np.inf
    j = rival.argmax(1)
    margin = logits[rows, y] - logits[rows, j]
    z = margin / (SIGMA * (w[y] - w[j]).norm(dim=1))
    loss = torch.logsumexp(logits, 1) - logits[rows, y]
    return {"margin": margin.numpy(), "z": z.numpy(), "loss": loss.numpy(), "logits": logits.numpy()}


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_the_cumulative_scores_are_the_hand_computed_sums_over_updates():
    x, y = _data()
    models = [linear_model(6, 4, s) for s in (1, 2, 3)]
    tracker = Tracker((x, y), sigma=SIGMA, gradient_every=1, keep_history=True)
    for m in models:
        tracker.update(m)
    df = tracker.find_issues()
    hand = [_by_hand(m, x, y) for m in models]
    z = np.stack([h["z"] for h in hand])
    np.testing.assert_allclose(df["label_score"], z.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(df["is_label_issue"], z.mean(0) < 0)
    np.testing.assert_allclose(df["cumulative_loss"], sum(h["loss"] for h in hand), rtol=1e-5)
    mean_margin = np.mean([h["margin"] for h in hand], 0)
    np.testing.assert_allclose(df["mean_margin"], mean_margin, rtol=1e-5, atol=1e-6)
    correct = np.stack([h["margin"] > 0 for h in hand])
    np.testing.assert_array_equal(df["forgetting"], (correct[:-1] & ~correct[1:]).sum(0))
    np.testing.assert_allclose(df["p_label"], ndtr(z[-1]), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(df["p_robust"], ndtr(np.abs(z[-1])), rtol=1e-4, atol=1e-7)
    probs = _softmax(hand[-1]["logits"])
    np.testing.assert_allclose(df["outlier_score"], 1 - probs.max(1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(df["self_confidence"], probs[np.arange(len(y)), y.numpy()], rtol=1e-5)
    last = probs.argmax(1)
    assert (df["prediction"].to_numpy() == last).all()
    fits = last == y.numpy()
    np.testing.assert_allclose(df["memorisation_score"], np.where(fits, 1 / (1 + np.exp(mean_margin)), 0), rtol=1e-5)
    assert list(df.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert list(df.columns[len(COLUMNS) :]) == list(HISTORY_COLUMNS)
    np.testing.assert_allclose(tracker.history["margin"], [h["margin"] for h in hand], rtol=1e-5, atol=1e-6)
    assert (df["updates"] == 3).all()


def test_each_margin_is_measured_against_the_next_computed_gradient():
    """gradient_every=2 over five updates: gradients at updates 0, 2 and 4; the margins of updates
    1 and 2 are divided by update 2's gradient norm, those of 3 and 4 by update 4's."""
    x, y = _data()
    models = [linear_model(6, 4, s) for s in (1, 2, 3, 4, 5)]
    tracker = Tracker((x, y), sigma=SIGMA, gradient_every=2)
    hand = [_by_hand(m, x, y) for m in models]
    for m in models:
        tracker.update(m)
    norm = [h["margin"] / (SIGMA * h["z"]) for h in hand]  # ||w_y - w_j|| of each update
    expected = (
        hand[0]["margin"] / norm[0]
        + (hand[1]["margin"] + hand[2]["margin"]) / norm[2]
        + (hand[3]["margin"] + hand[4]["margin"]) / norm[4]
    ) / (5 * SIGMA)
    np.testing.assert_allclose(tracker.find_issues()["label_score"], expected, rtol=1e-5, atol=1e-6)
    tracker.update(linear_model(6, 4, 6))  # update 5 computes no gradient: its margin waits, against update 4's
    six = _by_hand(linear_model(6, 4, 6), x, y)["margin"] / (SIGMA * norm[4])
    np.testing.assert_allclose(tracker.find_issues()["label_score"], (expected * 5 + six) / 6, rtol=1e-5, atol=1e-6)


def test_learned_at_is_the_update_from_which_the_label_stays_predicted():
    x, y = _data(n=1)
    model = nn.Linear(6, 4)
    tracker = Tracker((x, y), sigma=SIGMA)
    label = int(y[0])
    # logits favour the label at updates 1 and 3 and 4, another class at 0 and 2.
    for favoured in (False, True, False, True, True):
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
            model.bias[label if favoured else (label + 1) % 4] = 1.0
            model.weight[:, 0] = torch.arange(4.0) * 1e-3  # a non-zero margin gradient
        tracker.update(model)
    row = tracker.find_issues().iloc[0]
    assert row["learned_at"] == 3 and row["forgetting"] == 1


def test_the_model_keeps_its_mode_and_its_parameters_get_no_gradient():
    x, y = _data()
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 4)).train()
    model[1].eval()
    Tracker((x, y), sigma=SIGMA).update(model)
    assert model.training and model[0].training and not model[1].training
    assert all(p.grad is None for p in model.parameters())


def test_resuming_from_a_saved_tracker_gives_the_uninterrupted_numbers(tmp_path):
    x, y = _data()
    models = [linear_model(6, 4, s) for s in (1, 2, 3, 4)]
    whole = Tracker((x, y), sigma=SIGMA)
    for m in models:
        whole.update(m)
    first = Tracker((x, y), sigma=SIGMA)
    for m in models[:2]:
        first.update(m)
    first.save(tmp_path / "t.npz")
    resumed = Tracker((x, y), sigma=SIGMA).load(tmp_path / "t.npz")
    for m in models[2:]:
        resumed.update(m)
    a, b = whole.find_issues(), resumed.find_issues()
    assert a.equals(b)


def test_a_saved_tracker_of_other_points_is_refused(tmp_path):
    x, y = _data()
    t = Tracker((x, y), sigma=SIGMA)
    t.update(linear_model(6, 4, 1))
    t.save(tmp_path / "t.npz")
    with pytest.raises(ConfigMismatchError, match="labels") as info:
        Tracker((x, (y + 1) % 4), sigma=SIGMA).load(tmp_path / "t.npz")
    assert info.value.field == "state"
    with pytest.raises(ConfigMismatchError, match="sigma"):
        Tracker((x, y), sigma=0.2).load(tmp_path / "t.npz")


def test_shards_merged_give_the_numbers_of_one_tracker():
    x, y = _data(n=31)
    models = [linear_model(6, 4, s) for s in (1, 2)]
    one = Tracker((x, y), sigma=SIGMA)
    shards = [Tracker((x, y), sigma=SIGMA, shard=(r, 3)) for r in range(3)]
    for m in models:
        one.update(m)
        for s in shards:
            s.update(m)
    assert Tracker.merge(shards).equals(one.find_issues())
    with pytest.raises(ConfigError, match="cover"):
        Tracker.merge(shards[:2])


def test_points_that_change_between_updates_are_refused():
    x, y = _data()

    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return x[i] + 0.01 * torch.randn(x.shape[1]), int(y[i])

    tracker = Tracker(Augmented(), sigma=SIGMA)
    tracker.update(linear_model(6, 4, 1))
    with pytest.raises(ConfigError, match="changed since the first update") as info:
        tracker.update(linear_model(6, 4, 1))
    assert info.value.field == "data"


def test_a_model_with_another_number_of_classes_is_refused():
    x, y = _data()
    tracker = Tracker((x, y), sigma=SIGMA)
    tracker.update(linear_model(6, 4, 1))
    with pytest.raises(ConfigError, match="5 classes where") as info:
        tracker.update(linear_model(6, 5, 1))
    assert info.value.field == "model"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sigma": [0.1, 0.3]}, "sigma"),
        ({"sigma": -1.0}, "sigma"),
        ({"shard": (2, 2)}, "shard"),
        ({"batch_size": 0}, "batch_size"),
        ({"gradient_every": 0}, "gradient_every"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, field):
    x, y = _data()
    with pytest.raises(ConfigError) as info:
        Tracker((x, y), **kwargs)
    assert info.value.field == field


def test_labels_outside_the_models_classes_are_refused():
    x, y = _data()
    y[3] = 7
    with pytest.raises(ConfigError, match="label 7 of point 3") as info:
        Tracker((x, y), sigma=SIGMA).update(linear_model(6, 4, 1))
    assert info.value.field == "data"


def test_find_issues_before_any_update_says_what_to_do():
    x, y = _data()
    with pytest.raises(ConfigError, match=r"tracker.update\(model\)"):
        Tracker((x, y), sigma=SIGMA).find_issues()


def _ddp_worker(rank: int, port: int, queue) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        x, y = _data(n=31)
        tracker = Tracker((x, y), sigma=SIGMA)  # its shard from the process group
        for s in (1, 2):
            tracker.update(linear_model(6, 4, s))
        frame = tracker.find_issues()
        queue.put((rank, len(tracker.indices), frame.to_dict("list")))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_give_one_frame_equal_to_one_process():
    import socket

    import pandas as pd
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_ddp_worker, args=(r, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = {rank: (size, frame) for rank, size, frame in (queue.get(timeout=240) for _ in procs)}
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    x, y = _data(n=31)
    one = Tracker((x, y), sigma=SIGMA)
    for s in (1, 2):
        one.update(linear_model(6, 4, s))
    expected = one.find_issues()
    assert results[0][0] == 16 and results[1][0] == 15  # each rank tracked its shard
    for rank in (0, 1):
        pd.testing.assert_frame_equal(pd.DataFrame(results[rank][1]), expected, check_dtype=False)


def _digits(n: int = 600, noise: float = 0.15, seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:n, None] / 16.0, dtype=torch.float32)
    y_true = torch.tensor(d.target[:n], dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    flip = torch.rand(n, generator=g) < noise
    y = torch.where(flip, (y_true + torch.randint(1, 10, (n,), generator=g)) % 10, y_true)
    return x, y, y_true


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))


def test_planted_errors_rank_first_early_in_a_plain_training_loop_that_memorises_them():
    x, y, y_true = _digits()
    bad = (y != y_true).numpy()
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tracker = Tracker((x, y), sigma=0.3)
    early = None
    for epoch in range(40):
        for b in torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch)).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        tracker.update(model)
        if epoch == 4:
            early = roc_auc_score(bad, -tracker.find_issues()["label_score"])
    df = tracker.find_issues()
    final_fit = (df["prediction"] == df["label"]).mean()
    assert final_fit >= 0.96  # the network has memorised most planted errors (85% of labels are right)
    final_softmax = roc_auc_score(bad, -df["self_confidence"])
    history = roc_auc_score(bad, -df["label_score"])
    assert early > 0.95 and history > 0.97
    assert history > final_softmax + 0.05  # what watching the run adds over the finished model
    # the lowest-scored share equal to the noise rate is mostly planted errors, with no ties
    k = int(bad.sum())
    top = np.argsort(df["label_score"].to_numpy(), kind="stable")[:k]
    assert bad[top].mean() > 0.85
    assert df["label_score"].nunique() == len(df)


def test_hard_clean_points_are_not_flagged():
    """Clean points the network learns late (wrong at the first updates, right from then on) are
    not flagged; the planted errors mostly are."""
    x, y, y_true = _digits()
    bad = (y != y_true).numpy()
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tracker = Tracker((x, y), sigma=0.3, keep_history=True)
    for epoch in range(30):
        for b in torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch)).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        tracker.update(model)
    df = tracker.find_issues()
    margins = tracker.history["margin"]
    hard = (~bad) & (margins[0] < 0) & (margins[3:] > 0).all(0)
    assert hard.sum() >= 5
    flagged = df["is_label_issue"].to_numpy()
    assert not flagged[hard].any()
    tp = (flagged & bad).sum()
    assert tp / flagged.sum() > 0.85 and tp / bad.sum() > 0.8


class _StopAfter:
    """on_epoch_end that interrupts the run after ``n`` epochs, like a killed job."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, epoch, meta):
        if epoch == self.n:
            raise KeyboardInterrupt


def test_probust_training_updates_the_tracker_each_epoch_and_a_resumed_run_misses_none(tmp_path):
    import shutil

    import probust.training
    from probust.data import load
    from probust.training.loop import tracker_path

    train_ds = load("digits", "train")
    x, y = train_ds.tensors()
    settings = dict(epochs=3, lr=0.05, batch_size=128, show_progress=False, test_dataset=None)

    def run(out, stop=None):
        tracker = Tracker((x, y), sigma=0.3)
        probust.training.train(train_ds, "linear", out=tmp_path / out, tracker=tracker, on_epoch_end=stop, **settings)
        return tracker

    whole = run("whole.pt")
    assert whole.updates == 3
    for out, stop in (("cut.pt", 2), ("window.pt", 2), ("early.pt", 1)):
        with pytest.raises(KeyboardInterrupt):
            run(out, _StopAfter(stop))
    # cut.pt: stopped after epoch 2's checkpoint and tracker state: the tracker goes on from both.
    assert run("cut.pt").find_issues().equals(whole.find_issues())
    # window.pt: stopped between epoch 2's checkpoint and its tracker state (the state has epoch 1
    # only): epoch 2 is recorded from the restored model.
    shutil.copy(tracker_path(tmp_path / "early.pt"), tracker_path(tmp_path / "window.pt"))
    assert run("window.pt").find_issues().equals(whole.find_issues())
    # no tracker state for two trained epochs: refused, not silently short of them
    with pytest.raises(KeyboardInterrupt):
        run("lost.pt", _StopAfter(2))
    tracker_path(tmp_path / "lost.pt").unlink()
    with pytest.raises(ValueError, match="tracker state"):
        run("lost.pt")


def test_a_lightning_trainer_updates_the_tracker_every_epoch_and_checkpoints_it(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from probust.issues import TrackerCallback

    x, y, _ = _digits(n=256)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    tracker = Tracker((x, y), sigma=0.3)
    module = Module()
    trainer = L.Trainer(
        max_epochs=3,
        callbacks=[TrackerCallback(tracker)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        accelerator="cpu",
    )
    trainer.fit(module, loader)
    assert tracker.updates == 3 and module.training  # Lightning's mode is given back
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    state = next(v for k, v in checkpoint["callbacks"].items() if "TrackerCallback" in k)
    again = Tracker((x, y), sigma=0.3)
    again.load_state_dict(state)
    assert again.find_issues().equals(tracker.find_issues())
    with pytest.raises(ConfigError):
        TrackerCallback(tracker, every_n_epochs=0)
