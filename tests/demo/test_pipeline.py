"""probust.demo.pipeline: data fallback, progress through callbacks only, and the whole pipeline (--quick)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from probust import data as pdata
from probust import demo
from probust.demo import pipeline


def test_falls_back_to_digits_with_a_message_when_fashion_mnist_is_missing(monkeypatch):
    real = pdata.load

    def load(name, split="test", root=None, download=False):
        if pdata.canonical_name(name) == "fashion-mnist":
            raise pdata.ProbustDataError(
                "fashion-mnist (test split) not found: missing t10k-images\nto get it: apt-get install dataset-fashion-mnist"
            )
        return real(name, split, root, download)

    monkeypatch.setattr(pdata, "load", load)
    said = []
    name, reason = pipeline._resolve_data(None, said.append)
    assert name == "digits" and "not on this machine" in reason
    assert any("falling back to scikit-learn's 8x8 digits" in line for line in said)
    assert any("apt-get install dataset-fashion-mnist" in line for line in said)
    # an explicitly requested data set that is missing is an error, not a silent fallback
    with pytest.raises(pdata.ProbustDataError):
        pipeline._resolve_data("fashion-mnist", said.append)


@pytest.fixture
def no_work(monkeypatch):
    """run_demo with its models, experiments and report replaced by stubs that record what they got."""
    import probust.experiments
    import probust.report

    calls: dict[str, list] = {"models": [], "say": []}

    def run_model(cfg, spec, threads, say):
        calls["models"].append(spec.name)
        calls["say"].append(say)
        if say is not None:
            say(f"  [{spec.name}] stub")
        certified = None if spec.certified is None else str(spec.certified)
        return {"name": spec.name, "results": str(spec.results), "certified": certified}

    monkeypatch.setattr(pipeline, "run_model", run_model)
    monkeypatch.setattr(probust.experiments, "load_results", lambda folders: SimpleNamespace(root=None))
    monkeypatch.setattr(probust.report, "build_report", lambda *args, **kwargs: SimpleNamespace(path="report.html"))
    return calls


def test_the_library_prints_nothing_and_reports_progress_through_say(tmp_path, no_work, capsys):
    summary = demo.run_demo(tmp_path / "silent", data="digits", quick=True)
    assert capsys.readouterr() == ("", "")
    assert no_work["say"] and all(say is None for say in no_work["say"])
    assert [m["name"] for m in summary.models] == [
        s.name for s in demo.model_specs(summary.config, tmp_path / "silent")
    ]
    said: list[str] = []
    demo.run_demo(tmp_path / "told", data="digits", quick=True, say=said.append)
    assert capsys.readouterr() == ("", "")
    assert (
        said[0].startswith("probust demo: digits, 4 models")
        and "training and scoring:" in said
        and "experiments:" in said
    )
    assert sum(line.endswith("] stub") for line in said) == 4
    # verbose=False silences say too
    said.clear()
    demo.run_demo(tmp_path / "told", data="digits", quick=True, say=said.append, verbose=False)
    assert said == [] and capsys.readouterr() == ("", "")


def test_say_must_be_picklable_for_worker_processes(tmp_path, no_work):
    with pytest.raises(TypeError, match="^say: must be picklable"):
        demo.run_demo(tmp_path, data="digits", quick=True, jobs=2, say=lambda text: None)
    assert no_work["models"] == []


def test_bad_settings_are_refused_before_any_work(tmp_path, no_work):
    with pytest.raises(demo.DemoConfigError, match="^robust_warmup"):
        demo.run_demo(tmp_path, config=demo.config_for("digits", quick=True, robust_warmup=2.0))
    assert no_work["models"] == [] and not (tmp_path / "demo.json").exists()


@pytest.mark.slow(seconds=41)
def test_demo_numbers_do_not_depend_on_the_number_of_worker_processes(tmp_path, capfd):
    one = demo.run_demo(tmp_path / "one", data="digits", quick=True, jobs=1)
    two = demo.run_demo(tmp_path / "two", data="digits", quick=True, jobs=2, verbose=False)
    # without a say callback the library prints nothing, in this process or in its workers
    assert capfd.readouterr().out == ""
    for a, b in zip(one.models, two.models):
        ta = pd.read_parquet(a["results"] + "/results.parquet").drop(columns="seconds")
        tb = pd.read_parquet(b["results"] + "/results.parquet").drop(columns="seconds")
        pd.testing.assert_frame_equal(ta, tb)
    for name in ("estimation_error", "class_bias", "case_study"):
        pd.testing.assert_frame_equal(one.report.output(name).table, two.report.output(name).table)
    record = json.loads((tmp_path / "two" / "demo.json").read_text())
    assert record["jobs"] == 2 and [m["name"] for m in record["models"]] == [m["name"] for m in two.models]
