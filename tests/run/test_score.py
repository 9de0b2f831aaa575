"""probust.score: a data set scored in memory, the same rows as run_estimate, names of the points."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, Subset, SubsetRandomSampler, TensorDataset

import probust
from probust.run import ConfigError, run_estimate
from probust.run.memory_store import MemoryStore
from probust.run.store import ResultStore
from tests._helpers import tiny_data, tiny_model

METHODS = ["mc", "taylor", "mmse", "softmax"]
SIGMAS = [0.1, 0.3]
#: Settings shared by every call: small, and the same work units (unit_size) everywhere.
SMALL = dict(mc_samples=200, mmse_samples=3, unit_size=6, device="cpu", show_progress=False)
NAMES = ["path", "label_name", "prediction_name"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pd.DataFrame:
    """run_estimate's table (from its folder) of the tiny data set: the oracle of these tests."""
    out = tmp_path_factory.mktemp("reference") / "r"
    return run_estimate(tiny_data(), tiny_model(), SIGMAS, METHODS, out=out, **SMALL)


def numbers(df: pd.DataFrame) -> pd.DataFrame:
    """Every numeric column of the runner's table but the timing."""
    return df.drop(columns=["seconds", *NAMES], errors="ignore").select_dtypes("number")


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Bit for bit: equal values, NaN where the other has NaN, same dtypes and columns."""
    x, y = numbers(a), numbers(b)
    assert list(x.columns) == list(y.columns) and len(x.columns) >= 20
    assert x.equals(y)
    assert a.method.tolist() == b.method.tolist()


def test_score_gives_run_estimates_rows_bit_for_bit(reference):
    df = probust.score(tiny_model(), tiny_data(), SIGMAS, METHODS, **SMALL)
    assert_same_rows(df, reference)
    assert set(df.method) == set(METHODS) and len(df) == 20 * len(SIGMAS) * len(METHODS)
    # The same columns in the same order, the names of the points added.
    assert [c for c in df.columns if c not in NAMES] == list(reference.columns)
    assert (df.seconds > 0).all()


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_a_dataloaders_batch_size_does_not_change_the_rows(reference, batch_size):
    loader = DataLoader(tiny_data(), batch_size=batch_size)
    assert_same_rows(probust.score(tiny_model(), loader, SIGMAS, METHODS, **SMALL), reference)


def test_tensors_are_scored_as_the_data_set_they_hold(reference):
    x, y = tiny_data().tensors()
    with_labels = probust.score(tiny_model(), (x, y), SIGMAS, METHODS, **SMALL)
    assert_same_rows(with_labels, reference)
    # Without labels the numbers are the same (the target is the clean prediction); label is -1.
    alone = probust.score(tiny_model(), TensorDataset(x), SIGMAS, METHODS, **SMALL)
    assert (alone.label == -1).all()
    assert numbers(alone).drop(columns="label").equals(numbers(reference).drop(columns="label"))
    assert probust.score(tiny_model(), x.numpy(), 0.1, "mc", **SMALL).p.equals(
        reference[(reference.method == "mc") & (reference.sigma == 0.1)].p.reset_index(drop=True)
    )


def test_target_label_without_labels_is_refused():
    x, _ = tiny_data().tensors()
    with pytest.raises(ConfigError, match="give \\(x, y\\)") as info:
        probust.score(tiny_model(), x, 0.1, "softmax", target="label", **SMALL)
    assert info.value.field == "target"


def test_integer_tensors_are_refused_as_a_files_integers_are():
    images = (tiny_data().tensors()[0] * 255).to(torch.uint8)
    with pytest.raises(
        ConfigError, match=r"the inputs \(the tensor x\) are uint8, not floating point.*x.float\(\) / 255"
    ):
        probust.score(tiny_model(), images, 0.1, "softmax", **SMALL)


class _Stream(IterableDataset):
    def __iter__(self):
        x, y = tiny_data().tensors()
        return iter(zip(x, y, strict=True))


def _double(batch):
    x, y = torch.utils.data.default_collate(batch)
    return 2 * x, y


@pytest.mark.parametrize(
    ("loader", "match"),
    [
        (DataLoader(tiny_data(), shuffle=True), "shuffled"),
        (DataLoader(tiny_data(), sampler=SubsetRandomSampler([0, 1])), "SubsetRandomSampler"),
        (DataLoader(tiny_data(), sampler=[3, 1, 2]), "picks its points with a list"),
        (DataLoader(_Stream(), batch_size=4), "IterableDataset"),
        (DataLoader(tiny_data(), batch_size=4, collate_fn=_double), "own collate_fn \\(_double\\)"),
    ],
)
def test_a_dataloader_read_otherwise_than_in_order_is_refused_with_the_reason(loader, match):
    with pytest.raises(ConfigError, match=match) as info:
        probust.score(tiny_model(), loader, 0.1, "softmax", **SMALL)
    assert info.value.field == "data"


def test_nothing_is_written_without_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probust.score(tiny_model(), tiny_data(), 0.1, ["mc", "mmse"], **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_with_out_the_rows_also_go_to_a_resumable_folder(tmp_path, reference):
    df = probust.score(tiny_model(), tiny_data(), SIGMAS, METHODS, out=tmp_path / "r", **SMALL)
    assert_same_rows(df, reference)
    assert_same_rows(probust.run.read_results(tmp_path / "r"), reference)
    assert df.attrs["config"]["history"][-1]["finished"] is not None


def test_folder_options_need_out():
    with pytest.raises(ConfigError, match="applies to a results folder") as info:
        probust.score(tiny_model(), tiny_data(), 0.1, "softmax", overwrite=True, **SMALL)
    assert info.value.field == "overwrite"


def test_the_run_records_its_settings_in_attrs():
    df = probust.score(tiny_model(), tiny_data(), 0.1, "softmax", seed=3, limit=4, **SMALL)
    config = df.attrs["config"]
    assert config["run"]["seed"] == 3 and config["requests"][0]["n_points"] == 4
    assert config["run"]["model_sha256"] == probust.run.hash_state_dict(tiny_model())
    assert config["data"]["classes"] == ["a", "b", "c"] and "data_sha256" not in config["run"]


@pytest.mark.parametrize("call", ["run_estimate", "score"])
def test_unknown_keywords_are_refused_naming_the_valid_ones(tmp_path, call):
    def go(**options):
        if call == "score":
            return probust.score(tiny_model(), tiny_data(), 0.1, **options)
        return run_estimate(tiny_data(), tiny_model(), 0.1, out=tmp_path / "r", **options)

    with pytest.raises(ConfigError) as info:
        go(quiet=True)
    assert info.value.field == "quiet"
    text = str(info.value)
    assert f"not an argument of {call} (did you mean show_progress=False, the command line's --quiet?)" in text
    assert "its arguments: allow_pickle, " in text and "mc_samples" in text
    with pytest.raises(ConfigError, match="mc_sample: not an argument .* \\(did you mean mc_samples\\?\\)"):
        go(mc_sample=10)
    assert not (tmp_path / "r").exists()


def test_every_keyword_score_takes_is_documented_in_its_docstring():
    import dataclasses
    import inspect

    from probust.run import RunSettings

    doc = inspect.getdoc(probust.score)
    named = set(inspect.signature(probust.score).parameters) - {"options"}
    options = {f.name for f in dataclasses.fields(RunSettings)} - {"data", "model", "sigmas", "methods", "out"}
    missing = sorted(name for name in named | options if f"``{name}``" not in doc and f"    {name}:" not in doc)
    assert missing == []
    # The first two a user reaches for, with an example value.
    assert "``mc_samples=1000``" in doc and "target_half_width=0.02" in doc


def test_score_takes_sigma_not_sigmas():
    with pytest.raises(ConfigError, match="sigmas: not an argument of score \\(did you mean sigma\\?\\)"):
        probust.score(tiny_model(), tiny_data(), 0.1, sigmas=[0.2])


def test_run_estimate_without_a_folder_points_to_score():
    with pytest.raises(ConfigError, match="out: run_estimate writes .* use probust.score"):
        run_estimate(tiny_data(), tiny_model(), 0.1, out=None)


def test_the_memory_store_overrides_every_method_that_touches_the_disk():
    # A method added to ResultStore later must be decided for the memory store too.
    methods = {
        n
        for n, v in vars(ResultStore).items()
        if not n.startswith("__") and (callable(v) or isinstance(v, (property, classmethod, staticmethod)))
    }
    assert {"write_part", "merge", "config_path", "acquire_lock"} <= methods
    kept = {"completed", "read"}  # the base's, over _read
    assert methods - kept <= set(vars(MemoryStore)), methods - kept - set(vars(MemoryStore))


# --- names of the points ------------------------------------------------------------------------


def image_folder(root: Path, per_class: int = 3) -> Path:
    """root/<class>/<i>.png for classes cat and dog: 4x4 grey images, sorted by class."""
    gen = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(gen.integers(0, 256, (4, 4), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def expected_files(root: Path) -> list[str]:
    return [str(root / c / f"{i}.png") for c in ("cat", "dog") for i in range(3)]


def test_an_image_folder_gives_each_points_file_and_class_names(tmp_path):
    root = image_folder(tmp_path / "pics")
    df = probust.score(tiny_model(2), str(root), 0.1, "mc", **SMALL)
    assert df.columns[:6].tolist() == ["index", "path", "label", "label_name", "prediction", "prediction_name"]
    files = [str(p) for p in expected_files(root.resolve())]
    assert df.path.tolist() == [files[i] for i in df["index"]]
    assert df.label_name.tolist() == [["cat", "dog"][label] for label in df.label]
    assert df.prediction_name.tolist() == [["cat", "dog"][c] for c in df.prediction]
    assert (df.label == [0, 0, 0, 1, 1, 1]).all()


def grey(image):
    return torchvision.transforms.functional.to_tensor(image.convert("L"))


def test_torchvisions_image_folder_and_a_subset_of_it_give_files_and_class_names(tmp_path):
    root = image_folder(tmp_path / "pics")
    ds = torchvision.datasets.ImageFolder(str(root), transform=grey)
    df = probust.score(tiny_model(2), ds, 0.1, "softmax", **SMALL)
    assert df.path.tolist() == expected_files(root)
    assert df.label_name.tolist() == ["cat"] * 3 + ["dog"] * 3
    # A Subset's point i is the data set's point indices[i].
    part = probust.score(tiny_model(2), Subset(ds, [5, 1]), 0.1, "softmax", **SMALL)
    assert part.path.tolist() == [expected_files(root)[5], expected_files(root)[1]]
    assert part.label_name.tolist() == ["dog", "cat"]
    assert part.p.tolist() != [] and part["index"].tolist() == [0, 1]


def test_a_data_set_without_names_has_no_name_columns():
    x, y = tiny_data().tensors()
    df = probust.score(tiny_model(), (x, y), 0.1, "softmax", **SMALL)
    assert not set(NAMES) & set(df.columns)


# --- limit on a data set sorted by class ----------------------------------------------------------


def test_a_limit_that_keeps_one_class_warns_how_to_spread_the_points(tmp_path):
    root = image_folder(tmp_path / "pics")
    with pytest.warns(UserWarning, match=r"limit=2 scores the first 2 points of pics, all of class 'cat' \(label 0\)"):
        df = probust.score(tiny_model(2), str(root), 0.1, "softmax", limit=2, **SMALL)
    assert set(df.label) == {0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the suggestion, and no warning
        spread = probust.score(tiny_model(2), str(root), 0.1, "softmax", limit=2, indices="0-5:3", **SMALL)
    assert spread["index"].tolist() == [0, 3] and set(spread.label) == {0, 1}


def test_the_same_warning_from_run_estimate(tmp_path):
    root = image_folder(tmp_path / "pics")
    with pytest.warns(UserWarning, match=r'indices="0-5:3" \(--indices 0-5:3\)'):
        run_estimate(str(root), tiny_model(2), 0.1, "softmax", out=tmp_path / "r", limit=2, **SMALL)


def test_no_warning_where_the_first_points_hold_several_labels():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = probust.score(tiny_model(), tiny_data(), 0.1, "softmax", limit=5, **SMALL)
    assert df.label.nunique() > 1


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_score_gives_the_rows_of_the_command_line(tmp_path):
    from probust.cli import main

    x, y = tiny_data().tensors()
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    torch.jit.save(torch.jit.trace(tiny_model().eval(), x[:2]), tmp_path / "m.pt")
    data, model = str(tmp_path / "d.npz"), str(tmp_path / "m.pt")
    flags = ["--mc-samples", "200", "--mmse-samples", "3", "--unit-size", "6", "--device", "cpu", "--quiet"]
    command = ["estimate", "--data", data, "--model", model, "--sigma", "0.3", "--methods", *METHODS]
    assert main([*command, *flags, "--out", str(tmp_path / "r")]) == 0
    df = probust.score(model, data, 0.3, METHODS, **SMALL)
    assert_same_rows(df, probust.run.read_results(tmp_path / "r"))
