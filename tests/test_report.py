"""probust.report and `probust report`: one offline HTML page with every experiment."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from probust import experiments
from probust.cli import main
from probust.experiments import REGISTRY, Experiment, Output, registry
from probust.experiments.base import finish
from probust.report import build_report, error_summary
from tests._helpers import build_results

FAST = dict(
    options={
        "runtime": {"points": 1, "mc_counts": [50], "mmse_counts": [2]},
        "case_study": {"k": 3, "seeds": 1, "epochs": 1},
    },
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    results_dir = build_results(tmp_path_factory.getbasetemp() / "digits-results")
    return build_report(
        results_dir / "results", tmp_path_factory.mktemp("report"), title="test report", extra={"how": "pytest"}, **FAST
    )


def test_report_holds_every_experiment_figure_and_table_offline(report):
    text = report.path.read_text(encoding="utf-8")
    assert report.path.name == "report.html" and text.startswith("<!DOCTYPE html>")
    assert [o.name for o in report.outputs] == list(experiments.EXPERIMENTS)
    assert not [o.name for o in report.outputs if o.skipped]
    for o in report.outputs:
        assert f'id="{o.name}"' in text and o.title.split(". ", 1)[1].split(" ")[0] in text
    figures = sum(len(o.figures) for o in report.outputs)
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', text)) == figures >= 10
    # nothing is fetched from elsewhere: no external scripts, styles or images
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "<script" not in text
    assert text.count("<table>") >= 10
    # every figure's files lie beside the page, and links are relative
    for o in report.outputs:
        for png in o.figures:
            assert png.is_file() and png.with_suffix(".svg").is_file()
            assert png.parent.parent == report.path.parent / "experiments"
    assert 'href="experiments/estimation_error/estimation_error.svg"' in text


def test_report_shows_configuration_and_readings_computed_from_the_numbers(report):
    text = report.path.read_text(encoding="utf-8")
    assert 'id="configuration"' in text and "digits (test, 359 points)" in text and "pytest" in text
    ee = report.output("estimation_error")
    # the reading quotes the table's numbers
    t = ee.table
    row = t[(t.model == "digits CNN")].groupby("method")["mean_abs_error"].mean()
    best = row[[m for m in row.index if not m.startswith("mc")]].idxmin()
    assert any("<b>digits CNN</b>" in line and f"p<sup>{best}</sup>" in line for line in ee.reading)
    for o in report.outputs:
        assert o.reading, f"{o.name} has no reading"
        for line in o.reading:
            assert line in text


def test_error_summary_is_experiment_one_per_sigma(report):
    s = error_summary(report.outputs, ["digits CNN"])
    assert list(s.columns) == ["model", "estimator", "σ=0.1", "σ=0.3"]
    assert list(s["estimator"]) == [
        "p^taylor",
        "p^mmse",
        "p^taylor_mvs",
        "p^mmse_mvs",
        "p^softmax",
        "(MC 95% half-width)",
    ]
    t = report.output("estimation_error").table
    v = t[(t.model == "digits CNN") & (t.method == "mmse") & (t.sigma == 0.3)]["mean_abs_error"].iloc[0]
    assert s[s.estimator == "p^mmse"]["σ=0.3"].iloc[0] == v


def test_cli_report_writes_the_page_and_prints_its_path(tmp_path_factory, capsys):
    results_dir = build_results(tmp_path_factory.getbasetemp() / "digits-results")
    out = tmp_path_factory.mktemp("cli-report")
    code = main(["report", str(results_dir), "--out", str(out), "--only", "estimation_error", "mv_sigmoid", "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == str(out / "report.html") and (out / "report.html").is_file()
    assert (out / "experiments" / "mv_sigmoid" / "mv_sigmoid.csv").is_file()
    assert not (out / "experiments" / "runtime").exists()


def test_cli_report_refuses_a_folder_without_results(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no probust results folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_experiments_without_what_they_need_are_listed_as_not_run(tmp_path_factory):
    results_dir = build_results(tmp_path_factory.getbasetemp() / "digits-results")
    results = experiments.load_results(results_dir / "results" / "linear-0.05")  # main grid only, no family
    rep = build_report(
        results, tmp_path_factory.mktemp("partial"), only=["convergence", "robust_models", "distribution"]
    )
    skipped = {o.name: o.skipped for o in rep.outputs if o.skipped}
    assert set(skipped) == {"convergence", "robust_models"}
    text = rep.path.read_text(encoding="utf-8")
    assert text.count('class="skipped"') == 2 and "Not shown:" in text


# -- the report loops over the experiment registry ---------------------------------------------------


def test_every_registered_experiment_has_its_section_and_its_displayed_tables(report):
    text = report.path.read_text(encoding="utf-8")
    assert [o.name for o in report.outputs] == list(REGISTRY.names())
    for o in report.outputs:
        experiment = REGISTRY.get(o.name)
        assert f'<section id="{o.name}"><h2>{experiment.title}</h2><p class="desc">{experiment.description}</p>' in text
        for caption, frame in experiment.display(o):
            if not frame.empty:
                assert f"<caption>{caption}</caption>" in text
        for caption, frame in experiment.summary(o, report.results):
            if not frame.empty:
                assert text.index(f"<caption>{caption}</caption>") < text.index('<section id="estimation_error">')


class PointsPerModel(Experiment):
    """A test-local experiment: how many points each results folder scored."""

    name = "points_per_model"
    title = "12. Points per model"
    description = "The number of distinct points in each results folder."

    def run(self, results, out, *, label: str = "points"):
        table = pd.DataFrame(
            {"model": [r.label for r in results], label: [int(r.table["index"].nunique()) for r in results]}
        )
        return finish(
            Output(name=self.name, title=self.title, description=self.description, tables={self.name: table}), Path(out)
        )

    def display(self, output):
        return [("Points scored per model (test-local)", output.table)]

    def summary(self, output, results):
        return [("Points per model (test-local summary)", output.table.head(1))]


@pytest.fixture
def points_per_model():
    experiment = REGISTRY.register(PointsPerModel())
    yield experiment
    REGISTRY.unregister(experiment.name)


def test_a_newly_registered_experiment_appears_in_the_report_and_the_cli(points_per_model, tmp_path_factory, capsys):
    results_dir = build_results(tmp_path_factory.getbasetemp() / "digits-results")
    results = experiments.load_results(results_dir / "results")
    # the default loop (no --only) runs it: every built-in one is skipped
    rep = build_report(
        results,
        tmp_path_factory.mktemp("registered"),
        skip=registry.BUILTIN,
        options={"points_per_model": {"label": "n"}},
    )
    assert [o.name for o in rep.outputs] == ["points_per_model"]
    text = rep.path.read_text(encoding="utf-8")
    assert (
        '<section id="points_per_model"><h2>12. Points per model</h2>' in text
        and '<a href="#points_per_model">' in text
    )
    assert (
        "<caption>Points scored per model (test-local)</caption>" in text
        and "<caption>Points per model (test-local summary)</caption>" in text
    )
    csv = pd.read_csv(rep.path.parent / "experiments" / "points_per_model" / "points_per_model.csv")
    assert list(csv["model"]) == [r.label for r in results]
    assert list(csv["n"]) == [len(set(r.table["index"])) for r in results]
    # and `probust report --only` accepts its name
    out = tmp_path_factory.mktemp("registered-cli")
    assert main(["report", str(results_dir), "--out", str(out), "--only", "points_per_model", "--quiet"]) == 0
    assert (out / "experiments" / "points_per_model" / "points_per_model.csv").is_file()
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out / "report.html")
