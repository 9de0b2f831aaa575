"""Claiming a results folder: what may resume, extend or replace it, and its history."""

from __future__ import annotations

import json

import pytest

from probust.run import ConfigError, ConfigMismatchError, RunSettings, execute, prepare, read_config
from probust.run.store import ResultStore


def settings(out, data, model, **changes) -> RunSettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.3],
        methods=["softmax"],
        out=out,
        limit=4,
        batch_size=2,
        mc_samples=50,
        mmse_samples=3,
        device="cpu",
        show_progress=False,
    )
    args.update(changes)
    return RunSettings(**args)


def test_a_folder_of_another_format_is_refused(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"format": "someone.else", "run": {}}))
    with pytest.raises(ConfigMismatchError, match=r"config.json is not a probust results configuration; use overwrite"):
        prepare(settings(out, tiny_data, tiny_model))
    (out / "config.json").write_text("[1, 2]")  # JSON, but not an object
    with pytest.raises(ConfigMismatchError, match="not a probust results configuration"):
        prepare(settings(out, tiny_data, tiny_model))
    summary = execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True)))
    assert summary.rows_computed == 4 and read_config(out)["format"] == "probust.results"


def test_result_files_without_a_config_are_kept_unless_overwrite(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    (out / "config.json").unlink()
    with pytest.raises(ConfigError, match="^out: .* holds result files but no config.json"):
        prepare(settings(out, tiny_data, tiny_model))
    assert execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True))).rows_computed == 4


def test_the_same_grid_resumes_and_each_process_is_recorded_in_the_history(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    summary = execute(prepare(settings(out, tiny_data, tiny_model), argv=["estimate", "--again"]))
    assert (summary.rows_computed, summary.rows_present, summary.rows_total) == (0, 4, 4)
    config = read_config(out)
    assert len(config["requests"]) == 1
    assert [h["argv"] for h in config["history"]] == [None, ["estimate", "--again"]]
    assert all(h["finished"] is not None for h in config["history"])
    # overwrite starts the folder again: one request, one process
    execute(prepare(settings(out, tiny_data, tiny_model, seed=1, overwrite=True)))
    config = read_config(out)
    assert len(config["requests"]) == 1 and len(config["history"]) == 1 and config["run"]["seed"] == 1


def test_a_request_from_before_mmse_samples_was_recorded_for_mc_cv_means_five_copies(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    old = settings(out, tiny_data, tiny_model, methods=["mc_cv"], mmse_samples=5)
    execute(prepare(old))
    config = read_config(out)
    assert config["requests"][0]["mmse_samples"] == [5]
    config["requests"][0]["mmse_samples"] = []  # as the runner wrote it before passing mmse_samples on
    ResultStore(out).write_config(config)
    # the same run resumes: nothing differs, nothing is left to do
    assert execute(prepare(old)).rows_computed == 0
    # extending with mc_cv rows of another linearisation would mix two in one table
    with pytest.raises(ConfigMismatchError, match="linearised with 5 MMSE copies, this run would use 3"):
        prepare(old.replace(mmse_samples=3, sigmas=[0.1], extend=True))


def test_a_folder_being_written_is_refused_naming_out(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    with ResultStore(out).lock(), pytest.raises(ConfigError, match="^out: .*another run"):
        prepare(settings(out, tiny_data, tiny_model))
