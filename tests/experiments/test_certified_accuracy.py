"""The certified-accuracy experiment and the report, from a ``probust certify`` folder."""

from __future__ import annotations

import numpy as np
import pytest

from probust import experiments
from probust.experiments.certified_accuracy import NAME, TABLE_RADII
from probust.report import build_report
from probust.run.certify import CertifySettings, read_certified, run_certify
from tests._helpers import tiny_data, tiny_model


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("certified")
    settings = CertifySettings(
        data=tiny_data(10),
        model=tiny_model(),
        sigmas=[0.25, 0.5],
        n0=16,
        n=256,
        estimate="taylor",
        unit_size=4,
        device="cpu",
        show_progress=False,
        out=root / "cert",
    )
    run_certify(settings)
    return root


def test_certify_folders_are_found_apart_from_estimate_runs(root):
    results = experiments.load_results(root)
    assert results.runs == [] and [r.path for r in results.certified] == [root / "cert"]


def test_the_curve_is_certified_accuracy_against_radius_with_the_estimate_beside_it(root, tmp_path):
    output = experiments.run(NAME, root, tmp_path)
    assert output.skipped is None, output.skipped
    table, curve = output.table, output.tables["curve"]
    rows = read_certified(root / "cert")
    assert sorted(table.sigma) == [0.25, 0.5] and (table.points == 10).all()
    for sigma in (0.25, 0.5):
        mine = rows[rows.sigma == sigma]
        certificate = curve[(curve.sigma == sigma) & (curve.curve == "certificate")]
        estimate = curve[(curve.sigma == sigma) & (curve.curve == "estimate (taylor)")]
        assert len(certificate) and len(estimate)
        # At r = 0: the share of correct (not abstaining) points; never increasing with r.
        assert certificate.accuracy.iloc[0] == pytest.approx(mine.correct.mean())
        assert (np.diff(certificate.accuracy.to_numpy()) <= 0).all()
        assert (np.diff(estimate.accuracy.to_numpy()) <= 0).all()
        row = table[table.sigma == sigma].iloc[0]
        assert row["draws_mean"] == 16 + 256  # fixed-n CERTIFY: n0 + n draws per point
        for r in TABLE_RADII:
            expected = (mine.correct & (mine.radius >= r)).mean()
            assert row[f"certified@{r:g}"] == pytest.approx(expected)
    assert output.figures and output.figures[0].is_file()


def test_the_report_shows_the_certify_section(root, tmp_path):
    report = build_report(root, tmp_path, only=[NAME])
    html = report.path.read_text()
    assert "Certified accuracy by randomized smoothing" in html and "certified@0.5" in html


def test_without_certify_folders_it_is_skipped(tmp_path):
    results = experiments.Results(root=tmp_path, runs=[])
    output = experiments.run(NAME, results, tmp_path)
    assert output.skipped and "probust certify" in output.skipped
