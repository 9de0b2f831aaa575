"""probust demo: configuration, data fallback, and the whole pipeline end to end (--quick)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from probust import data as pdata
from probust import demo
from probust.cli import main


def test_quick_configuration_is_tiny_and_default_follows_the_paper_grid():
    full, quick = demo.config_for("fashion-mnist"), demo.config_for("fashion-mnist", quick=True)
    assert full.points == 200 and full.mc_samples == 1000 and len(full.sigmas) == 4 and full.lambdas[0] == 0
    assert full.runtime_mc == (100, 1_000, 10_000) and full.runtime_mmse == (1, 5, 10, 25, 50, 100)
    assert quick.points < 50 and quick.mc_samples <= 200 and quick.train_size is not None
    assert demo.config_for("digits").pool_points == 359
    assert demo.config_for("fashion-mnist", points=300, seed=3).points == 300


def test_model_specs_train_the_family_and_score_pool_and_convergence_on_the_main_models(tmp_path):
    cfg = demo.config_for("fashion-mnist")
    specs = {s["name"]: s for s in demo._model_specs(cfg, tmp_path)}
    robust = f"fashion-mnist-cnn-robust1-sigma{cfg.robust_sigma:g}"
    assert set(specs) == {"fashion-mnist-linear", robust, *(f"fashion-mnist-cnn-lambda{v}" for v in ("0", "0.001", "0.01", "0.1"))}
    main_cnn = specs["fashion-mnist-cnn-lambda0"]
    assert len(main_cnn["requests"]) == 3  # main grid, pool, convergence
    assert main_cnn["requests"][0]["methods"] == list(demo.PAPER_METHODS)
    assert main_cnn["requests"][1]["indices"] == "0-999" and main_cnn["requests"][1]["sigmas"] == [cfg.case_sigma]
    assert main_cnn["requests"][2]["mmse_samples"] == [1, 2, 5, 10, 20, 50, 100]
    assert len(specs["fashion-mnist-cnn-lambda0.01"]["requests"]) == 1
    assert specs["fashion-mnist-linear"]["requests"][1]["mc_samples"][-1] == 100_000
    # the checkpoint's name records what it was trained with, so other settings never reuse it
    assert specs["fashion-mnist-cnn-lambda0.01"]["checkpoint"].endswith("fashion-mnist-cnn-lambda0.01-e1-nall-s0.pt")


def test_robust_loss_cnns_are_trained_like_the_family_and_scored_on_its_grid(tmp_path):
    cfg = demo.config_for("fashion-mnist", robust_mus=(0.5, 2.0))
    specs = {s["name"]: s for s in demo._model_specs(cfg, tmp_path)}
    member = specs["fashion-mnist-cnn-lambda0.01"]
    for mu in ("0.5", "2"):
        s = specs[f"fashion-mnist-cnn-robust{mu}-sigma{cfg.robust_sigma:g}"]
        assert s["grad_reg"] == 0 and s["epochs"] == member["epochs"] and s["requests"] == member["requests"]
        assert s["robust"] == {"mu": float(mu), "sigma": cfg.robust_sigma, "max_points": cfg.robust_max_points, "warmup": cfg.robust_warmup}
        # the checkpoint's name records mu and sigma (the loss's other settings are checked when resuming)
        assert s["checkpoint"].endswith(f"fashion-mnist-cnn-robust{mu}-sigma{cfg.robust_sigma:g}-e1-nall-s0.pt")
    assert cfg.robust_sigma in cfg.sigmas
    assert not any(s.get("robust") for s in demo._model_specs(demo.config_for("fashion-mnist", robust_mus=()), tmp_path))
    quick = demo.config_for("fashion-mnist", quick=True)
    assert quick.robust_mus and quick.robust_sigma in quick.sigmas
    assert sum(bool(s.get("robust")) for s in demo._model_specs(quick, tmp_path)) == 1


def test_the_robust_loss_ramps_up_over_a_fraction_of_the_training_steps(tmp_path, monkeypatch):
    import probust.train

    seen = {}

    class Stop(Exception):
        pass

    def fake_train(train_ds, arch, resume=True, **kwargs):
        seen.update(kwargs, n=len(train_ds))
        raise Stop

    monkeypatch.setattr(probust.train, "train", fake_train)
    cfg = demo.config_for("digits", quick=True, robust_warmup=0.5)
    spec = next(s for s in demo._model_specs(cfg, tmp_path) if s.get("robust"))
    with pytest.raises(Stop):
        demo._job(cfg.to_dict(), spec, 1, False)
    loss = seen["extra_loss"]
    steps = cfg.cnn_epochs * -(-seen["n"] // 128)
    assert loss.mu == cfg.robust_mus[0] and loss.noise.sigma == cfg.robust_sigma and loss.max_points == cfg.robust_max_points
    assert loss.warmup_steps == round(0.5 * steps) and seen["grad_reg"] == 0


@pytest.mark.parametrize(
    "overrides, message",
    [({"robust_sigma": 0.3}, "robust_sigma"), ({"robust_mus": (0.0,)}, "robust_mus"), ({"robust_warmup": 1.5}, "robust_warmup")],
)
def test_bad_robust_settings_are_refused(overrides, message):
    with pytest.raises(demo.DemoConfigError, match=message):
        demo._check(demo.config_for("fashion-mnist", **overrides))


def test_falls_back_to_digits_with_a_message_when_fashion_mnist_is_missing(monkeypatch):
    real = pdata.load

    def load(name, split="test", root=None, download=False):
        if pdata.canonical_name(name) == "fashion-mnist":
            raise pdata.ProbustDataError("fashion-mnist (test split) not found: missing t10k-images\nto get it: apt-get install dataset-fashion-mnist")
        return real(name, split, root, download)

    monkeypatch.setattr(pdata, "load", load)
    said = []
    name, reason = demo._resolve_data(None, said.append)
    assert name == "digits" and "not on this machine" in reason
    assert any("falling back to scikit-learn's 8x8 digits" in line for line in said)
    assert any("apt-get install dataset-fashion-mnist" in line for line in said)
    # an explicitly requested data set that is missing is an error, not a silent fallback
    with pytest.raises(pdata.ProbustDataError):
        demo._resolve_data("fashion-mnist", said.append)


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

    runtime = pd.DataFrame({"mode": ["batched"] * 2, "method": ["taylor", "softmax"], "n_samples": [0, 0],
                            "speedup_vs_mc": [40.0, 900.0], "speedup_reference": ["mc n=1,000"] * 2})  # fmt: skip
    ran = Output(name="runtime", title="runtime", description="", tables={"runtime": runtime})
    demo.print_summary(_summary(tmp_path, [skipped("estimation_error"), ran]))
    printed = capsys.readouterr().out
    assert "Mean |p_hat - p_mc|" not in printed
    assert "Speed-up over mc n=1,000 (batched, this machine): p^taylor 40x, p^softmax 900x" in printed
    assert "Experiments not run: estimation_error" in printed and f"Report: {tmp_path / 'report.html'}" in printed
    demo.print_summary(_summary(tmp_path, [skipped("estimation_error"), skipped("runtime")]))
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


def test_cli_rejects_bad_options(tmp_path, capsys):
    assert main(["demo", "--points", "1", "--out", str(tmp_path)]) == 2
    assert "--points" in capsys.readouterr().err
    assert main(["demo", "--data", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown data set" in capsys.readouterr().err
    assert main(["demo", "--jobs", "0", "--out", str(tmp_path)]) == 2


@pytest.mark.slow
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
    text = report.read_text(encoding="utf-8")
    assert "Not run:" not in text
    first = pd.read_csv(out / "experiments" / "estimation_error" / "estimation_error.csv")
    # a second run reuses the checkpoints and the results, and gives the same numbers
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert "trained" not in again and "reused" in again
    pd.testing.assert_frame_equal(first, pd.read_csv(out / "experiments" / "estimation_error" / "estimation_error.csv"))


@pytest.mark.slow
def test_demo_numbers_do_not_depend_on_the_number_of_worker_processes(tmp_path):
    one = demo.run_demo(tmp_path / "one", data="digits", quick=True, jobs=1, verbose=False)
    two = demo.run_demo(tmp_path / "two", data="digits", quick=True, jobs=2, verbose=False)
    for a, b in zip(one.models, two.models):
        ta = pd.read_parquet(a["results"] + "/results.parquet").drop(columns="seconds")
        tb = pd.read_parquet(b["results"] + "/results.parquet").drop(columns="seconds")
        pd.testing.assert_frame_equal(ta, tb)
    for name in ("estimation_error", "class_bias", "case_study"):
        pd.testing.assert_frame_equal(one.report.output(name).table, two.report.output(name).table)
