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
