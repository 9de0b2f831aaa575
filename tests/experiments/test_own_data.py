"""The report on one's own model and data: models named, the measuring experiments held back, the
case study's warning, and a certify-only folder's configuration."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from probust import experiments
from probust.errors import OptionError
from probust.experiments.case_study import chance_half_width, too_few
from probust.experiments.run_info import Run
from probust.experiments.runs import Results
from probust.report import build_report, held_back, render_html

MEASURING = {"runtime", "case_study"}


@pytest.mark.parametrize(
    ("model", "meta", "label"),
    [
        ({"source": "/home/me/nets/smallnet.pt"}, {}, "photos smallnet"),
        (
            {"source": "factory:torchvision.models:resnet18", "class": "torchvision.models.resnet.ResNet"},
            {},
            "photos ResNet18",  # the factory function, spelt as the paper does
        ),
        ({"source": "nn.Module", "class": "my_lab.models.TinyViT"}, {}, "photos TinyViT"),
        ({"source": "/m/ckpt.pt"}, {"arch": "cnn", "dataset": "photos"}, "photos CNN"),
        ({}, {}, "photos ?"),
    ],
)
def test_a_model_is_named_from_its_file_factory_or_class(tmp_path, write_run, model, meta, label):
    write_run(tmp_path, "r", model=model, meta=meta, run={"dataset": "photos"})
    (run,) = experiments.load_results(tmp_path).runs
    assert run.label == label


def test_measuring_experiments_are_held_back_on_ones_own_results_only(tmp_path, write_run):
    write_run(tmp_path / "own", "r", model={"source": "/x/net.pt"}, run={"dataset": "photos"})
    write_run(tmp_path / "paper", "r", meta={"arch": "cnn", "dataset": "digits"})
    own, paper = experiments.load_results(tmp_path / "own"), experiments.load_results(tmp_path / "paper")
    assert not own.paper_setting() and paper.paper_setting()
    assert set(held_back(own)) == MEASURING
    assert "n = 10,000" in held_back(own)["runtime"] and "--measure on" in held_back(own)["case_study"]
    assert held_back(paper) == {}
    assert held_back(own, "on") == {}
    assert set(held_back(paper, "off")) == MEASURING
    assert set(held_back(own, only=["runtime", "class_bias"])) == {"case_study"}  # asked by name: it runs
    with pytest.raises(OptionError) as info:
        held_back(own, "sometimes")
    assert info.value.field == "measure"


def test_report_lists_held_back_experiments_as_not_run_with_the_reason(tmp_path, write_run):
    folder = write_run(tmp_path, "r", model={"source": "/x/net.pt"}, run={"dataset": "photos"})
    keep = ("runtime", "case_study", "distribution")
    others = [n for n in experiments.EXPERIMENTS if n not in keep]
    report = build_report(folder, tmp_path / "out", skip=others)  # measure="auto": their own results
    assert [o.name for o in report.outputs] == list(keep)
    assert "held back on one's own model or data" in report.output("runtime").skipped
    assert "trains small CNNs" in report.output("case_study").skipped
    assert report.output("distribution").skipped is None
    assert "held back on one&#x27;s own model or data" in report.path.read_text()


def test_chance_band_is_the_binomial_central_95_percent():
    # against scipy's exact binomial quantiles, where the normal approximation is close
    for n in (100, 400, 2500):
        low, high = stats.binom.ppf([0.025, 0.975], n, 0.5) / n
        assert chance_half_width(n) == pytest.approx((high - low) / 2, abs=1.5 / n)


def test_case_study_warns_below_the_points_it_asks_for():
    summary = pd.DataFrame({"score": ["mmse", "softmax"], "mean_accuracy": [0.45, 0.9], "n_test": [100, 100]})
    assert too_few(pd.Series([25, 30]), 25, summary) is None
    text = too_few(pd.Series([8, 8, 9]), 25, summary)
    assert text is not None and "read it as chance" in text
    assert "8 per end" in text and "tests 100 images" in text and "at least 50 scored points" in text
    band = 100 * 1.959963984540054 * 0.5 / math.sqrt(100)
    assert f"50% ± {band:.1f}%" in text
    assert "p<sup>mmse</sup> 45.0%" in text and "90.0%" not in text  # only those inside 50% ± 9.8%


def test_a_certify_only_folder_counts_and_shows_its_configuration(tmp_path):
    config = {
        "format": "probust.certify",
        "run": {"dataset": "photos", "split": "all", "data_size": 48, "seed": 0, "n0": 20, "n": 200, "alpha": 0.001},
        "requests": [{"sigmas": [0.1, 0.25], "n_points": 6}],
        "model": {"source": str(tmp_path / "smallnet.pt"), "meta": {}},
        "data": {"classes": ["cat", "dog", "owl"]},
        "probust_version": "0.3.0",
        "history": [{"argv": ["probust", "certify", "--n", "200"]}],
    }
    run = Run(path=tmp_path / "cert", config=config, table=pd.DataFrame({"label": [0, 2]}), label="photos smallnet")
    results = Results(root=tmp_path, runs=[], certified=[run])
    page = render_html([], results, tmp_path / "report.html")
    assert "from 1 results folder(s) (1 of probust certify)" in page
    configuration = page[page.index('id="configuration"') :]
    for text in (
        "photos smallnet",
        "n0 20, n 200, alpha 0.001",
        "6 pts, σ 0.1 0.25",
        "cat, dog, owl",
        "probust certify --n 200",
    ):
        assert text in configuration
