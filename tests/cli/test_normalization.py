"""``--mean`` / ``--std`` of ``probust estimate`` and ``probust certify``, and the warning about
normalised data, through the command line.

Oracle: the same model with :class:`probust.Normalize` built in by its factory: every number of
the table must be the same.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from probust.cli import main
from probust.run.certify import read_certified
from probust.run.reading import read_config, read_results

MEAN = ["0.485", "0.456", "0.406"]
STD = ["0.229", "0.224", "0.225"]

NETS = """
import torch
from torch import nn

import probust


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 8), nn.Tanh(), nn.Linear(8, 3))


def normalised_net():
    return nn.Sequential(probust.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]), net())
"""


@pytest.fixture()
def root(tmp_path, monkeypatch):
    """A folder holding [0, 1] images (8 of [3, 4, 4]), the same normalised, and the factories."""
    rng = np.random.default_rng(0)
    x = rng.random((8, 3, 4, 4)).astype("float32")
    y = np.arange(8) % 3
    np.savez(tmp_path / "pixels.npz", x=x, y=y)
    mean, std = np.array(MEAN, float).reshape(1, 3, 1, 1), np.array(STD, float).reshape(1, 3, 1, 1)
    np.savez(tmp_path / "normalised.npz", x=((x - mean) / std).astype("float32"), y=y)
    (tmp_path / "probust_norm_nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("probust_norm_nets", None)
    yield tmp_path
    sys.modules.pop("probust_norm_nets", None)


def _estimate(*args: str) -> int:
    return main(["estimate", "--device", "cpu", *args])


BASE = ["--data", "pixels.npz", "--sigma", "0.05", "--methods", "mc", "taylor", "--mc-samples", "200", "--quiet"]


def test_estimate_mean_and_std_equal_normalize_in_the_model(root):
    assert (
        _estimate(
            *BASE, "--model", "probust_norm_nets:net", "--untrained", "--mean", *MEAN, "--std", *STD, "--out", "a"
        )
        == 0
    )
    assert _estimate(*BASE, "--model", "probust_norm_nets:normalised_net", "--untrained", "--out", "b") == 0
    a, b = (read_results(root / d).sort_values(["method", "index"]) for d in ("a", "b"))
    np.testing.assert_array_equal(a["p"].to_numpy(), b["p"].to_numpy())
    run = read_config(root / "a")["run"]
    assert run["mean"] == [float(v) for v in MEAN] and run["std"] == [float(v) for v in STD]


def test_certify_mean_and_std_equal_normalize_in_the_model(root):
    common = ["--data", "pixels.npz", "--sigma", "0.1", "--N0", "8", "--N", "64", "--device", "cpu", "--quiet"]
    stats = ["--mean", *MEAN, "--std", *STD]
    assert main(["certify", *common, "--model", "probust_norm_nets:net", "--untrained", *stats, "--out", "a"]) == 0
    assert main(["certify", *common, "--model", "probust_norm_nets:normalised_net", "--untrained", "--out", "b"]) == 0
    a, b = (read_certified(root / d).sort_values("index") for d in ("a", "b"))
    for column in ("prediction", "radius", "p_lower", "hits"):
        np.testing.assert_array_equal(a[column].to_numpy(), b[column].to_numpy())
    assert read_config(root / "a")["run"]["std"] == [float(v) for v in STD]


@pytest.mark.parametrize(
    "flags,text",
    [
        (["--std", "0"], "--std: must be positive numbers, got 0"),
        (["--mean", "0.1", "0.2"], "--mean: has 2 values, the inputs [3, 4, 4] have 3 channels"),
        (["--mean", "0.1", "0.2", "--std", "1", "2", "3"], "--std: has 3 values and --mean 2"),
        (["--mean", "red"], "--mean: 'red' is not a number"),
    ],
)
def test_bad_statistics_are_one_line_errors_naming_the_flag(root, capsys, flags, text):
    assert _estimate(*BASE, "--model", "probust_norm_nets:net", "--untrained", *flags, "--out", "r") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("probust estimate: error: ") and text in err, err


def test_normalised_data_is_named_with_the_units_of_sigma(root, capsys):
    args = ["--sigma", "0.05", "--methods", "softmax", "--model", "probust_norm_nets:net", "--untrained"]
    assert _estimate("--data", "normalised.npz", *args, "--out", "n") == 0
    err = capsys.readouterr().err
    assert "probust estimate: warning: the inputs range from" in err
    assert "sigma is measured in those normalised units" in err and "--mean/--std" in err
    assert _estimate("--data", "pixels.npz", *args, "--out", "p") == 0
    assert "not [0, 1]" not in capsys.readouterr().err


def test_help_lists_mean_and_std(capsys):
    for command in ("estimate", "certify"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--mean M [M ...]" in out and "--std S [S ...]" in out
