"""Claiming a results folder: what may resume, extend or replace it, and its history."""

from __future__ import annotations

import json

import pytest

import probust
from probust.run import (
    FORMAT_VERSION,
    ConfigError,
    ConfigMismatchError,
    RunSettings,
    execute,
    prepare,
    read_config,
    read_results_config,
)
from probust.run.store import ResultStore


def settings(out, data, model, **changes) -> RunSettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.3],
        methods=["softmax"],
        out=out,
        limit=4,
        unit_size=2,
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


def _recorded_as(out, **changes) -> None:
    """Edit a folder's config.json as if another probust version had written it (a value of
    None removes the key)."""
    config = read_config(out)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    ResultStore(out).write_config(config)


@pytest.mark.parametrize("extend", [False, True])
def test_a_folder_written_by_another_probust_version_is_refused_naming_both_and_the_way_out(
    tmp_path, tiny_data, tiny_model, extend
):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model, limit=2)))
    _recorded_as(out, probust_version="0.0.1")
    for entry in (config := read_config(out))["history"]:
        entry["probust_version"] = "0.0.1"
    ResultStore(out).write_config(config)
    # resuming the same grid, or extending it with more points
    again = settings(out, tiny_data, tiny_model, limit=4 if extend else 2, extend=extend)
    with pytest.raises(ConfigMismatchError) as info:
        prepare(again)
    message = str(info.value)
    assert f"probust 0.0.1, this is probust {probust.__version__}" in message
    assert "use overwrite=True to replace them, or another out folder (or allow_version_change=True" in message
    assert info.value.differences == [f"probust_version: 0.0.1 there, {probust.__version__} here"]
    # nothing was computed or recorded, and the folder was released
    with ResultStore(out).lock():
        pass
    assert len(read_config(out)["history"]) == 1


def test_allow_version_change_resumes_and_is_recorded_in_the_history(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model, limit=2)))
    _recorded_as(out, probust_version="0.0.1")
    summary = execute(prepare(settings(out, tiny_data, tiny_model, extend=True, allow_version_change=True)))
    assert summary.rows_computed == 2 and summary.rows_total == 4
    history = read_results_config(out).history
    assert [h.allow_version_change for h in history] == [False, True]
    assert history[-1].probust_version == probust.__version__
    # the folder now holds rows of two versions: every later call must allow it again
    with pytest.raises(ConfigMismatchError, match="written by probust 0.0.1"):
        prepare(settings(out, tiny_data, tiny_model))
    # overwrite starts the folder again under this version, which then resumes as usual
    execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True)))
    assert execute(prepare(settings(out, tiny_data, tiny_model))).rows_computed == 0


def test_a_history_entry_of_another_version_is_refused_too(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    config = read_config(out)
    config["history"][0]["probust_version"] = "0.1.5"
    ResultStore(out).write_config(config)
    with pytest.raises(ConfigMismatchError, match=r"written by probust 0\.1\.5, this is probust"):
        prepare(settings(out, tiny_data, tiny_model))


def test_a_folder_that_records_no_probust_version_counts_as_another_version(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    config = read_config(out)
    del config["probust_version"]
    for entry in config["history"]:
        del entry["probust_version"]
    ResultStore(out).write_config(config)
    with pytest.raises(ConfigMismatchError, match="written by probust an unrecorded version.*use overwrite=True"):
        prepare(settings(out, tiny_data, tiny_model))
    assert execute(prepare(settings(out, tiny_data, tiny_model, allow_version_change=True))).rows_computed == 0


@pytest.mark.parametrize("recorded", [0, FORMAT_VERSION + 1, None])
def test_a_folder_in_another_results_format_is_refused_even_with_allow_version_change(
    tmp_path, tiny_data, tiny_model, recorded
):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model)))
    _recorded_as(out, format_version=recorded)
    there = "no format version" if recorded is None else f"format version {recorded}"
    for allow in (False, True):
        with pytest.raises(ConfigMismatchError) as info:
            prepare(settings(out, tiny_data, tiny_model, allow_version_change=allow))
        assert f"holds results in {there} (probust {probust.__version__})" in str(info.value)
        assert f"writes format version {FORMAT_VERSION}; use overwrite=True to replace them, or another out" in str(
            info.value
        )
    summary = execute(prepare(settings(out, tiny_data, tiny_model, overwrite=True)))
    assert summary.rows_computed == 4 and read_config(out)["format_version"] == FORMAT_VERSION


def test_the_same_version_resumes_without_allow_version_change(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(settings(out, tiny_data, tiny_model, limit=2)))
    assert execute(prepare(settings(out, tiny_data, tiny_model, limit=4, extend=True))).rows_computed == 2
    assert [h.allow_version_change for h in read_results_config(out).history] == [False, False]
