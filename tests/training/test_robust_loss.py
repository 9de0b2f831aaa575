"""probust.training.robust_loss: RobustLoss's value and gradient, its settings, and training with it.

The oracle for "it works" is plain Monte Carlo on held-out points: the robustly trained model
keeps its predictions under noise more often than the same model trained without the term.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import probust
import probust.models
from probust.noise import Gaussian, Laplace, Uniform
from probust.training import RobustLoss, train

F64 = torch.float64
SIGMA = 0.3


def _mlp(classes: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, classes)).double()


def test_robust_loss_is_mu_times_mean_negative_log_p_and_reaches_every_parameter():
    model = _mlp(4, seed=5)
    model.train()
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(4), dtype=F64) * 0.5
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(5))
    for cdf in ("mvn", "mv-sigmoid"):
        loss_fn = probust.RobustLoss(0.3, mu=0.7, cdf=cdf, tol=1e-5, target="label", warmup_steps=0)
        loss = loss_fn(model, x, y, None)
        p = probust.Taylor(model, 0.3, cdf=cdf, tol=1e-5)(x, y).p
        assert loss.item() == pytest.approx(0.7 * (-torch.log(p.clamp_min(loss_fn.min_p))).mean().item(), rel=1e-6)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
        assert model.training, "the model's mode is given back"
    # a step down the loss raises p_robust of the labels (mv-sigmoid: deterministic)
    loss_fn = probust.RobustLoss(0.3, mu=1.0, cdf="mv-sigmoid", warmup_steps=0)
    before = probust.Taylor(model, 0.3, cdf="mv-sigmoid")(x, y).p.log().mean()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn(model, x, y).backward()
    opt.step()
    after = probust.Taylor(model, 0.3, cdf="mv-sigmoid")(x, y).p.log().mean()
    assert after > before


def test_a_training_step_runs_no_trust_check_and_warns_nothing(monkeypatch):
    # The loss needs p and its gradient: the trust check's forward passes and its warning would
    # come with every step (a tanh net at a large sigma, where the check would flag points).
    from probust.estimators import trust
    from probust.estimators.linearised import Linearised

    checked = []
    original = Linearised._check
    monkeypatch.setattr(
        Linearised, "_check", lambda self, *a, **k: checked.append(self.check_draws) or original(self, *a, **k)
    )
    model = _mlp(4, seed=1)
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(2), dtype=F64) * 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", trust.LinearisationWarning)
        for linearisation in ("taylor", "mmse"):
            y = torch.zeros(len(x), dtype=torch.int64)
            loss = probust.RobustLoss(3.0, mu=1.0, linearisation=linearisation, warmup_steps=0)(model, x, y)
            loss.backward()
    assert checked and set(checked) == {0}  # the check is asked for no draw
    with pytest.warns(trust.LinearisationWarning):  # the premise: a check would flag points here
        probust.Taylor(model, 3.0, check_draws=32)(x)


def test_robust_loss_per_example_is_capped_at_minus_log_min_p_for_badly_wrong_examples():
    # A misclassified example whose input gradient is tiny has z = c / (sigma |u|) near -inf:
    # uncapped, its term (and gradient) grows without bound and training diverges.
    model = torch.nn.Linear(2, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1e-3, 0.0], [0.0, 0.0]], dtype=F64))
        model.bias.copy_(torch.tensor([0.0, 5.0], dtype=F64))
    x = torch.tensor([[0.5, 0.5], [0.1, -0.2]], dtype=F64)
    y = torch.tensor([0, 1])  # the first is wrong by a margin of 5 at |u| = 1e-3; the second right
    for cdf in ("mv-sigmoid", "mvn"):
        loss_fn = probust.RobustLoss(0.3, mu=1.0, cdf=cdf, warmup_steps=0, min_p=1e-4)
        per_example = loss_fn.neg_log_p(model, x, y)
        assert per_example[0].item() == pytest.approx(-math.log(1e-4))
        assert per_example[1].item() < 1e-6
        grads = torch.autograd.grad(loss_fn(model, x, y), list(model.parameters()))
        # the capped example adds nothing to the gradient: the mean over both examples has half
        # the gradient of the well-classified example alone (oracle), not merely a bounded one
        alone = torch.autograd.grad(loss_fn(model, x[1:], y[1:]), list(model.parameters()))
        for g, g_alone in zip(grads, alone):
            torch.testing.assert_close(g, 0.5 * g_alone, rtol=1e-12, atol=1e-300)


def test_robust_loss_refuses_bad_settings():
    with pytest.raises(ValueError, match="mu"):
        probust.RobustLoss(0.3, mu=-1)
    with pytest.raises(ValueError, match="cdf"):
        probust.RobustLoss(0.3, cdf="probit")
    with pytest.raises(ValueError, match="target"):
        probust.RobustLoss(0.3, target="both")
    with pytest.raises(ValueError, match="sigma"):
        probust.RobustLoss(0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        probust.RobustLoss(0.3, warmup_steps=-1)


def test_robust_loss_weight_ramps_up_over_the_warmup_steps():
    model = _mlp(3, seed=1)
    x = torch.randn(4, 6, dtype=F64)
    y = torch.zeros(4, dtype=torch.long)
    loss_fn = probust.RobustLoss(0.3, mu=2.0, warmup_steps=4)
    full = probust.RobustLoss(0.3, mu=2.0, warmup_steps=0)(model, x, y).item()
    values = [loss_fn(model, x, y).item() for _ in range(6)]
    np.testing.assert_allclose(values, [full * f for f in (0.25, 0.5, 0.75, 1, 1, 1)], rtol=1e-9)


# ---- settings as a dict -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss",
    [
        RobustLoss(0.2),
        RobustLoss(
            0.25,
            mu=2.5,
            cdf="mvn",
            linearisation="mmse",
            target="prediction",
            tol=1e-4,
            max_points=8,
            min_p=1e-3,
            mmse_samples=3,
            warmup_steps=0,
        ),
        RobustLoss(Uniform(0.1), mu=0.5),
        RobustLoss(Laplace(0.3), mu=0.5, cdf="mvn"),
    ],
    ids=["defaults", "every-setting", "uniform", "laplace"],
)
def test_from_config_rebuilds_a_loss_with_the_same_settings_and_value(loss):
    cfg = json.loads(json.dumps(loss.config()))  # as read back from a checkpoint's sidecar
    rebuilt = RobustLoss.from_config(cfg)
    assert rebuilt.config() == loss.config() and repr(rebuilt) == repr(loss) and type(rebuilt.noise) is type(loss.noise)
    assert rebuilt.calls == 0
    model = _mlp(3, seed=2)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=F64) * 0.3
    y = torch.tensor([0, 1, 2, 1, 0])
    if loss.cdf == "mv-sigmoid":  # closed form: the same settings give the same number
        assert torch.equal(rebuilt.neg_log_p(model, x, y), loss.neg_log_p(model, x, y))


def test_from_config_needs_the_noise_when_the_config_only_summarises_it():
    std = torch.full((1, 8, 8), 0.1)
    cfg = RobustLoss(std, mu=1.0).config()
    with pytest.raises(ValueError, match=r"cfg\['noise'\].*pass it as noise="):
        RobustLoss.from_config(cfg)
    rebuilt = RobustLoss.from_config(cfg, noise=Gaussian(std))
    assert rebuilt.config() == cfg and torch.equal(rebuilt.noise.std, std)
    with pytest.raises(ValueError, match="noise describes itself"):
        RobustLoss.from_config(cfg, noise=Gaussian(0.1))


def test_from_config_refuses_what_is_not_a_robust_loss_config_naming_the_key():
    cfg = RobustLoss(0.2).config()
    with pytest.raises(ValueError, match=r"cfg\['name'\] must be 'RobustLoss'"):
        RobustLoss.from_config({**cfg, "name": "Other"})
    with pytest.raises(ValueError, match=r"missing keys \['tol'\]"):
        RobustLoss.from_config({k: v for k, v in cfg.items() if k != "tol"})
    with pytest.raises(ValueError, match=r"unknown keys \['temperature'\]"):
        RobustLoss.from_config({**cfg, "temperature": 2.0})
    with pytest.raises(ValueError, match="^mu: must be a number >= 0"):
        RobustLoss.from_config({**cfg, "mu": -1.0})


# ---- training with it (probust.training.train) --------------------------------------------------


def _fit(digits, extra_loss=None, grad_reg=0.0):
    train_ds, test_ds = digits
    return train(
        train_ds,
        "cnn",
        epochs=4,
        lr=0.05,
        batch_size=64,
        seed=0,
        test_dataset=test_ds,
        show_progress=False,
        extra_loss=extra_loss,
        grad_reg=grad_reg,
    )


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
    assert flattened.meta["test_accuracy"] < plain.meta["test_accuracy"] - 0.25, (
        plain.meta["test_accuracy"],
        flattened.meta["test_accuracy"],
    )


def test_config_names_the_settings_and_is_stored_in_the_checkpoint(tmp_path, digits):
    loss = probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=7)
    cfg = loss.config()
    assert cfg == {
        "name": "RobustLoss",
        "mu": 0.5,
        "sigma": 0.2,
        "noise": {"noise": "gaussian", "sigma": 0.2},
        "cdf": "mv-sigmoid",
        "linearisation": "taylor",
        "target": "label",
        "tol": 1e-3,
        "max_points": 16,
        "min_p": 1e-4,
        "mmse_samples": 5,
        "warmup_steps": 7,
    }
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
    assert (
        repr(RobustLoss.from_config(saved["extra_loss_config"])) == saved["extra_loss"]
    )  # rebuilt from the checkpoint
    # the same settings find the run complete; other settings are another run
    again = train(
        train_ds, "linear", extra_loss=probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=7), **kwargs
    )
    assert again.meta["created"] == result.meta["created"]
    with pytest.raises(probust.models.CheckpointMismatchError, match="extra_loss"):
        train(train_ds, "linear", extra_loss=probust.RobustLoss(0.2, mu=0.5, max_points=16, warmup_steps=8), **kwargs)
    # a plain callable has no config: only its name is recorded
    plain = train(train_ds, "linear", extra_loss=lambda m, x, y, logits: x.new_zeros(()), **{**kwargs, "out": None})
    assert plain.meta["extra_loss"].endswith("<lambda>") and "extra_loss_config" not in plain.meta


def test_a_resumed_robust_training_continues_the_warmup_and_ends_with_the_same_weights(tmp_path, digits):
    train_ds, test_ds = digits
    train_ds = train_ds.subset(list(range(256)))  # 4 steps per epoch at batch 64
    settings = dict(epochs=3, lr=0.05, batch_size=64, seed=0, test_dataset=test_ds, show_progress=False)
    loss = lambda: probust.RobustLoss(SIGMA, mu=1.0, max_points=16, warmup_steps=10)  # noqa: E731
    whole = train(train_ds, "linear", extra_loss=loss(), out=tmp_path / "whole.pt", **settings)

    def stop_after_first_epoch(epoch, meta):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the checkpoint of epoch 1 (4 of the 10 warm-up steps) is written
        train(
            train_ds,
            "linear",
            extra_loss=loss(),
            out=tmp_path / "cut.pt",
            on_epoch_end=stop_after_first_epoch,
            **settings,
        )
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
