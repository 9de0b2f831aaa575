"""Every flag of ``estimate``, ``certify``, ``train`` and ``report`` reaches what it claims.

The flags are read from the declarations (``probust._options``), so a flag added there is tested
here without a new line: each is passed with a value other than its default, and must change
exactly its own field (a swapped or dropped flag fails), be recorded in config.json where its
declaration says so, and reach the estimator argument it names. Behavioural tests follow for the
flags whose effect is cheap to observe.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

import numpy as np
import pytest
import torch

from probust._options import Option, declared
from probust.cli import build_parser, main
from probust.cli.flags import flag_map, flag_of, message
from probust.errors import OptionError, ProbustError, Setting

FACTORY = """
import torch


def make(num_classes=3, hidden=8, scale=1.0):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, num_classes)
    )
    with torch.no_grad():
        net[-1].weight.mul_(scale)
    return net
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny data set (12 points of [1, 4, 4], 5 classes), a factory module, noise files."""
    root = tmp_path_factory.mktemp("flags")
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.random((12, 1, 4, 4)).astype("float32"), y=np.arange(12) % 5)
    np.savez(root / "e.npz", inputs=rng.random((12, 1, 4, 4)).astype("float32"), labels=np.arange(12) % 5)
    (root / "flagnet.py").write_text(FACTORY)
    np.save(root / "std.npy", np.full((1, 4, 4), 0.5))
    np.save(root / "cov.npy", np.eye(16) * 0.5)
    return root


@pytest.fixture()
def in_root(files, monkeypatch):
    monkeypatch.chdir(files)
    monkeypatch.syspath_prepend(str(files))
    sys.modules.pop("flagnet", None)
    return files


def _sub(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command]


def _other_word(field: dataclasses.Field, option: Option, special: dict[str, list[str]]) -> list[str]:
    """Words giving ``field`` a value other than its default."""
    if field.name in special:
        return special[field.name]
    default = field.default
    if option.choices is not None:
        items = option.choices.items() if isinstance(option.choices, dict) else [(str(c), c) for c in option.choices]
        return [next(w for w, v in items if v != default)]
    if isinstance(default, bool) or (default is None and str(field.type) == "bool | None"):
        return []
    kind = str(field.type)
    if "int" in kind and "float" not in kind:
        return ["3"]
    if "float" in kind:
        return ["0.25"]
    raise AssertionError(f"no test value for {field.name} ({kind}): add it to the special values")


ESTIMATE_BASE = ["--data", "d.npz", "--model", "flagnet:make", "--untrained", "--sigma", "0.1", "--out", "r"]
ESTIMATE_SPECIAL = {
    "data": ["e.npz"],
    "model": ["flagnet:other"],
    "model_args": ["num_classes=5"],
    "weights": ["w.pt"],
    "sigmas": ["0.2", "0.05"],
    "methods": ["mc", "softmax"],
    "indices": ["0-3"],
    "mc_samples": ["100", "200"],
    "mmse_samples": ["2", "3"],
    "data_root": ["somewhere"],
    "noise_std": ["std.npy"],
    "noise_cov": ["cov.npy"],
    "memory_budget": ["4GB"],
    "device": ["cpu"],
    "out": ["elsewhere"],
    "x_key": ["inputs"],
    "y_key": ["labels"],
    "label_column": ["target"],
    "feature_columns": ["a", "b"],
    "image_size": ["8"],
}


def _estimate_flags():
    from probust.data import FileOptions
    from probust.run.settings import RunSettings

    return [(f, o) for cls in (RunSettings, FileOptions) for f, o in declared(cls) if not o.hidden]


@pytest.mark.parametrize("field,option", _estimate_flags(), ids=lambda v: getattr(v, "name", ""))
def test_every_estimate_flag_sets_its_own_field_and_no_other(in_root, field, option):
    from probust.cli.estimate import settings_from

    parser = _sub("estimate")
    common = [w for w in ESTIMATE_BASE if w != "--untrained"]  # so that --untrained changes something
    base = settings_from(parser.parse_args(common))
    flag = flag_of(field, option)
    words = _other_word(field, option, ESTIMATE_SPECIAL)
    args = parser.parse_args([*common, flag, *words])
    settings = settings_from(args)
    changed = {f.name for f in dataclasses.fields(settings) if getattr(settings, f.name) != getattr(base, f.name)}
    if field.name in {f.name for f in dataclasses.fields(settings)}:
        assert changed == {field.name}, f"{flag} changed {changed}"
    else:  # a file option: it arrives in data_options under its own name
        assert changed == {"data_options"}
        assert settings.data_options is not None and set(settings.data_options) == {field.name}


def test_every_estimator_option_reaches_its_estimator_argument(in_root):
    """Each declared ``param`` arrives in the estimator of every method that takes it."""
    from probust.estimators import REGISTRY
    from probust.run.methods import make_task_estimator
    from probust.run.prepared import PreparedRun, Task
    from probust.run.settings import RunSettings

    values = {
        "seed": 7,
        "temperature": 2.5,
        "tol": 3e-3,
        "confidence": 0.9,
        "interval": "clopper-pearson",
        "sampling": "iid",
        "p_fail": True,
        "target_half_width": 0.05,
        "prune": "off",
        "gradients": "direct",
        "check_draws": 12,
        "batch_size": 17,
        "memory_budget": "1GB",
        "jacobian": "loop",
        "channels_last": False,
    }
    params = {f.name: o.param for f, o in declared(RunSettings) if o.param is not None}
    assert set(params) == set(values), "give every estimator option a test value"
    assert all(name == param for name, param in params.items()), "the run names each option as the estimators do"
    settings = RunSettings(data="d.npz", model="flagnet:make", untrained=True, sigmas=[0.1], **values)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    plan = PreparedRun(None, None, model, torch.device("cpu"), np.arange(2), [], {}, None, settings)  # type: ignore[arg-type]
    reached = set()
    for method, spec in REGISTRY.items():
        est = make_task_estimator(plan, Task(0.1, method, 100 if spec.samples == "mc" else 2 if spec.samples else 0))
        for name, param in params.items():
            # How the work runs arrives as the estimator's Execution.
            holder = est.execution if hasattr(est.execution, param) else est
            if hasattr(holder, param) and (param in spec.run_options or param not in _run_options()):
                got = getattr(holder, param)
                assert got == values[name], (method, param, got)
                reached.add(name)
    assert reached == set(values)


def _run_options():
    from probust.estimators.registry import RUN_OPTIONS

    return RUN_OPTIONS


def test_recorded_flags_arrive_in_config_json(in_root):
    """One tiny run with every recorded option away from its default: config.json's "run" holds each."""
    from probust.run.settings import RunSettings

    args = [
        *ESTIMATE_BASE[:-1],
        "rec",
        "--methods",
        "mc",
        "softmax",
        "--mc-samples",
        "200",
        "--limit",
        "2",
        "--device",
        "cpu",
        "--quiet",
        "--model-arg",
        "num_classes=5",
        "--seed",
        "3",
        "--target",
        "label",
        "--temperature",
        "2",
        "--tol",
        "0.001",
        "--confidence",
        "0.9",
        "--interval",
        "clopper-pearson",
        "--sampling",
        "iid",
        "--p-fail",
        "--target-half-width",
        "0.2",
        "--prune",
        "off",
        "--gradients",
        "direct",
        "--check-draws",
        "0",
        "--noise",
        "uniform",
        "--mean",
        "0.5",
        "--std",
        "0.25",
    ]
    assert main(["estimate", *args]) == 0
    run = json.loads((in_root / "rec" / "config.json").read_text())["run"]
    expected = {
        "model_args": {"num_classes": 5},
        "seed": 3,
        "target": "label",
        "temperature": 2.0,
        "tol": 0.001,
        "confidence": 0.9,
        "interval": "clopper-pearson",
        "sampling": "iid",
        "p_fail": True,
        "target_half_width": 0.2,
        "prune": "off",
        "gradients": "direct",
        "check_draws": 0,
        "noise": {"kind": "uniform"},
        "mean": [0.5],
        "std": [0.25],
    }
    records = {o.record for _, o in declared(RunSettings) if o.record is not None}
    assert records == set(expected), "a recorded option without a test value"
    assert {k: run[k] for k in expected} == expected


CERTIFY_BASE = ["--data", "d.npz", "--model", "flagnet:make", "--untrained", "--sigma", "0.1", "--out", "r"]
CERTIFY_SPECIAL = {
    **ESTIMATE_SPECIAL,
    "radii": ["0", "0.5"],
    "alpha": ["0.01"],
    "futility": ["0.01"],
}


def _certify_flags():
    from probust.data import FileOptions
    from probust.run.certify import CertifySettings

    return [(f, o) for cls in (CertifySettings, FileOptions) for f, o in declared(cls) if not o.hidden]


@pytest.mark.parametrize("field,option", _certify_flags(), ids=lambda v: getattr(v, "name", ""))
def test_every_certify_flag_sets_its_own_field_and_no_other(in_root, field, option):
    from probust.cli.certify import settings_from

    parser = _sub("certify")
    common = [w for w in CERTIFY_BASE if w != "--untrained"]  # so that --untrained changes something
    base = settings_from(parser.parse_args(common))
    flag = flag_of(field, option)
    words = _other_word(field, option, CERTIFY_SPECIAL)
    settings = settings_from(parser.parse_args([*common, flag, *words]))
    changed = {f.name for f in dataclasses.fields(settings) if getattr(settings, f.name) != getattr(base, f.name)}
    if field.name in {f.name for f in dataclasses.fields(settings)}:
        assert changed == {field.name}, f"{flag} changed {changed}"
    else:  # a file option: it arrives in data_options under its own name
        assert changed == {"data_options"}
        assert settings.data_options is not None and set(settings.data_options) == {field.name}


def test_certify_has_no_flag_of_estimate_alone():
    """Noise kinds, methods, sample counts and the analytic estimators' knobs are estimate's only."""
    parser = _sub("certify")
    options = {s for a in parser._actions for s in a.option_strings}
    for flag in ("--methods", "--mc-samples", "--noise", "--noise-std", "--target", "--tol", "--jacobian", "--p-fail"):
        assert flag not in options


def test_recorded_certify_flags_arrive_in_config_json(in_root):
    """One tiny certification with every recorded option away from its default: config.json holds each."""
    from probust.run.certify import CertifySettings

    args = [
        *CERTIFY_BASE[:-1],
        "crec",
        "--limit",
        "2",
        "--device",
        "cpu",
        "--quiet",
        "--model-arg",
        "num_classes=5",
        "--seed",
        "3",
        "--N0",
        "8",
        "--N",
        "64",
        "--alpha",
        "0.01",
        "--radii",
        "0.5",
        "0",
        "--futility",
        "0.01",
        "--predictive-futility",
        "0.05",
        "--procedure",
        "sequential",
        "--estimate",
        "mmse",
        "--estimate-copies",
        "2",
        "--mean",
        "0.5",
        "--std",
        "0.25",
    ]
    assert main(["certify", *args]) == 0
    config = json.loads((in_root / "crec" / "config.json").read_text())
    expected = {
        "model_args": {"num_classes": 5},
        "seed": 3,
        "n0": 8,
        "n": 64,
        "alpha": 0.01,
        "radii": [0.0, 0.5],
        "futility": 0.01,
        "predictive_futility": 0.05,
        "procedure": "sequential",
        "estimate": "mmse",
        "estimate_copies": 2,
        "mean": [0.5],
        "std": [0.25],
    }
    records = {o.record for _, o in declared(CertifySettings) if o.record is not None}
    assert records == set(expected), "a recorded option without a test value"
    assert config["format"] == "probust.certify"
    assert {k: config["run"][k] for k in expected} == expected


TRAIN_BASE = ["--data", "digits", "--arch", "linear", "--out", "m.pt", "--robust-sigma", "0.1"]


def _train_flags():
    from probust.training import RobustLossOptions, TrainConfig, TrainOptions, TrainRun

    return [(f, o) for cls in (TrainConfig, RobustLossOptions, TrainOptions, TrainRun) for f, o in declared(cls)]


@pytest.mark.parametrize("field,option", _train_flags(), ids=lambda v: getattr(v, "name", ""))
def test_every_train_flag_sets_its_own_field_and_no_other(field, option):
    from probust.cli.train import _settings

    parser = _sub("train")
    base_args = [*TRAIN_BASE[:3], "vit", *TRAIN_BASE[4:]] if field.name == "pretrained" else TRAIN_BASE
    if field.name == "test_data":  # a test split is for the user's own data (not read here)
        base_args = [TRAIN_BASE[0], "train.npz", *TRAIN_BASE[2:]]
    base = _settings(parser.parse_args(base_args))
    special = {
        "arch_kwargs": ['{"bias": false}'],
        "device": ["cpu"],
        "schedule": ["step"],
        "root": ["somewhere"],
        "pretrained": ["hf-tiny"],
        "data": ["fashion-mnist"],
        "test_data": ["test.npz"],
        "arch": ["cnn"],
        "out": ["elsewhere.pt"],
    }
    flag = flag_of(field, option)
    words = _other_word(field, option, special)
    got = _settings(parser.parse_args([*base_args, flag, *words]))
    changed = {
        f.name for old, new in zip(base, got, strict=True) for f in dataclasses.fields(new)
        if getattr(new, f.name) != getattr(old, f.name)
    }  # fmt: skip
    assert changed == {field.name}, f"{flag} changed {changed}"
    if field.name == "augment":
        assert _settings(parser.parse_args([*TRAIN_BASE, "--no-augment"]))[0].augment is False


def test_train_options_reach_train(monkeypatch):
    """The robust-loss, data and checkpoint flags arrive in train()'s arguments and its RobustLoss."""
    import probust.training

    seen = {}

    def fake_train(**kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(probust.training, "train", fake_train)
    with pytest.raises(SystemExit):
        main(["train", *TRAIN_BASE, "--robust-loss", "0.5", "--robust-sigma", "0.2", "--robust-cdf", "mvn",
              "--robust-warmup", "7", "--root", "somewhere", "--download", "--no-resume", "--quiet"])  # fmt: skip
    assert (seen["root"], seen["download"], seen["resume"]) == ("somewhere", True, False)
    loss = seen["extra_loss"]
    assert (loss.mu, loss.noise.sigma, loss.cdf, loss.warmup_steps) == (0.5, 0.2, "mvn", 7)


def test_train_option_errors_name_their_flags(capsys):
    assert main(["train", *TRAIN_BASE[:6], "--robust-loss", "1"]) == 2
    assert "--robust-loss: needs --robust-sigma S" in capsys.readouterr().err
    assert main(["train", *TRAIN_BASE, "--robust-warmup", "-1"]) == 2
    assert "--robust-warmup: must be an integer >= 0" in capsys.readouterr().err
    assert main(["train", *TRAIN_BASE, "--pretrained", "x"]) == 2
    assert "--pretrained: applies to --arch vit only" in capsys.readouterr().err
    from probust.training import RobustLossOptions

    with pytest.raises(OptionError, match="^robust_loss: needs robust_sigma=S") as error:
        RobustLossOptions(robust_loss=1.0)
    assert error.value.field == "robust_loss"


def _report_flags():
    from probust.report import ReportSettings

    return declared(ReportSettings)


@pytest.mark.parametrize("field,option", _report_flags(), ids=lambda v: getattr(v, "name", ""))
def test_every_report_flag_sets_its_own_field_and_no_other(field, option):
    from probust.cli.flags import values
    from probust.report import ReportSettings

    parser = _sub("report")
    base = ReportSettings(**values(parser.parse_args(["r"]), ReportSettings))
    special = {"only": ["runtime", "class_bias"], "skip": ["runtime", "case_study"], "title": ["mine"]}
    words = _other_word(field, option, special)
    settings = ReportSettings(**values(parser.parse_args(["r", flag_of(field, option), *words]), ReportSettings))
    changed = {f.name for f in dataclasses.fields(settings) if getattr(settings, f.name) != getattr(base, f.name)}
    assert changed == {field.name}


# --- errors name flags through their field ----------------------------------------------------


def test_errors_are_shown_with_the_flags_of_their_fields():
    from probust.cli.estimate import flags

    f = flags()
    assert message(OptionError("must be a positive number, got -1", field="tol"), f) == (
        "--tol: must be a positive number, got -1"
    )
    assert message(OptionError("must be in (0, 1), got 2.0", field="confidence"), f).startswith("--confidence: ")
    assert message(OptionError("bad", field="show_progress"), f).startswith("--quiet: ")
    assert message(OptionError("does not apply", field="x_key"), f).startswith("--x-key: ")
    assert message(OptionError("unknown file option", field="data_options"), f).startswith("--data: ")
    tied = ProbustError(
        "measure the true class with ",
        Setting("target", "label"),
        " (and ",
        Setting("overwrite", True),
        " or another ",
        Setting("out"),
        " folder)",
        field="target",
    )
    assert str(tied) == "target: measure the true class with target='label' (and overwrite=True or another out folder)"
    assert (
        message(tied, f)
        == "--target: measure the true class with --target label (and --overwrite or another --out folder)"
    )
    # every declared name has a flag the parser knows
    known = {s for a in _sub("estimate")._actions for s in a.option_strings}
    assert set(f.values()) <= known


def test_the_error_family():
    from probust.data import DataFormatError, ProbustDataError
    from probust.demo.settings import DemoConfigError
    from probust.execution.budget import MemoryBudgetError
    from probust.models import CheckpointError
    from probust.run import ConfigError, ConfigMismatchError, TiedPredictionError
    from probust.run.store import FolderLockedError, ResultsWriteError

    for cls, builtin in [
        (ProbustDataError, FileNotFoundError),
        (DataFormatError, FileNotFoundError),
        (ConfigError, ValueError),
        (ConfigMismatchError, ValueError),
        (TiedPredictionError, ValueError),
        (FolderLockedError, RuntimeError),
        (ResultsWriteError, OSError),
        (MemoryBudgetError, ValueError),
        (CheckpointError, ValueError),
        (DemoConfigError, ValueError),
    ]:
        assert issubclass(cls, ProbustError) and issubclass(cls, builtin), cls
    assert MemoryBudgetError("memory_budget of 1 KB is too small").field == "memory_budget"
    assert str(MemoryBudgetError("memory_budget of 1 KB is too small")) == "memory_budget of 1 KB is too small"


def test_a_bad_flag_value_names_the_flag(in_root, capsys):
    assert main(["estimate", *ESTIMATE_BASE, "--tol", "-1"]) == 2
    assert "--tol: must be a positive number" in capsys.readouterr().err
    assert main(["estimate", *ESTIMATE_BASE, "--limit", "x"]) == 2
    assert "--limit: expected an integer, got 'x'" in capsys.readouterr().err
    assert main(["estimate", *ESTIMATE_BASE, "--model-arg", "3"]) == 2
    assert "--model-arg: expected KEY=VALUE" in capsys.readouterr().err


# --- behaviour -----------------------------------------------------------------------------------


def _estimate(root, out, *extra):
    code = main(["estimate", *ESTIMATE_BASE[:-1], out, "--device", "cpu", "--quiet", "--limit", "4", *extra])
    assert code == 0
    from probust.run.reading import read_results

    return read_results(root / out)


def test_model_args_build_the_model_and_are_part_of_the_folder_identity(in_root, capsys):
    df = _estimate(in_root, "ma", "--methods", "softmax", "--model-arg", "num_classes=5", "--model-arg", "hidden=4")
    assert len(df) == 4
    config = json.loads((in_root / "ma" / "config.json").read_text())
    assert config["run"]["model_args"] == {"num_classes": 5, "hidden": 4}
    assert config["model"]["args"] == {"num_classes": 5, "hidden": 4}
    # other arguments make another run: refused in the same folder, naming what differs
    assert main(["estimate", *ESTIMATE_BASE[:-1], "ma", "--device", "cpu", "--quiet", "--limit", "4",
                 "--methods", "softmax", "--model-arg", "num_classes=5", "--model-arg", "hidden=4",
                 "--model-arg", "scale=2.0"]) == 2  # fmt: skip
    assert "model_args" in capsys.readouterr().err
    # without them the 3-class default does not fit the 5-class data: named
    assert main(["estimate", *ESTIMATE_BASE[:-1], "mb", "--device", "cpu", "--quiet", "--methods", "softmax"]) == 2
    assert "--model" in capsys.readouterr().err


def test_model_args_with_torchvision_resnet18(tmp_path, monkeypatch):
    """The issue's case: torchvision.models:resnet18 with num_classes=3 and a weights file."""
    pytest.importorskip("torchvision")
    from torchvision.models import resnet18

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savez("img.npz", x=rng.random((2, 3, 32, 32)).astype("float32"), y=np.array([0, 2]))
    torch.manual_seed(0)
    torch.save(resnet18(num_classes=3).state_dict(), "w.pt")
    code = main(["estimate", "--data", "img.npz", "--model", "torchvision.models:resnet18", "--untrained", "--model-arg",
                 "num_classes=3", "--weights", "w.pt", "--sigma", "0.1", "--methods", "softmax", "--out", "r",
                 "--device", "cpu", "--quiet"])  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["run"]["model_args"] == {"num_classes": 3}


def test_temperature_flattens_softmax(in_root):
    cold = _estimate(in_root, "t1", "--methods", "softmax", "--model-arg", "num_classes=5")
    hot = _estimate(in_root, "t2", "--methods", "softmax", "--model-arg", "num_classes=5", "--temperature", "1000")
    assert (hot["p"].to_numpy() < cold["p"].to_numpy()).all()
    assert np.allclose(hot["p"], 0.2, atol=1e-2)


def test_confidence_and_interval_change_the_mc_interval(in_root):
    common = ["--methods", "mc", "--mc-samples", "400", "--model-arg", "num_classes=5"]
    base = _estimate(in_root, "c1", *common)
    narrow = _estimate(in_root, "c2", *common, "--confidence", "0.5")
    cp = _estimate(in_root, "c3", *common, "--interval", "clopper-pearson")
    width = (base["ci_high"] - base["ci_low"]).to_numpy()
    assert ((narrow["ci_high"] - narrow["ci_low"]).to_numpy() < width).all()
    assert np.array_equal(cp["p"], base["p"]) and not np.allclose(cp["ci_low"], base["ci_low"])


def test_target_half_width_stops_early(in_root):
    common = ["--methods", "mc", "--mc-samples", "20000", "--model-arg", "num_classes=5"]
    full = _estimate(in_root, "h1", *common)
    early = _estimate(in_root, "h2", *common, "--target-half-width", "0.05")
    assert (early["n_drawn"] < 20000).all()
    assert full["n_drawn"].isna().all() or (full["n_drawn"] == 20000).all()
    assert ((early["ci_high"] - early["ci_low"]) / 2 <= 0.05 + 1e-12).all()


def test_tol_bounds_cdf_error_and_prune_off_keeps_every_boundary(in_root):
    common = ["--methods", "taylor", "--model-arg", "num_classes=5", "--sigma", "0.5"]
    loose = _estimate(in_root, "p1", *common, "--tol", "0.01", "--prune", "off")
    assert (loose["cdf_error"] <= 0.01).all()
    assert (loose["boundaries_kept"] == 4).all()
    tight = _estimate(in_root, "p2", *common, "--tol", "1e-5", "--prune", "spectral")
    assert (tight["cdf_error"] <= 1e-5 + 1e-12).all()
    assert (tight["boundaries_kept"] <= 4).all()
    assert np.allclose(tight["p"], loose["p"], atol=0.02)


def test_jacobian_routes_agree(in_root):
    common = ["--methods", "taylor", "--model-arg", "num_classes=5", "--sigma", "0.5", "--prune", "off"]
    loop = _estimate(in_root, "j1", *common, "--jacobian", "loop")
    vmap = _estimate(in_root, "j2", *common, "--jacobian", "vmap")
    assert np.allclose(loop["p"], vmap["p"], atol=1e-6)


def test_memory_budget_too_small_is_named(in_root, capsys):
    code = main(["estimate", *ESTIMATE_BASE[:-1], "mbud", "--device", "cpu", "--quiet", "--limit", "2",
                 "--methods", "taylor", "--model-arg", "num_classes=5", "--memory-budget", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "--memory-budget of " in err and "raise --memory-budget" in err
    assert "memory_budget" not in err  # the flag, not the Python name


def test_an_option_only_the_estimator_can_check_is_named_by_its_flag(in_root, capsys):
    """Rows per pass that do not fit the budget are found inside the estimator, which names its
    own argument (batch_size), which is the run's option of the same name; the CLI shows the flag."""
    from probust.run import run_estimate

    common = ["--device", "cpu", "--quiet", "--limit", "2", "--methods", "mc", "--mc-samples", "1000",
              "--model-arg", "num_classes=5", "--batch-size", "100000", "--memory-budget", "200KB"]  # fmt: skip
    assert main(["estimate", *ESTIMATE_BASE[:-1], "ebs", *common]) == 1
    err = capsys.readouterr().err
    assert "--batch-size 100000 rows per pass need more than --memory-budget" in err
    assert "lower --batch-size or raise --memory-budget" in err
    with pytest.raises(OptionError) as error:
        run_estimate(
            data="d.npz", model="flagnet:make", untrained=True, model_args={"num_classes": 5}, sigmas=[0.1], methods=["mc"],
            mc_samples=[1000], limit=2, device="cpu", show_progress=False, out="ebs2",
            batch_size=100_000, memory_budget="200KB",
        )  # fmt: skip
    assert error.value.field == "memory_budget"
    assert "batch_size=100000 rows per pass" in str(error.value) and "lower batch_size" in str(error.value)


def test_train_lr_and_schedule_reach_the_optimizer(tmp_path):
    out = tmp_path / "m.pt"
    code = main(["train", "--data", "digits", "--arch", "linear", "--epochs", "2", "--lr", "0.02", "--schedule",
                 "constant", "--out", str(out), "--device", "cpu", "--quiet", "--threads", "1"])  # fmt: skip
    if code != 0:
        pytest.skip("the digits data set is not available here")
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert [h["lr"] for h in meta["history"]] == [0.02, 0.02]
    assert math.isclose(meta["lr"], 0.02) and meta["schedule"] == "constant"


def test_report_skip_leaves_experiments_out(tmp_path, monkeypatch):
    """--skip arrives in build_report (the report itself is tested in tests/test_report.py)."""
    import probust.report as report

    seen = {}

    def fake_build_report(results, out, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(report, "build_report", fake_build_report)
    monkeypatch.setattr("probust.experiments.load_results", lambda path: [])
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path), "--skip", "runtime", "case_study", "--quiet", "--case-k", "3"])
    assert seen["skip"] == ("runtime", "case_study")
    assert seen["options"]["case_study"]["k"] == 3


def test_flag_map_covers_every_run_setting():
    from probust.run.settings import RunSettings

    assert set(flag_map(RunSettings)) == {f.name for f in dataclasses.fields(RunSettings)}
