"""The model contract (docs/design.md, "Conventions"), proved for every method with real model classes.

A model may return logits [B, C], a Hugging Face ``ModelOutput`` (its ``.logits``) or a tuple
whose first item is the logits; every method (and CERTIFY / PREDICT) then gives bit for bit the
numbers of the same model wrapped by hand to return the logits tensor. Anything else is refused
before any work with the message the command line gives. The models are real timm, torchvision
and transformers classes with random weights on small images, so each case takes about a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import probust
from probust._inputs import ModelCallError
from probust._user_model import ModelOutputError
from probust.estimators import REGISTRY, make_estimator, method_spec
from probust.execution import Execution
from tests.estimators.test_contract import assert_same_estimate, small_settings

METHODS = list(REGISTRY)
# Random networks at a large sigma: the linearisation's own warning is beside the point here.
pytestmark = pytest.mark.filterwarnings("ignore:.*the linearisation disagrees")


class HandLogits(nn.Module):
    """The user's own fix: a module whose forward returns the logits tensor, read by ``read``."""

    def __init__(self, model: nn.Module, read: Callable[[Any], Tensor]) -> None:
        super().__init__()
        self.model = model
        self.read = read

    def forward(self, x: Tensor) -> Tensor:
        return self.read(self.model(x))


class LogitsAndFeatures(nn.Module):
    """A plain module returning a tuple (logits, features)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(4 * 8 * 8, 5)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.features(x)
        return self.head(h), h


def _timm(name: str, **kwargs: Any) -> nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)


def _hf_vit() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=5,
    )
    return transformers.ViTForImageClassification(config)


def _torchvision_resnet18() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def _as_is(out: Tensor) -> Tensor:
    return out


# Each: the model, how a user reads its logits by hand, its input size and a sigma (in the input's
# units) at which p_robust is inside (0, 1) for some of the points.
MODELS: dict[str, Callable[[], tuple[nn.Module, Callable[[Any], Tensor], int, float]]] = {
    "hf_vit": lambda: (_hf_vit(), lambda out: out.logits, 16, 2.0),
    "tuple": lambda: (LogitsAndFeatures(), lambda out: out[0], 8, 1.0),
    "timm_resnet18": lambda: (_timm("resnet18"), _as_is, 32, 2.0),
    "timm_vit": lambda: (_timm("vit_tiny_patch16_224", img_size=32, patch_size=8), _as_is, 32, 2.0),
    "timm_convnext_atto": lambda: (_timm("convnext_atto"), _as_is, 32, 2.0),
    "torchvision_resnet18": lambda: (_torchvision_resnet18(), _as_is, 32, 2.0),
}
# The larger networks return plain logits (the path the contract leaves untouched): their cases
# run with the slow tests, one method each in the fast ones.
FAST = {"hf_vit", "tuple"}


def _cases() -> list[Any]:
    cases = []
    for model in MODELS:
        for method in METHODS:
            slow = model not in FAST and method not in ("taylor", "mc")
            cases.append(pytest.param(model, method, marks=[pytest.mark.slow] if slow else []))
    return cases


def _points(size: int) -> Tensor:
    return torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("model_name", "method"), _cases())
def test_every_method_gives_a_model_the_numbers_of_its_logits_wrapped_by_hand(model_name, method):
    model, read, size, sigma = MODELS[model_name]()
    x = _points(size)
    settings = small_settings(method_spec(method), batch_size=16, memory_budget="2GB")
    r = make_estimator(method, model, sigma, **settings)(x)
    by_hand = make_estimator(method, HandLogits(model, read), sigma, **settings)(x)
    assert_same_estimate(r, by_hand)
    assert torch.all((r.p >= 0) & (r.p <= 1))


@pytest.mark.parametrize("model_name", sorted(FAST))
def test_certify_and_predict_read_the_same_logits(model_name):
    model, read, size, sigma = MODELS[model_name]()
    x = _points(size)
    hand = HandLogits(model, read)
    a = probust.certify(model, x, sigma, n0=16, n=64, execution=Execution(batch_size=32))
    b = probust.certify(hand, x, sigma, n0=16, n=64, execution=Execution(batch_size=32))
    assert torch.equal(a.prediction, b.prediction) and torch.equal(a.hits, b.hits) and torch.equal(a.radius, b.radius)
    c = probust.predict(model, x, sigma, n=64, execution=Execution(batch_size=32))
    d = probust.predict(hand, x, sigma, n=64, execution=Execution(batch_size=32))
    assert torch.equal(c.prediction, d.prediction) and torch.equal(c.count_top, d.count_top)


def test_a_model_returning_a_tensor_runs_itself_not_a_wrapper(monkeypatch):
    """Today's path is untouched: a logits model is what every pass calls (no wrapper)."""
    model, _, size, sigma = MODELS["tuple"]()
    plain = HandLogits(model, lambda out: out[0])
    seen: list[nn.Module] = []
    original = probust.estimators.base.PointwiseMethod._clean_logits

    def spy(self, x):
        seen.append(self.model)
        return original(self, x)

    monkeypatch.setattr(probust.estimators.base.PointwiseMethod, "_clean_logits", spy)
    probust.Softmax(plain)(_points(size))
    probust.Softmax(model)(_points(size))
    assert seen[0] is plain
    assert isinstance(seen[1], probust._user_model.LogitsOf) and seen[1].model is model


class Probabilities(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(self.net(x), dim=1)


class Returns(nn.Module):
    """A linear layer whose output is given back as ``wrap(logits)``."""

    def __init__(self, wrap: Callable[[Tensor], Any], classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Linear(4, classes)
        self.wrap = wrap

    def forward(self, x: Tensor) -> Any:
        return self.wrap(self.net(x))


REFUSED = {
    "probabilities": (Probabilities, "returns probabilities .*remove the final softmax"),
    "dict without logits": (lambda: Returns(lambda z: {"scores": z}), r"keys 'scores'\) without 'logits'"),
    "tuple of other things": (lambda: Returns(lambda z: (z.sum(1), z)), r"first item is not logits .* e.g. out\[1\]"),
    "one logit": (lambda: Returns(lambda z: z, classes=1), "at least 2 classes"),
    "a list of floats": (lambda: Returns(lambda z: z.tolist()), "returns a list"),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("method", METHODS)
def test_an_output_the_contract_refuses_fails_before_any_work_with_the_command_lines_message(method, case):
    build, match = REFUSED[case]
    model = build()
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    est = make_estimator(method, model, 0.5, **small_settings(method_spec(method)))
    with pytest.raises(ModelOutputError, match=match) as refused:
        est(x)
    assert refused.value.field == "model" and str(refused.value).startswith("model: ")


@pytest.mark.parametrize("case", list(REFUSED))
def test_python_and_the_runner_refuse_a_model_with_the_same_message(case):
    from probust.run import ConfigError
    from probust.run.model_source import load_model

    model = REFUSED[case][0]()
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ModelOutputError) as python:
        probust.Softmax(model)(x)
    ds = torch.utils.data.TensorDataset(x, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ConfigError) as runner:
        load_model(model, torch.device("cpu"), ds, allow_pickle=False)
    assert runner.value.field == "model" and runner.value.reason == python.value.reason


@pytest.mark.parametrize("method", [*METHODS, "certify", "predict"])
def test_a_missing_batch_dimension_is_named_with_how_x_was_read(method):
    model = LogitsAndFeatures()
    single = _points(8)[0]  # [3, 8, 8]: one image without its batch dimension
    if method == "certify":
        run = lambda: probust.certify(model, single, 0.5, n0=8, n=16)  # noqa: E731
    elif method == "predict":
        run = lambda: probust.predict(model, single, 0.5, n=16)  # noqa: E731
    else:
        run = lambda: make_estimator(method, model, 0.5, **small_settings(method_spec(method)))(single)  # noqa: E731
    with pytest.raises(ModelCallError) as failed:
        run()
    message = str(failed.value)
    assert message.startswith("x: the model fails on x of shape [3, 8, 8], read as a batch of 3 inputs of shape [8, 8]")
    assert message.endswith("if x is a single input, pass x.unsqueeze(0)")
    assert isinstance(failed.value, ValueError) and isinstance(failed.value.__cause__, RuntimeError)


def _message(model: Any, x: Tensor) -> str:
    with pytest.raises(ModelCallError) as failed:
        probust.Taylor(model, 0.1)(x)
    assert failed.value.field == "x"
    return str(failed.value)


def test_a_single_image_is_named_by_the_shape_given_and_the_first_layers_input():
    message = _message(LogitsAndFeatures(), torch.rand(3, 8, 8))
    assert message.startswith(
        "x: the model fails on x of shape [3, 8, 8], read as a batch of 3 inputs of shape [8, 8]: x has the "
        "dimensions of one input of the model's first layer (Conv2d 'features.0', inputs [B, 3, H, W]), without "
        "the batch dimension"
    )
    # The model's own error quotes the probe's rows, not x: the message says which rows it ran on.
    assert "(the model's error on x's first 2 rows, shape [2, 8, 8]: RuntimeError: " in message
    assert message.endswith("; if x is a single input, pass x.unsqueeze(0)")


def test_other_channels_are_named_without_the_batch_dimension_advice():
    message = _message(LogitsAndFeatures(), torch.rand(4, 1, 8, 8))
    assert message.startswith(
        "x: the model fails on x of shape [4, 1, 8, 8], read as a batch of 4 inputs of shape [1, 8, 8]: the model's "
        "first layer expects 3 channels in dimension 1, x has 1 (Conv2d 'features.0', inputs [B, 3, H, W])"
    )
    assert "unsqueeze" not in message


def test_a_normalize_in_front_names_its_channels_and_a_missing_batch_dimension():
    model = nn.Sequential(probust.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]), LogitsAndFeatures())
    single = _message(model, torch.rand(3, 8, 8))
    assert (
        "x has the 3 channels of one input of the model's first layer (Normalize '0', inputs [B, 3, H, W]) "
        "in dimension 0, without the batch dimension" in single
    )
    assert single.endswith("pass x.unsqueeze(0)")
    grey = _message(model, torch.rand(2, 1, 8, 8))
    assert (
        "the model's first layer expects 3 channels in dimension 1, x has 1 (Normalize '0', inputs [B, 3, H, W])"
        in grey
    )
    assert "unsqueeze" not in grey


def test_a_batch_as_large_as_a_normalizes_channels_is_named_as_other_channels_not_a_missing_batch_dimension():
    # Issue 59: a 2-channel normaliser in front of a 3-channel resnet, called on a batch of 2 RGB images.
    # x is 4-d, as the first layer takes: nothing is missing, the normaliser has other channels than x.
    model = nn.Sequential(probust.Normalize([0.5, 0.5], [0.5, 0.5]), _torchvision_resnet18())
    x = torch.rand(2, 3, 32, 32)
    cause = (
        "x: the model fails on x of shape [2, 3, 32, 32], read as a batch of 2 inputs of shape [3, 32, 32]: the "
        "model's first layer expects 2 channels in dimension 1, x has 3 (Normalize '0', inputs [B, 2, H, W]), the 3 "
        "that Conv2d '1.conv1' after it takes (the model's error: ValueError: Normalize: statistics for 2 channels"
    )
    assert _message(model, x).startswith(cause)
    with pytest.raises(ModelCallError) as failed:
        probust.estimate(model, x, 0.1, "taylor")
    assert str(failed.value).startswith(cause)
    for message in (_message(model, x), str(failed.value)):
        assert "batch dimension" not in message and "unsqueeze" not in message
    from probust.run import ConfigError

    with pytest.raises(ConfigError) as refused:  # the runner names the same, for its points
        probust.score(model, (x, torch.zeros(2, dtype=torch.int64)), 0.1, ["softmax"], show_progress=False)
    assert str(refused.value).startswith(
        "model: does not accept inputs of shape [3, 32, 32] from tensors: the model's first layer expects 2 channels "
        "in dimension 1, the points have 3 (Normalize '0', inputs [B, 2, H, W]), the 3 that Conv2d '1.conv1' after "
        "it takes (ValueError: "
    )
    # One such image without its batch dimension has one dimension fewer than the layer takes: still advised.
    normalized = nn.Sequential(probust.Normalize([0.5] * 3, [0.5] * 3), _torchvision_resnet18())
    single = _message(normalized, x[0])
    assert (
        "x has the 3 channels of one input of the model's first layer (Normalize '0', inputs [B, 3, H, W]) in "
        "dimension 0, without the batch dimension" in single
    )
    assert single.endswith("; if x is a single input, pass x.unsqueeze(0)")


def test_a_dimension_fewer_is_named_but_advised_only_where_the_shape_says_which_dimension_is_missing():
    # [4, 8, 8] to a 3-channel convolution: one dimension fewer, but neither one 4-channel image nor
    # 4 images without their channel dimension fit: no unsqueeze advice.
    neither = _message(LogitsAndFeatures(), torch.rand(4, 8, 8))
    assert neither.startswith(
        "x: the model fails on x of shape [4, 8, 8], read as a batch of 4 inputs of shape [8, 8]: x has one "
        "dimension fewer than the model's first layer takes (Conv2d 'features.0', inputs [B, 3, H, W]), and 4 in "
        "dimension 0, where one input would have its 3 channels (the model's error on x's first 2 rows"
    )
    assert "unsqueeze" not in neither and "without the batch dimension" not in neither
    # Grey images [B, H, W] to a 1-channel convolution lack their channel dimension, not a batch one.
    grey = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 8 * 8, 3))
    message = _message(grey, torch.rand(5, 8, 8))
    assert message.startswith(
        "x: the model fails on x of shape [5, 8, 8], read as a batch of 5 inputs of shape [8, 8]: x has one "
        "dimension fewer than the model's first layer takes (Conv2d '0', inputs [B, 1, H, W]): a batch of 5 inputs "
        "of shape [8, 8] without the channel dimension"
    )
    assert message.endswith("; if x is a batch of inputs with one channel, pass x.unsqueeze(1)")
    assert "unsqueeze(0)" not in message


def test_a_model_running_a_linear_layer_first_is_not_advised_a_batch_dimension():
    # It takes [B, 64]: x [4, 16] has as many dimensions, and x.unsqueeze(0) would fail as well.
    message = _message(nn.Sequential(nn.Linear(64, 3)), torch.rand(4, 16))
    assert "the model's first layer expects 64 features per input, x has 16 per input (Linear '0') (" in message
    assert "unsqueeze" not in message and "one input's worth" not in message


def test_a_flat_model_names_the_features_it_expects():
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    single = _message(mlp, torch.rand(8, 8))  # one 8 x 8 image, read as 8 rows of 8
    assert (
        "the model's first layer expects 64 features per input, x has 8 per input (Linear '1'), and 64 "
        "numbers in all, one input's worth" in single
    )
    assert single.endswith("pass x.unsqueeze(0)")
    other = _message(mlp, torch.rand(4, 1, 5, 5))
    assert "the model's first layer expects 64 features per input, x has 25 per input (Linear '1')" in other
    assert "unsqueeze" not in other


def test_a_failure_the_input_does_not_explain_is_quoted_without_advice():
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: Tensor) -> Tensor:
            raise KeyError("no such head")

    message = _message(Fails(), torch.rand(5, 3, 8, 8))
    assert message == (
        "x: the model fails on x of shape [5, 3, 8, 8], read as a batch of 5 inputs of shape [3, 8, 8] (the "
        "model's error on x's first 2 rows, shape [2, 3, 8, 8]: KeyError: 'no such head')"
    )
    one = _message(Fails(), torch.rand(1, 3, 8, 8))  # the probe ran on x itself
    assert one.endswith("read as a batch of 1 input of shape [3, 8, 8] (the model's error: KeyError: 'no such head')")


def test_the_runner_names_the_channels_the_model_expects():
    from probust.run import ConfigError

    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError) as refused:
        probust.score(
            LogitsAndFeatures(), (x, torch.zeros(6, dtype=torch.int64)), 0.1, ["softmax"], show_progress=False
        )
    assert refused.value.field == "model"
    assert str(refused.value).startswith(
        "model: does not accept inputs of shape [1, 8, 8] from tensors: the model's first layer expects 3 channels "
        "in dimension 1, the points have 1 (Conv2d 'features.0', inputs [B, 3, H, W]) (RuntimeError: "
    )


# ---------------------------------------------------------------- bfloat16 models


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Linear(6 * 8 * 8, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.conv(x)).flatten(1))


def _bf16_pair() -> tuple[nn.Module, nn.Module, Tensor, float]:
    full = SmallCNN()
    low = SmallCNN().to(torch.bfloat16)  # the same weights, rounded to bfloat16
    # Use the rounded weights in float32 too: the two models then differ only in the precision of
    # their arithmetic, not in their parameters.
    full.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    return full, low, _points(8), 0.5


@pytest.mark.parametrize("method", METHODS)
def test_a_bfloat16_model_runs_every_method_and_agrees_with_float32(method):
    full, low, x, sigma = _bf16_pair()
    settings = small_settings(method_spec(method))
    if method_spec(method).samples == "mc":
        settings["n_samples"] = 400
    a = make_estimator(method, full, sigma, **settings)(x)
    b = make_estimator(method, low, sigma, **settings)(x)
    assert b.p.dtype == torch.float64 and next(low.parameters()).dtype == torch.bfloat16
    if method in ("mc", "mc_cv", "mc_is"):
        # The same draws (the noise is added in float32 for both): two estimates of nearly the same
        # p; 4 binomial standard errors of one of them (at least that of p = 0.5 / n) bound them.
        n = settings["n_samples"]
        bound = 4 * math.sqrt(max(float(a.p.max() * (1 - a.p.min())), 0.25) / n)
        assert torch.allclose(a.p, b.p, atol=bound, rtol=0)
    else:
        # bfloat16 keeps 8 significant bits: each product and sum rounds by 2^-8 relative; the
        # margins c and normals u of this 2-layer network carry a few times that (about 1%), so
        # z = c / (sigma ||u||) moves by ~1% and p = Phi(z) (slope phi(z) |z| <= 0.25) by < 0.01;
        # softmax(logits) likewise. 0.015 leaves a margin of 1.5 over that.
        assert torch.allclose(a.p, b.p, atol=0.015, rtol=0), (a.p, b.p)


def test_a_bfloat16_model_certifies_as_its_float32_twin():
    full, low, x, sigma = _bf16_pair()
    a = probust.certify(full, x, sigma, n0=32, n=256, execution=Execution(batch_size=64))
    b = probust.certify(low, x, sigma, n0=32, n=256, execution=Execution(batch_size=64))
    assert torch.equal(a.prediction, b.prediction)
    assert (a.hits - b.hits).abs().max() <= 4 * math.sqrt(256 * 0.25)


# ---------------------------------------------------------------- the runner


def test_the_runner_scores_a_model_output_as_its_logits_wrapped_by_hand(tmp_path):
    from probust.run import run_estimate

    model, read, size, _ = MODELS["tuple"]()
    x = _points(size).repeat(2, 1, 1, 1)
    ds = torch.utils.data.TensorDataset(x, torch.zeros(4, dtype=torch.int64))
    common: dict[str, Any] = dict(sigmas=[1.0], methods=["mc", "taylor"], mc_samples=64, device="cpu")
    a = run_estimate(ds, model, out=tmp_path / "a", **common).sort_values(["method", "index"])
    b = run_estimate(ds, HandLogits(model, read), out=tmp_path / "b", **common).sort_values(["method", "index"])
    assert len(a) == 8
    np.testing.assert_array_equal(a["p"].to_numpy(), b["p"].to_numpy())
