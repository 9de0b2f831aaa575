"""The runner's ``mean`` / ``std``, and its warnings about the units sigma is measured in.

Oracles: a model with :class:`probust.Normalize` built in (the numbers must be the same, point by
point: the per-point streams do not depend on where the normalisation is), and data whose
normalisation is known (torchvision's ``transforms.Normalize`` with ImageNet's statistics).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import probust
from probust.run import ConfigError, RunSettings, run_estimate
from probust.run.reading import read_config
from probust.run.sources import data_units_note
from tests._helpers import save_tiny_vit

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class Images(Dataset):
    """8 random [0, 1] RGB 4x4 images of 3 classes, through ``transform``."""

    def __init__(self, transform=None, scale: float = 1.0) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.rand(8, 3, 4, 4, generator=gen) * scale
        self.y = torch.arange(8) % 3
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        return (self.transform(x) if self.transform is not None else x), int(self.y[i])


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.Tanh(), nn.Linear(8, 3))


def _run(out, **kwargs):
    args = dict(
        data=Images(),
        model=_net(),
        sigmas=[0.05],
        methods=["mc", "taylor", "mmse"],
        out=out,
        mc_samples=200,
        mmse_samples=3,
        device="cpu",
        show_progress=False,
    )
    return run_estimate(**{**args, **kwargs})


def _units_warnings(seen) -> list[str]:
    """The warnings about the units of sigma among ``seen`` (others, e.g. about the linearisation, pass)."""
    marks = ("not [0, 1]", "preprocessor_config.json", "unnormalised")
    return [str(w.message) for w in seen if any(m in str(w.message) for m in marks)]


def _p(df):
    return df.sort_values(["method", "index"])[["method", "index", "p"]].reset_index(drop=True)


def test_mean_and_std_score_the_model_as_with_normalize_built_in(tmp_path):
    given = _run(tmp_path / "given", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    built_in = _run(tmp_path / "built", model=nn.Sequential(probust.Normalize(IMAGENET_MEAN, IMAGENET_STD), _net()))
    np.testing.assert_array_equal(_p(given)["p"], _p(built_in)["p"])
    unnormalised = _run(tmp_path / "plain")
    assert not np.array_equal(_p(given)["p"], _p(unnormalised)["p"])  # the statistics did something
    run = read_config(tmp_path / "given")["run"]
    assert (run["mean"], run["std"]) == (IMAGENET_MEAN, IMAGENET_STD)  # part of the folder's identity
    assert (read_config(tmp_path / "plain")["run"]["mean"], read_config(tmp_path / "plain")["run"]["std"]) == (
        None,
        None,
    )
    with pytest.raises(ConfigError, match="mean: .* there, .* here"):
        _run(tmp_path / "given", mean=[0.5], std=IMAGENET_STD)


def test_one_value_applies_to_every_channel_and_std_alone_keeps_mean_zero(tmp_path):
    given = _run(tmp_path / "a", std=[0.5], methods=["taylor"])
    built_in = _run(tmp_path / "b", model=nn.Sequential(probust.Normalize(0.0, 0.5), _net()), methods=["taylor"])
    np.testing.assert_array_equal(_p(given)["p"], _p(built_in)["p"])


@pytest.mark.parametrize(
    "kwargs,field,text",
    [
        ({"std": [0.0]}, "std", "must be positive numbers, got 0"),
        ({"mean": ["red"]}, "mean", "'red' is not a number"),
        ({"mean": []}, "mean", "give one value per channel, or one for all"),
        ({"mean": [0.1, 0.2], "std": [0.1, 0.2, 0.3]}, "std", "has 3 values and mean 2"),
    ],
)
def test_bad_statistics_are_refused_naming_the_argument(kwargs, field, text):
    with pytest.raises(ConfigError, match=text) as error:
        RunSettings(data="digits", model="m.pt", sigmas=[0.1], **kwargs)
    assert error.value.field == field


def test_statistics_are_stored_as_floats():
    s = RunSettings(data="digits", model="m.pt", sigmas=[0.1], mean=np.array(IMAGENET_MEAN), std=0.25)
    assert s.mean == tuple(IMAGENET_MEAN) and s.std == (0.25,)


def test_statistics_for_other_channels_than_the_data_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"has 2 values, the inputs \[3, 4, 4\] have 3 channels") as error:
        _run(tmp_path / "r", mean=[0.5, 0.5])
    assert error.value.field == "mean"


# ---- the warning about normalised data ----------------------------------------------------------


def test_a_transform_that_normalises_is_named_with_the_units_of_sigma(tmp_path):
    transforms = pytest.importorskip("torchvision.transforms")
    normalised = Images(transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    with pytest.warns(UserWarning, match="they look normalised") as seen:
        _run(tmp_path / "r", data=normalised, methods=["softmax"])
    text = next(str(w.message) for w in seen if "look normalised" in str(w.message))
    assert "sigma is measured in those normalised units" in text and "--mean/--std" in text
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    by_hand = (normalised.x - mean) / std
    assert f"range from {float(by_hand.min()):.3g} to {float(by_hand.max()):.3g} over the first 8 points" in text
    # normalised twice: said so
    twice = data_units_note(normalised, normalizing=True)
    assert twice is not None and "normalised twice" in twice


def test_pixels_in_0_1_and_tables_raise_no_warning(tmp_path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _run(tmp_path / "r", methods=["softmax"])
    assert not _units_warnings(seen)
    assert data_units_note(Images()) is None
    table = [(torch.tensor([150.0, -30.0, 2.5]), 0), (torch.tensor([120.0, -10.0, 1.0]), 1)]
    assert data_units_note(table) is None  # flat inputs have units of their own


def test_images_in_0_255_are_named_too():
    note = data_units_note(Images(scale=255.0))
    assert note is not None and "steps of 0..255" in note and "scale the images to [0, 1]" in note


# ---- Hugging Face folders -----------------------------------------------------------------------


HF_METHODS = ["softmax", "taylor"]


def test_a_hugging_face_folder_without_a_processor_is_named_and_takes_mean_and_std(tmp_path):
    save_tiny_vit(tmp_path / "vit", image_size=4)
    model = f"hf:{tmp_path / 'vit'}"
    with pytest.warns(UserWarning, match="has no preprocessor_config.json: the model runs on unnormalised"):
        plain = _run(tmp_path / "a", model=model, methods=HF_METHODS, sigmas=[0.5])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        given = _run(tmp_path / "b", model=model, methods=HF_METHODS, sigmas=[0.5], mean=[0.5], std=[0.25])
    assert not _units_warnings(seen)
    # the same numbers as the folder with its processor saved: normalised inside by probust
    (tmp_path / "vit" / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5] * 3, "image_std": [0.25] * 3})
    )
    inside = _run(tmp_path / "c", model=model, methods=HF_METHODS, sigmas=[0.5])
    np.testing.assert_allclose(_p(given)["p"], _p(inside)["p"], rtol=0, atol=1e-12)
    assert not np.allclose(_p(plain)["p"], _p(inside)["p"])
    with pytest.raises(ConfigError, match="normalises the inputs already .* normalise them twice") as error:
        _run(tmp_path / "d", model=model, mean=[0.5], std=[0.25])
    assert error.value.field == "mean"
