"""probust.Normalize and its presets: sigma in pixel units for models that expect normalised inputs.

Oracles: the normalisation written by hand, ``(x - mean) / std``, with the statistics typed in
(ImageNet's, a ViT's 0.5), and for a linear model the closed form p = Phi(g / (sigma * ||u||)).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

import probust
from probust import models as pm
from probust.errors import OptionError
from probust.models import StatisticsError
from tests._helpers import save_tiny_vit

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def _by_hand(x: torch.Tensor, mean, std) -> torch.Tensor:
    c = len(mean)
    return (x - torch.tensor(mean).view(1, c, 1, 1)) / torch.tensor(std).view(1, c, 1, 1)


def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


# ---- the layer ----------------------------------------------------------------------------------


def test_wrapped_model_is_the_model_on_inputs_normalised_by_hand():
    net = _conv()
    x = torch.rand(4, 3, 8, 8)
    wrapped = nn.Sequential(probust.Normalize(IMAGENET_MEAN, IMAGENET_STD), net)
    torch.testing.assert_close(wrapped(x), net(_by_hand(x, IMAGENET_MEAN, IMAGENET_STD)))
    # with_normalization builds the same module (the same state_dict, so the same sha256 in a run)
    built = probust.with_normalization(net, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    assert list(built.state_dict()) == list(wrapped.state_dict())
    torch.testing.assert_close(built(x), wrapped(x))


def test_channels_broadcast_one_value_and_the_buffers_load_as_a_state_dict():
    given = pm.Normalize([0.1, 0.2, 0.3], [0.5, 0.5, 0.25])
    assert set(given.state_dict()) == {"mean", "std"}
    assert given.mean.shape == given.std.shape == (1, 3, 1, 1)
    torch.testing.assert_close(given.mean.flatten(), torch.tensor([0.1, 0.2, 0.3]))
    identity = pm.Normalize(channels=3)
    assert identity.mean.shape == (1, 3, 1, 1) and identity.std.flatten().tolist() == [1.0, 1.0, 1.0]
    broadcast = pm.Normalize(channels=3, mean=[0.5], std=[0.25])
    assert broadcast.mean.flatten().tolist() == [0.5] * 3
    # The statistics travel in the state_dict: another layer of the same channels takes them.
    new = probust.Normalize([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    new.load_state_dict(given.state_dict())
    x = torch.rand(2, 3, 4, 4)
    torch.testing.assert_close(new(x), _by_hand(x, [0.1, 0.2, 0.3], [0.5, 0.5, 0.25]))
    model = pm.build("cnn", 10, (1, 28, 28), mean=[0.286], std=[0.353])
    assert model.state_dict()["normalize.std"].shape == (1, 1, 1, 1)


def test_channels_come_from_the_statistics_and_one_value_fits_any_input():
    assert probust.Normalize(IMAGENET_MEAN, 0.5).std.flatten().tolist() == [0.5] * 3
    assert probust.Normalize(0.5, IMAGENET_STD).mean.shape == (1, 3, 1, 1)
    one = probust.Normalize(0.5, 0.25)
    for shape in ((2, 1, 4, 4), (2, 3, 4, 4), (2, 7), (2, 3, 5)):
        x = torch.rand(shape)
        torch.testing.assert_close(one(x), (x - 0.5) / 0.25)
    features = probust.Normalize([1.0, 2.0], [2.0, 4.0])  # a table: one statistic per feature
    torch.testing.assert_close(features(torch.tensor([[3.0, 6.0]])), torch.tensor([[1.0, 1.0]]))


def test_traced_and_exported_models_keep_the_normalisation():
    layer = probust.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    x = torch.rand(2, 3, 4, 4)
    torch.testing.assert_close(torch.jit.trace(layer, x)(x), _by_hand(x, IMAGENET_MEAN, IMAGENET_STD))
    program = torch.export.export(layer, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    y = torch.rand(5, 3, 4, 4)
    torch.testing.assert_close(program.module()(y), _by_hand(y, IMAGENET_MEAN, IMAGENET_STD))


@pytest.mark.parametrize(
    "build,field,text",
    [
        (lambda: probust.Normalize([0.1, 0.2], [0.5, 0.5, 0.5]), "mean", "mean must have 1 or 3 values"),
        (lambda: probust.Normalize([0.1], [0.5, 0.0]), "std", "std must be positive"),
        (lambda: pm.Normalize([0.0], [0.0], channels=1), "std", "std must be positive"),
        (lambda: probust.Normalize([float("nan")], [1.0]), "mean", "mean must be finite numbers"),
        (lambda: probust.Normalize("red", [1.0]), "mean", "mean must be a number or a list"),
        (lambda: probust.Normalize([0.5], [0.5], channels=0), "channels", "channels must be a positive integer"),
        (lambda: probust.with_normalization(nn.Linear(2, 2), IMAGENET_MEAN, mean=[0.5]), "stats", "not both"),
        (lambda: probust.with_normalization(nn.Linear(2, 2)), "stats", "does not record its normalisation"),
        (lambda: probust.Normalize.of(42), "stats", "expected where the statistics are written"),
    ],
)
def test_bad_statistics_are_option_errors_naming_the_argument(build, field, text):
    with pytest.raises(OptionError, match=text) as error:
        build()
    assert error.value.field == field and isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    "mean,std,field,text",
    [
        (
            [0.5],
            [0.5, 0.5],
            "mean",
            r"mean has 1 value and std 2 values, a list gives one value per channel: give 2 values to both, or mean "
            r"as a single number for every channel \(mean=0.5, not \[0.5\]\)",
        ),
        (
            IMAGENET_MEAN,
            [0.25],
            "std",
            r"mean has 3 values and std 1 value, .* or std as a single number for every channel \(std=0.25, not",
        ),
        ([0.5, 0.5], [0.5, -1.0], "std", r"std must be positive, got \[0.5, -1.0\]"),
        ([0.5, 0.5], [0.5, 0.0], "std", r"std must be positive"),
        ([0.5, 0.5], [0.5, float("inf")], "std", r"std must be finite numbers"),
        ([0.5, float("nan")], [0.5, 0.5], "mean", r"mean must be finite numbers"),
    ],
)
def test_statistics_that_disagree_or_are_not_finite_are_refused_when_built(mean, std, field, text):
    with pytest.raises(StatisticsError, match=text) as error:
        probust.Normalize(mean, std)
    assert error.value.field == field


def test_a_single_number_or_channels_broadcasts_where_two_lists_would_disagree():
    assert probust.Normalize(0.5, [0.5, 0.25]).mean.flatten().tolist() == [0.5, 0.5]
    assert probust.Normalize([0.5, 0.25], torch.tensor(0.5)).std.flatten().tolist() == [0.5, 0.5]
    assert probust.Normalize([0.5], [0.5, 0.25], channels=2).mean.flatten().tolist() == [0.5, 0.5]
    assert probust.Normalize([0.5], [0.25]).channels == 1


def test_an_input_with_other_channels_is_refused_with_the_shapes():
    layer = probust.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    with pytest.raises(ValueError, match=r"statistics for 3 channels, but the input has shape \[2, 1, 4, 4\]"):
        layer(torch.rand(2, 1, 4, 4))


# ---- sigma in pixel units -----------------------------------------------------------------------


def _linear_pair(std: float | list[float]):
    """A 2-class linear model on normalised inputs [B, 3, 2, 2], and its weights."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 2, dtype=torch.float64))
    mean = [0.4, 0.5, 0.6]
    return net, probust.with_normalization(net, mean=mean, std=std), mean


def test_sigma_in_pixel_units_is_sigma_over_std_in_normalised_units():
    net, wrapped, mean = _linear_pair(0.25)  # one std for every channel: isotropic in both spaces
    x = torch.rand(6, 3, 2, 2, dtype=torch.float64)
    z = _by_hand(x, mean, [0.25] * 3)
    sigma = 0.05
    pixel = probust.estimate(wrapped.double(), x, sigma, method="taylor")
    normalised = probust.estimate(net, z, sigma / 0.25, method="taylor")
    np.testing.assert_allclose(np.asarray(pixel), np.asarray(normalised), atol=1e-10)
    # the closed form for a linear 2-class model: p = Phi(|g(x)| / (sigma * ||grad_x g||))
    w, b = net[1].weight.detach(), net[1].bias.detach()
    g = (z.flatten(1) @ (w[0] - w[1]) + (b[0] - b[1])).abs()
    u = torch.linalg.vector_norm((w[0] - w[1]) / 0.25)
    np.testing.assert_allclose(np.asarray(pixel), norm.cdf((g / (sigma * u)).numpy()), atol=1e-10)


def test_per_channel_std_gives_the_closed_form_in_pixel_units():
    std = [0.2, 0.25, 0.5]
    net, wrapped, mean = _linear_pair(std)
    x = torch.rand(6, 3, 2, 2, dtype=torch.float64)
    sigma = 0.03
    p = np.asarray(probust.estimate(wrapped.double(), x, sigma, method="taylor"))
    w, b = net[1].weight.detach(), net[1].bias.detach()
    per_coordinate = torch.tensor(std, dtype=torch.float64).repeat_interleave(4)  # channel-major flatten
    u = (w[0] - w[1]) / per_coordinate  # the gradient of g in pixel units
    g = (_by_hand(x, mean, std).flatten(1) @ (w[0] - w[1]) + (b[0] - b[1])).abs()
    np.testing.assert_allclose(p, norm.cdf((g / (sigma * torch.linalg.vector_norm(u))).numpy()), atol=1e-10)


# ---- presets ------------------------------------------------------------------------------------


def test_timm_models_give_their_pretrained_cfg_statistics():
    timm = pytest.importorskip("timm")
    resnet = timm.create_model("resnet18", pretrained=False, num_classes=5).eval()
    layer = probust.Normalize.from_timm(resnet)
    np.testing.assert_allclose(layer.mean.flatten(), IMAGENET_MEAN, rtol=1e-6)
    np.testing.assert_allclose(layer.std.flatten(), IMAGENET_STD, rtol=1e-6)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=5).eval()
    np.testing.assert_allclose(probust.Normalize.from_timm(vit).std.flatten(), [0.5] * 3)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(probust.with_normalization(vit)(x), vit((x - 0.5) / 0.5))
        torch.testing.assert_close(
            probust.with_normalization(resnet)(x), resnet(_by_hand(x, IMAGENET_MEAN, IMAGENET_STD))
        )
    assert probust.Normalize.of(resnet.pretrained_cfg).extra_repr() == layer.extra_repr()  # the config alone


def test_torchvision_weights_and_transforms_give_their_statistics():
    tv = pytest.importorskip("torchvision")
    from torchvision import transforms
    from torchvision.models import ResNet18_Weights

    for source in (
        ResNet18_Weights.DEFAULT,  # its transforms() preset, offline
        ResNet18_Weights.DEFAULT.transforms(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
    ):
        layer = probust.Normalize.from_torchvision(source)
        np.testing.assert_allclose(layer.mean.flatten(), IMAGENET_MEAN, rtol=1e-6)
        np.testing.assert_allclose(layer.std.flatten(), IMAGENET_STD, rtol=1e-6)
        assert probust.Normalize.of(source).extra_repr() == layer.extra_repr()
    net = tv.models.resnet18(num_classes=4).eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            probust.with_normalization(net, ResNet18_Weights.DEFAULT)(x), net(_by_hand(x, IMAGENET_MEAN, IMAGENET_STD))
        )
    with pytest.raises(OptionError, match="has no step that normalises") as error:
        probust.Normalize.from_torchvision(transforms.Compose([transforms.ToTensor()]))
    assert error.value.field == "weights"


def test_hugging_face_processors_give_their_statistics_unless_they_do_not_normalise(tmp_path):
    transformers = pytest.importorskip("transformers")
    processor = transformers.ViTImageProcessor(image_mean=[0.1, 0.2, 0.3], image_std=[0.3, 0.2, 0.1])
    layer = probust.Normalize.from_hf(processor)
    np.testing.assert_allclose(layer.mean.flatten(), [0.1, 0.2, 0.3], rtol=1e-6)
    np.testing.assert_allclose(layer.std.flatten(), [0.3, 0.2, 0.1], rtol=1e-6)
    processor.save_pretrained(tmp_path)
    assert probust.Normalize.from_hf(tmp_path).extra_repr() == layer.extra_repr()  # its folder
    assert probust.Normalize.of(processor).extra_repr() == layer.extra_repr()
    off = probust.Normalize.from_hf(transformers.ViTImageProcessor(do_normalize=False))
    x = torch.rand(2, 3, 4, 4)
    torch.testing.assert_close(off(x), x)  # the model takes the inputs as they are
    with pytest.raises(OptionError, match="has no preprocessor_config.json"):
        probust.Normalize.from_hf(tmp_path / "elsewhere")


# ---- a Hugging Face folder that does not say how to normalise -----------------------------------


def test_a_hugging_face_folder_without_a_processor_warns_that_inputs_are_unnormalised(tmp_path):
    hf = save_tiny_vit(tmp_path / "vit")
    with pytest.warns(UserWarning, match="has no preprocessor_config.json: the model runs on unnormalised") as seen:
        model, meta = pm.load_hf_classifier(tmp_path / "vit")
    assert "--mean/--std" in str(seen[0].message) and "probust.with_normalization" in str(seen[0].message)
    assert meta["normalize"] is False
    x = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits)
    # its image processor saved into the folder: normalised inside, and no warning
    (tmp_path / "vit" / "preprocessor_config.json").write_text(
        json.dumps({"do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.25] * 3})
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model, meta = pm.load_hf_classifier(tmp_path / "vit")
    assert meta["normalize"] is True
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=(x - 0.5) / 0.25).logits)
    # a processor that does not normalise: the model takes [0, 1] inputs, as its processor says
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps({"do_normalize": False}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _, meta = pm.load_hf_classifier(tmp_path / "vit")
    assert meta["normalize"] is False
    # a processor that normalises without saying with what: the warning again
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps({"do_normalize": True}))
    with pytest.warns(UserWarning, match="normalises but has no image_mean and image_std"):
        pm.load_hf_classifier(tmp_path / "vit")
