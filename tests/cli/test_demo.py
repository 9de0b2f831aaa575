"""probust.cli.demo: `probust demo`'s options, its printers and the summary, and the command end to end (--quick)."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from probust import demo
from probust.cli import demo as cli_demo
from probust.cli import main


def _summary(tmp_path, outputs):
    from types import SimpleNamespace

    from probust.report import Report

    report = Report(path=tmp_path / "report.html", outputs=outputs, results=SimpleNamespace(standard=lambda: []))
    seconds = {"train_and_score": 1.0, "experiments_and_report": 2.0, "total": 3.0}
    return demo.DemoSummary(out=tmp_path, config=demo.config_for("digits", quick=True), report=report, seconds=seconds)


def test_summary_prints_whichever_experiments_ran_when_estimation_error_was_skipped(tmp_path, capsys):
    from probust.experiments import Output

    def skipped(name):
        return Output(name=name, title=name, description="", skipped="no Monte Carlo rows")

    runtime = pd.DataFrame(
        {
            "mode": ["batched"] * 2,
            "method": ["taylor", "softmax"],
            "n_samples": [0, 0],
            "speedup_vs_mc": [40.0, 900.0],
            "speedup_reference": ["mc n=1,000"] * 2,
        }
    )
    ran = Output(name="runtime", title="runtime", description="", tables={"runtime": runtime})
    cli_demo.print_summary(_summary(tmp_path, [skipped("estimation_error"), ran]))
    printed = capsys.readouterr().out
    assert "Mean |p_hat - p_mc|" not in printed
    assert "Speed-up over mc n=1,000 (batched, this machine): p^taylor 40x, p^softmax 900x" in printed
    assert "Experiments not run: estimation_error" in printed and f"Report: {tmp_path / 'report.html'}" in printed
    cli_demo.print_summary(_summary(tmp_path, [skipped("estimation_error"), skipped("runtime")]))
    assert "Experiments not run: estimation_error, runtime" in capsys.readouterr().out


def test_cli_hands_the_demo_its_per_experiment_printer(tmp_path, monkeypatch, capsys):
    from probust.cli.report import print_output

    seen = []

    def fake_run_demo(out, **kwargs):
        seen.append(kwargs)
        raise demo.DemoConfigError("stop here")

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    assert main(["demo", "--data", "digits", "--out", str(tmp_path)]) == 2
    assert main(["demo", "--data", "digits", "--out", str(tmp_path), "--quiet"]) == 2
    assert seen[0]["on_output"] is print_output and seen[0]["verbose"]
    assert seen[1]["on_output"] is None and not seen[1]["verbose"]
    assert seen[0]["say"] is cli_demo.say


@pytest.mark.parametrize("quiet", [False, True])
def test_cli_prints_the_summary_the_library_returns(tmp_path, monkeypatch, capsys, quiet):
    summary = _summary(tmp_path, [])
    monkeypatch.setattr(demo, "run_demo", lambda out, **kwargs: summary)
    assert main(["demo", "--data", "digits", "--out", str(tmp_path)] + (["--quiet"] if quiet else [])) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(f"Report: {tmp_path / 'report.html'}")
    assert "Done in 3 s (models 1 s, experiments and report 2 s)." in printed


def test_cli_say_prints_one_line_at_once_and_can_be_sent_to_worker_processes(capsys):
    import pickle

    cli_demo.say("  [model] trained")
    assert capsys.readouterr().out == "  [model] trained\n"
    assert pickle.loads(pickle.dumps(cli_demo.say)) is cli_demo.say


def test_cli_rejects_bad_options(tmp_path, capsys):
    assert main(["demo", "--points", "1", "--out", str(tmp_path)]) == 2
    assert "--points" in capsys.readouterr().err
    assert main(["demo", "--data", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown data set" in capsys.readouterr().err
    assert main(["demo", "--jobs", "0", "--out", str(tmp_path)]) == 2


def _files(folder):
    """sha256 and mtime of every checkpoint and results file under a demo folder.

    Leaves out each results folder's lock and config.json, where every run of the runner (even
    one with nothing left to compute) appends a record of itself.
    """
    found = {}
    for sub in ("models", "results"):
        for path in sorted((folder / sub).rglob("*")):
            if path.is_file() and path.name not in (".lock", "config.json"):
                found[str(path.relative_to(folder))] = (
                    hashlib.sha256(path.read_bytes()).hexdigest(),
                    path.stat().st_mtime_ns,
                )
    return found


@pytest.mark.slow(seconds=50)
def test_demo_quick_end_to_end_then_reuses_everything(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = out / "report.html"
    assert report.is_file() and f"Report: {report}" in printed
    assert "Mean |p_hat - p_mc|" in printed and "p^mmse" in printed and "least robust class" in printed
    record = json.loads((out / "demo.json").read_text())
    assert record["command"] == f"probust demo --out {out} --seed 0 --quick"
    assert record["settings"]["points"] == 30 and record["seconds"]["total"] > 0
    assert all(m["trained"] for m in record["models"])
    text = report.read_text(encoding="utf-8")
    assert "Not run:" not in text
    # the main CNN and the robust-loss CNN are certified: the report's last experiment has both
    certified = [m for m in record["models"] if m["certified"]]
    assert {m["name"] for m in certified} == {"fashion-mnist-cnn-lambda0", "fashion-mnist-cnn-robust0.3-sigma0.2"}
    table = pd.read_csv(out / "experiments" / "certified_accuracy" / "certified_accuracy.csv")
    assert len(table) == 2 and (table["points"] == 10).all() and (table["sigma"] == 0.2).all()
    assert (table["draws_mean"] == 550).all() and table["certified@0"].between(0, 1).all()
    first = pd.read_csv(out / "experiments" / "estimation_error" / "estimation_error.csv")
    first_tables = {
        p.relative_to(out): pd.read_csv(p) for p in (out / "experiments").rglob("*.csv") if "runtime" not in p.parts
    }
    files = _files(out)
    assert any(name.endswith("results.parquet") for name in files)
    # a second run reuses the checkpoints and the results, and gives the same numbers
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert "trained" not in again and "reused" in again
    pd.testing.assert_frame_equal(first, pd.read_csv(out / "experiments" / "estimation_error" / "estimation_error.csv"))
    # it reran nothing: every checkpoint and results file is the same file, untouched, and every
    # model says so; every experiment's table (but the runtimes, which are measured) is the same
    assert _files(out) == files
    assert not any(m["trained"] for m in json.loads((out / "demo.json").read_text())["models"])
    assert sum(f"reused {m['name']}:" in again for m in record["models"]) == len(record["models"])
    assert "scored" not in again
    for name, table in first_tables.items():
        pd.testing.assert_frame_equal(table, pd.read_csv(out / name), obj=str(name))
