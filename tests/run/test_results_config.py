"""config.json read typed: a configuration written by the runner, and older ones lacking later keys."""

from __future__ import annotations

import json

import pytest
import torch

import probust
from probust.run import (
    FORMAT,
    FORMAT_VERSION,
    hash_state_dict,
    is_results_folder,
    read_config,
    read_results_config,
    run_estimate,
)
from probust.run.results_config import SETTING_DEFAULTS, ResultsConfig


def test_a_config_written_by_the_runner_reads_typed(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    run_estimate(
        tiny_data,
        tiny_model,
        [0.3, 0.1],
        ["softmax", "mc"],
        out,
        mc_samples=50,
        limit=5,
        seed=3,
        device="cpu",
        show_progress=False,
    )
    cfg = read_results_config(out)
    assert cfg is not None and cfg.is_probust and is_results_folder(out)
    assert (cfg.format, cfg.format_version) == (FORMAT, FORMAT_VERSION)
    assert (cfg.probust_version, cfg.torch_version) == (probust.__version__, torch.__version__)
    assert cfg.device == "cpu" and cfg.world_size == 1 and cfg.created is not None
    s = cfg.settings
    assert (s.dataset, s.split, s.data_size, s.seed) == ("tiny", "test", 20, 3)
    assert (cfg.dataset, cfg.split, cfg.seed) == ("tiny", "test", 3)
    assert s.model_sha256 == hash_state_dict(tiny_model) == cfg.model.sha256 and len(s.data_sha256 or "") == 64
    assert (s.target, s.temperature, s.tol, s.confidence) == ("prediction", 1.0, 1e-4, 0.95)
    assert (s.interval, s.sampling, s.p_fail, s.target_half_width) == ("wilson", "centred", False, None)
    assert cfg.requests == (
        {
            "sigmas": [0.1, 0.3],
            "methods": ["mc", "softmax"],
            "mc_samples": [50],
            "mmse_samples": [],
            "n_points": 5,
            "indices": [[0, 5]],
        },
    )
    assert cfg.model.source == "nn.Module" and cfg.model.file is None and cfg.model_meta == {}
    assert cfg.model.class_name == "torch.nn.modules.container.Sequential"
    assert cfg.data.input_shape == (1, 4, 4) and cfg.data.num_classes == 3 and cfg.classes == ("a", "b", "c")
    (entry,) = cfg.history
    assert entry.finished is not None and entry.argv is None and entry.world_size == 1 and entry.host
    assert cfg.raw == read_config(out) == json.loads((out / "config.json").read_text())
    assert cfg.run_values == cfg.raw["run"]
    # the merged table carries the same configuration in its metadata
    merged = read_results_config(out / "results.parquet")
    assert merged is not None and merged.settings == s and merged.requests == cfg.requests


def test_an_older_config_lacking_later_keys_reads_with_the_values_it_implied(tmp_path):
    old = {
        "format": "probust.results",
        "run": {
            "dataset": "fashion-mnist",
            "seed": 2,
            "model_sha256": "ab" * 32,
            "confidence": 0.9,
            "sampling": "iid",
        },
        "requests": [{"sigmas": [0.1], "methods": ["mc_cv"], "mc_samples": [100], "mmse_samples": []}],
        "model": {"source": "/models/cnn.pt", "meta": {"dataset": "fashion-mnist", "arch": "cnn"}},
    }
    (tmp_path / "config.json").write_text(json.dumps(old))
    cfg = read_results_config(tmp_path)
    assert cfg is not None and cfg.is_probust and is_results_folder(tmp_path)
    assert cfg.format_version is None and cfg.probust_version is None and cfg.history == ()
    s = cfg.settings
    assert (s.dataset, s.split, s.seed, s.confidence, s.data_size) == ("fashion-mnist", "test", 2, 0.9, None)
    assert s.sampling == "iid"
    assert s.p_fail is SETTING_DEFAULTS["p_fail"] is False and s.target_half_width is None
    assert cfg.run_values == {
        "dataset": "fashion-mnist",
        "seed": 2,
        "model_sha256": "ab" * 32,
        "confidence": 0.9,
        "sampling": "iid",
        "p_fail": False,
        "target_half_width": None,
        "noise": {"kind": "gaussian"},
        "prune": "auto",
        "gradients": "auto",
        "check_draws": None,
        "model_args": {},
        "mean": None,  # no normalisation was recorded: the model ran as given
        "std": None,
    }
    assert s.prune == "auto" and s.gradients == "auto"
    assert cfg.model.file == "/models/cnn.pt" and cfg.model.class_name is None
    assert cfg.model_meta == {"dataset": "fashion-mnist", "arch": "cnn"}
    assert cfg.data.input_shape is None and cfg.data.num_classes is None and cfg.classes == ()
    assert cfg.requests == tuple(old["requests"])
    # the smallest configuration the experiments accept
    tiny = ResultsConfig.from_dict({"format": "probust.results"})
    assert tiny.is_probust and tiny.seed == 0 and tiny.split == "test" and tiny.dataset is None


def test_what_is_not_a_results_config_is_told_apart(tmp_path):
    assert read_results_config(tmp_path) is None and not is_results_folder(tmp_path)
    for text in ('{"format": "other"}', "[1, 2]", "{not json"):
        (tmp_path / "config.json").write_text(text)
        assert not is_results_folder(tmp_path)
    assert not ResultsConfig.from_dict({"format": "other"}).is_probust
    with pytest.raises(ValueError, match="JSON object"):
        ResultsConfig.from_dict([1, 2])
    with pytest.raises(ValueError, match="seed"):
        ResultsConfig.from_dict({"format": "probust.results", "run": {"seed": "abc"}})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_results_config(tmp_path)
