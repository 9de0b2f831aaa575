"""The data set a run scored, loaded and checked against the run, and images of its points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probust import data
from probust.experiments.base import ExperimentSkipped
from probust.experiments.datasets import images, load_dataset, torch_index
from probust.experiments.run_info import Run
from probust.run import read_config, read_results


@pytest.fixture(scope="module")
def digits():
    return data.load("digits", "test")


def one(folder) -> Run:
    return Run(path=folder, config=read_config(folder), table=read_results(folder), label="the run")


def test_the_scored_data_set_is_loaded_when_size_and_labels_agree(tmp_path, write_run, digits):
    labels = digits.targets.numpy()
    run = one(write_run(tmp_path, "ok", run={"data_size": len(digits)}, labels=labels))
    ds = load_dataset(run)
    assert len(ds) == len(digits) and torch.equal(ds.targets, digits.targets)
    x = images(ds, [3, 0])
    assert x.dtype == np.float32 and x.shape == (2, 1, 8, 8)
    np.testing.assert_array_equal(x, digits.subset(torch.tensor([3, 0])).tensors()[0].numpy())
    # a plain indexable data set gives the same images
    plain = [(digits[i][0], int(labels[i])) for i in range(5)]
    np.testing.assert_array_equal(images(plain, [3, 0]), x)
    assert torch_index([2, 1]).dtype == torch.int64


def test_a_data_set_that_is_not_the_scored_one_skips_the_experiment(tmp_path, write_run, digits):
    labels = digits.targets.numpy()
    with pytest.raises(ExperimentSkipped, match="has 359 points, the results were made on 10"):
        load_dataset(one(write_run(tmp_path, "size", run={"data_size": 10}, labels=labels)))
    with pytest.raises(ExperimentSkipped, match="labels of 'digits' here differ"):
        load_dataset(one(write_run(tmp_path, "labels", labels=(labels + 1) % 10)))
    with pytest.raises(ExperimentSkipped, match="'no-such-set' \\(test\\) of the run cannot be loaded here"):
        load_dataset(one(write_run(tmp_path, "missing", run={"dataset": "no-such-set"})))
    with pytest.raises(ExperimentSkipped, match="None \\(test\\) of the run cannot be loaded here"):
        load_dataset(one(write_run(tmp_path, "unnamed", run={"dataset": None})))


def test_a_run_on_a_users_files_reopens_them_as_they_were_read_and_tables_are_not_images(tmp_path):
    import pandas as pd
    from PIL import Image

    from probust import models
    from probust.run import run_estimate

    rng = np.random.default_rng(0)
    for name in ("ant", "bee"):
        (tmp_path / "pics" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8), mode="RGB").save(
                tmp_path / "pics" / name / f"{i}.png"
            )
    net = models.build("linear", 2, (1, 4, 4))
    run_estimate(
        str(tmp_path / "pics"),
        net,
        0.1,
        "softmax",
        tmp_path / "r",
        data_options={"image_size": 4, "channels": 1},
        device="cpu",
        show_progress=False,
    )
    ds = load_dataset(one(tmp_path / "r"), images_only=True)
    expected = data.load_file(tmp_path / "pics", {"image_size": 4, "channels": 1})
    assert ds.input_shape == (1, 4, 4) and ds.classes == ["ant", "bee"]
    np.testing.assert_array_equal(images(ds, [5, 0]), images(expected, [5, 0]))

    pd.DataFrame({"a": [0.0, 1.0, 2.0], "b": [1.0, 0.0, 1.0], "label": [0, 1, 0]}).to_csv(
        tmp_path / "t.csv", index=False
    )
    run_estimate(
        str(tmp_path / "t.csv"),
        models.build("mlp", 2, (2,)),
        0.1,
        "softmax",
        tmp_path / "t",
        device="cpu",
        show_progress=False,
    )
    assert len(load_dataset(one(tmp_path / "t"))) == 3
    with pytest.raises(ExperimentSkipped, match=r"image-only experiment, .* not images \(input shape \[2\]"):
        load_dataset(one(tmp_path / "t"), images_only=True)
