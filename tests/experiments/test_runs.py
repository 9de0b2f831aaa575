"""Finding results folders and loading them into Results: which runs, in which order, named how."""

from __future__ import annotations

import pytest

from probust.experiments.runs import Results, find_runs, load_results

LINEAR = {"dataset": "digits", "arch": "linear", "epochs": 5, "seed": 0}


def test_find_runs_returns_every_results_folder_below_and_no_other(tmp_path, write_run):
    a = write_run(tmp_path, "a")
    b = write_run(tmp_path / "deeper" / "still", "b")
    write_run(tmp_path / ".hidden", "c")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "config.json").write_text('{"format": "other"}')
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("[1]")
    assert find_runs(tmp_path) == sorted([a, b])
    assert find_runs(tmp_path, max_depth=1) == [a]
    assert find_runs(a) == [a]  # the folder itself is a run
    with pytest.raises(FileNotFoundError, match="no such folder"):
        find_runs(tmp_path / "nope")


def test_load_results_reads_every_run_with_rows_sorted_and_uniquely_labelled(tmp_path, write_run):
    write_run(tmp_path, "cnn", meta={**LINEAR, "arch": "cnn", "grad_reg": 0.0})
    write_run(tmp_path, "lin-big", meta={**LINEAR, "grad_reg": 0.1})
    write_run(tmp_path, "lin-0", meta={**LINEAR, "grad_reg": 0.0})
    write_run(tmp_path, "lin-0-again", meta={**LINEAR, "grad_reg": 0.0})
    write_run(tmp_path, "empty", meta=LINEAR, rows=())
    results = load_results(tmp_path)
    assert isinstance(results, Results) and results.root == tmp_path and len(results) == 4
    # linear before other architectures, then lambda, then path; a repeated label names its folder
    assert [r.path.name for r in results] == ["lin-0", "lin-0-again", "lin-big", "cnn"]
    assert [r.label for r in results] == [
        "digits linear (lin-0)",
        "digits linear (lin-0-again)",
        "digits linear, λ=0.1",
        "digits CNN",
    ]
    assert results.by_label("digits CNN").path.name == "cnn" and results.by_label("lin-big").label.endswith("0.1")
    with pytest.raises(KeyError, match="no run named"):
        results.by_label("nope")
    assert [r.path.name for r in results.standard()] == ["lin-0", "lin-0-again", "cnn"]
    fam = results.families()
    assert [[r.path.name for r in f] for f in fam] == [["lin-0", "lin-big"]]
    # a list of folders is read as given, rooted at their common parent
    listed = load_results([tmp_path / "cnn", tmp_path / "lin-big"])
    assert listed.root == tmp_path and [r.path.name for r in listed] == ["lin-big", "cnn"]


def test_the_primary_run_is_the_standard_one_with_mmse_and_the_most_points(tmp_path, write_run):
    few = [(i, 0.1, "mmse", 5, 0.5) for i in range(3)]
    many = [(i, 0.1, "mmse", 5, 0.5) for i in range(6)]
    write_run(tmp_path, "a", meta={**LINEAR, "test_accuracy": 0.99}, rows=few)
    write_run(tmp_path, "b", meta={**LINEAR, "arch": "cnn", "test_accuracy": 0.5}, rows=many)
    write_run(tmp_path, "c", meta={**LINEAR, "grad_reg": 0.1}, rows=many + [(6, 0.1, "mmse", 5, 0.5)])
    write_run(tmp_path, "d", meta={**LINEAR, "arch": "vit"}, rows=[(i, 0.1, "mc", 5, 0.5) for i in range(9)])
    assert load_results(tmp_path).primary().path.name == "b"


def test_folders_without_rows_or_runs_are_reported(tmp_path, write_run):
    with pytest.raises(FileNotFoundError, match="no probust results folder"):
        load_results(tmp_path)
    write_run(tmp_path, "empty", rows=())
    with pytest.raises(FileNotFoundError, match="hold no rows yet"):
        load_results(tmp_path)
