"""probust.experiments.base: the Experiment contract and writing an Output's files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from probust.experiments.base import Experiment, ExperimentSkipped, Output, finish


class Thirds(Experiment):
    name = "thirds"
    title = "0. Thirds"
    description = "a table of thirds"

    def run(self, results, out):
        main = pd.DataFrame({"k": [1, 2], "x": [1 / 3, 2 / 3]})
        extra = pd.DataFrame({"y": [1e-7]})
        return finish(
            Output(
                name=self.name, title=self.title, description=self.description, tables={"thirds": main, "extra": extra}
            ),
            Path(out),
        )


def test_finish_writes_the_main_and_secondary_tables_under_their_documented_names(tmp_path):
    out = Thirds().run(None, tmp_path)
    assert out.files == [tmp_path / "thirds.csv", tmp_path / "thirds_extra.csv"]
    # 6 significant digits, as documented in the docs' golden-run section
    assert (tmp_path / "thirds.csv").read_text().splitlines() == ["k,x", "1,0.333333", "2,0.666667"]
    assert (tmp_path / "thirds_extra.csv").read_text().splitlines() == ["y", "1e-07"]
    assert out.table is out.tables["thirds"]


def test_finish_lists_the_svg_beside_every_figure(tmp_path):
    png = tmp_path / "figure.png"
    out = finish(
        Output(name="f", title="t", description="d", tables={"f": pd.DataFrame({"a": [1]})}, figures=[png]), tmp_path
    )
    assert out.files == [tmp_path / "f.csv", png, tmp_path / "figure.svg"]


def test_the_report_shows_the_main_table_and_no_summary_by_default(tmp_path):
    e = Thirds()
    out = e.run(None, tmp_path)
    [(caption, frame)] = e.display(out)
    assert caption == "thirds" and frame is out.tables["thirds"]
    assert e.summary(out, None) == []
    # an output without its main table shows an empty one
    [(_, empty)] = e.display(Output(name="thirds", title="", description=""))
    assert empty.empty


def test_a_skipped_output_carries_the_experiments_names_and_the_reason():
    out = Thirds().skipped("no rows")
    assert (out.name, out.title, out.description, out.skipped) == (
        "thirds",
        "0. Thirds",
        "a table of thirds",
        "no rows",
    )
    assert out.tables == {} and out.figures == [] and out.files == []


def test_run_is_left_to_each_experiment():
    with pytest.raises(NotImplementedError):
        Experiment().run(None, "out")
    assert issubclass(ExperimentSkipped, Exception)
