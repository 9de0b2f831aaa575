"""``probust estimate`` end to end: output, one-line errors (exit 2), kills and resumption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from probust import models
from probust.cli import main
from probust.run.reading import read_config, read_results

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Checkpoints for scikit-learn's digits (8x8, 10 classes), which are always on the machine."""
    folder = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    paths = {}
    for name, arch, classes, shape in [
        ("linear", "linear", 10, (1, 8, 8)),
        ("cnn", "cnn", 10, (1, 8, 8)),
        ("three", "linear", 3, (1, 8, 8)),
        ("mnist", "linear", 10, (1, 28, 28)),
    ]:
        paths[name] = models.save_checkpoint(
            folder / f"{name}.pt", models.build(arch, classes, shape), {"dataset": "digits"}
        )
    return paths


def estimate(*args: str) -> int:
    return main(["estimate", *args])


def base(model: Path, out: Path, *extra: str) -> list[str]:
    return ["--data", "digits", "--model", str(model), "--out", str(out), "--quiet", *extra]


def test_the_command_writes_the_table(checkpoints, tmp_path, capsys):
    out = tmp_path / "r"
    args = base(
        checkpoints["linear"],
        out,
        "--sigma",
        "0.1",
        "0.2",
        "--methods",
        "mc",
        "softmax",
        "taylor_mvs",
        "--mc-samples",
        "20",
        "50",
        "--indices",
        "0-9",
        "30",
        "--unit-size",
        "4",
        "--device",
        "cpu",
    )
    assert estimate(*args) == 0
    assert capsys.readouterr().err == ""  # --quiet
    df = read_results(out)
    assert len(df) == 11 * 2 * 4 and sorted(set(df["index"]))[-1] == 30
    assert (out / "results.parquet").is_file()
    assert read_config(out)["run"]["dataset"] == "digits"


def test_progress_and_summary_go_to_stderr(checkpoints, tmp_path, capsys):
    args = [
        "--data",
        "digits",
        "--model",
        str(checkpoints["linear"]),
        "--out",
        str(tmp_path / "r"),
        "--sigma",
        "0.1",
        "--methods",
        "mc",
        "--mc-samples",
        "10",
        "--limit",
        "8",
        "--no-merge",
    ]
    assert estimate(*args) == 0
    err = capsys.readouterr().err
    assert "sigma=0.1 mc n=10" in err and "eval/s" in err and "80/80" in err and "8 rows" in err
    assert list((tmp_path / "r" / "parts").glob("*.parquet"))


def test_a_model_trained_on_another_data_set_is_flagged(tmp_path, capsys):
    model = models.save_checkpoint(tmp_path / "m.pt", models.build("linear", 10, (1, 8, 8)), {"dataset": "mnist"})
    args = [
        "--data",
        "digits",
        "--model",
        str(model),
        "--out",
        str(tmp_path / "r"),
        "--sigma",
        "0.1",
        "--methods",
        "softmax",
        "--limit",
        "2",
    ]
    assert estimate(*args) == 0
    assert "warning: the model was trained on mnist, it is scored on digits" in capsys.readouterr().err


def test_exported_and_torchscript_models_are_accepted(checkpoints, tmp_path):
    model, _ = models.load_model(checkpoints["linear"])
    x = torch.zeros(2, 1, 8, 8)
    exported = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},)), exported)
    scripted = tmp_path / "m.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(model, x), scripted)
    tables = []
    for i, path in enumerate([checkpoints["linear"], exported, scripted]):
        args = base(
            path,
            tmp_path / f"r{i}",
            "--sigma",
            "0.2",
            "--methods",
            "mc",
            "softmax",
            "--mc-samples",
            "30",
            "--limit",
            "6",
        )
        assert estimate(*args) == 0
        tables.append(read_results(tmp_path / f"r{i}").drop(columns="seconds"))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])


def _one_line_error(capsys, match: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("probust estimate: error: ")
    assert match in err, err
    return err


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (["--methods", "mc", "montecarlo"], "unknown method 'montecarlo'"),
        (["--sigma", "0"], "--sigma"),
        (["--sigma", "-0.1"], "positive"),
        (["--sigma", "abc"], "'abc' is not a number"),
        (["--mc-samples", "ten"], "--mc-samples"),
        (["--indices", "0-5000"], "out of range"),
        (["--limit", "0"], "--limit"),
        (["--model", "three"], "num_classes is 3, expected 10"),
        (["--model", "mnist"], "input_shape is [1, 28, 28], expected [1, 8, 8]"),
        (["--model", "missing"], "no model file"),
        (
            ["--data", "imagenet"],
            "--data: imagenet: no such file or folder, and not a built-in data set (known data sets",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(checkpoints, tmp_path, capsys, change, match):
    opts = {"--sigma": ["0.1"], "--methods": ["mc"], "--model": ["linear"], "--data": ["digits"]}
    opts.update({change[0]: change[1:]} if change[0] in opts else {})
    extra = change if change[0] not in opts else []
    model = checkpoints.get(opts["--model"][0], tmp_path / "missing.pt")
    args = [
        "--data",
        *opts["--data"],
        "--model",
        str(model),
        "--out",
        str(tmp_path / "r"),
        "--sigma",
        *opts["--sigma"],
        "--methods",
        *opts["--methods"],
        "--mc-samples",
        "10",
        "--limit",
        "4",
        *extra,
    ]
    assert estimate(*args) == 2
    _one_line_error(capsys, match)
    assert not list(tmp_path.glob("r/parts/*.parquet"))


def test_a_normalizer_of_other_channels_is_named_as_from_python_not_as_a_missing_batch_dimension(tmp_path, capsys):
    # Issue 59: a 2-channel normaliser in front of a 3-channel network, on 3-channel points; the
    # command line's batch of 2 points equals the normaliser's channels, and nothing is missing.
    import numpy as np
    from torch import nn

    import probust

    torch.manual_seed(0)
    net = nn.Sequential(
        probust.Normalize([0.5, 0.5], [0.5, 0.5]), nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(256, 3)
    )
    torch.save(net, tmp_path / "m.pt")
    points = np.random.default_rng(0).random((4, 3, 8, 8)).astype("float32")
    np.savez(tmp_path / "d.npz", x=points, y=np.arange(4) % 3)
    args = ["--data", str(tmp_path / "d.npz"), "--model", str(tmp_path / "m.pt"), "--allow-pickle"]
    assert estimate(*args, "--sigma", "0.1", "--methods", "softmax", "--out", str(tmp_path / "r"), "--quiet") == 2
    cause = (
        "the model's first layer expects 2 channels in dimension 1, {} 3 (Normalize '0', inputs [B, 2, H, W]), the 3 "
        "that Conv2d '1' after it takes ("
    )
    err = _one_line_error(capsys, f"--model: {tmp_path / 'm.pt'}: does not accept inputs of shape [3, 8, 8]: ")
    assert cause.format("the points have") + "ValueError: Normalize: statistics for 2 channels" in err
    assert "batch dimension" not in err and "unsqueeze" not in err
    with pytest.raises(ValueError) as python:  # the same diagnosis from Python, where the inputs are x
        probust.Taylor(net, 0.1)(torch.from_numpy(points[:2]))
    assert cause.format("x has") in str(python.value) and "unsqueeze" not in str(python.value)


def test_a_data_set_that_is_not_on_the_machine(checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PROBUST_DATA_DIR", str(tmp_path / "nowhere"))
    args = base(
        checkpoints["linear"], tmp_path / "r", "--sigma", "0.1", "--data", "cifar10", "--data-root", str(tmp_path)
    )
    assert estimate(*args) == 2
    _one_line_error(capsys, "cifar10 (test split) not found")


def test_an_output_folder_that_cannot_be_written(checkpoints, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert estimate(*base(checkpoints["linear"], tmp_path / "file" / "out", "--sigma", "0.1")) == 2
    _one_line_error(capsys, "cannot write to")


def test_a_different_run_into_the_same_folder_is_refused(checkpoints, tmp_path, capsys):
    args = base(checkpoints["linear"], tmp_path / "r", "--sigma", "0.1", "--methods", "softmax", "--limit", "4")
    assert estimate(*args) == 0
    assert estimate(*args, "--seed", "7") == 2
    err = _one_line_error(capsys, "seed: 0 there, 7 here")
    assert err.endswith("use --overwrite to replace them, or another --out folder"), err
    other = base(checkpoints["cnn"], tmp_path / "r", "--sigma", "0.1", "--methods", "softmax", "--limit", "4")
    assert estimate(*other) == 2
    _one_line_error(capsys, "model_sha256")
    assert estimate(*other, "--overwrite") == 0
    assert estimate(*args, "--overwrite", "--extend") == 2
    _one_line_error(capsys, "--overwrite and --extend exclude each other")


def test_a_folder_of_another_probust_version_is_refused_with_the_flags_that_get_out(checkpoints, tmp_path, capsys):
    import json

    out = tmp_path / "r"
    args = base(checkpoints["linear"], out, "--sigma", "0.1", "--methods", "softmax", "--limit", "4", "--device", "cpu")
    assert estimate(*args) == 0
    config = json.loads((out / "config.json").read_text())
    config["probust_version"] = config["history"][0]["probust_version"] = "0.0.1"
    (out / "config.json").write_text(json.dumps(config))
    assert estimate(*args) == 2
    err = _one_line_error(capsys, "holds results written by probust 0.0.1, this is probust")
    assert err.endswith(
        "use --overwrite to replace them, or another --out folder (or --allow-version-change to mix them)"
    )
    assert estimate(*args, "--allow-version-change") == 0
    history = read_config(out)["history"]
    assert history[-1]["allow_version_change"] is True and "allow_version_change" not in history[0]


def test_a_tied_prediction_is_a_usage_error_naming_the_points_and_the_flags(checkpoints, tmp_path, capsys):
    model = models.build("linear", 10, (1, 8, 8))
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.copy_(torch.tensor([1.0, 1.0] + [0.0] * 8))  # classes 0 and 1 tie on every input
    tied = models.save_checkpoint(tmp_path / "tied.pt", model, {"dataset": "digits"})
    args = base(tied, tmp_path / "r", "--sigma", "0.1", "--methods", "softmax", "--indices", "5-7", "--device", "cpu")
    assert estimate(*args) == 2
    err = _one_line_error(capsys, "--target: the clean prediction is tied between two classes at data-set indices")
    assert "[5, 6, 7] (3 points)" in err
    assert err.endswith(
        "with --target label (and --overwrite or another --out folder), or leave these points out with --indices ... "
        "(and --extend)"
    )
    assert not list((tmp_path / "r" / "parts").glob("*.parquet"))
    # the folder now records the run with --target prediction: the way out says what else to give
    assert estimate(*args, "--target", "label") == 2
    _one_line_error(capsys, "target: prediction there, label here")
    assert estimate(*args, "--target", "label", "--overwrite") == 0
    assert (read_results(tmp_path / "r").prediction == 0).all()


def _parser_actions():
    from probust.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["estimate"]._actions


def test_a_damaged_part_file_is_named_with_exit_status_1(checkpoints, tmp_path, capsys):
    args = base(
        checkpoints["linear"],
        tmp_path / "r",
        "--sigma",
        "0.1",
        "--methods",
        "softmax",
        "--limit",
        "8",
        "--unit-size",
        "4",
        "--no-merge",
    )
    assert estimate(*args) == 0
    part = sorted((tmp_path / "r" / "parts").glob("*.parquet"))[0]
    part.write_bytes(b"not parquet")  # only disk trouble does this: parts are renamed into place whole
    assert estimate(*args) == 1
    err = capsys.readouterr().err
    assert part.name in err and "delete it) and run the same command again" in err and err.count("\n") == 1


# -- interruption ---------------------------------------------------------------------------------

# Every kind of row: Monte Carlo, the QMC mvn-cdf methods (taylor, mmse), the control variate
# (mc_cv) and --p-fail. The kill lands once the first mmse part is there, so rows of every kind
# are computed both before and after it. Long enough that the signal lands mid-run even when the
# test process is descheduled on a busy machine: with 3,000 draws the parts after the first mmse
# one take ~3 s on the linear model (with 300 draws a SIGINT once arrived too late: exit 0).
KILL_ARGS = [
    "--sigma",
    "0.1",
    "0.3",
    "--methods",
    "mc",
    "taylor",
    "mmse",
    "mc_cv",
    "softmax",
    "--p-fail",
    "--mc-samples",
    "3000",
    "--limit",
    "40",
    "--unit-size",
    "4",
    "--device",
    "cpu",
    "--seed",
    "3",
]


def _start(checkpoints, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "probust", "estimate", *base(checkpoints["linear"], out, *KILL_ARGS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the child the default disposition back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_parts(proc: subprocess.Popen, out: Path, count: int, pattern: str = "*.parquet") -> None:
    deadline = time.monotonic() + 120
    while len(list((out / "parts").glob(pattern))) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no part files appeared"
        time.sleep(0.005)


def _uninterrupted(checkpoints, tmp_path):
    torch.set_num_threads(1)  # as in the killed subprocess, so float rounding is the same
    try:
        assert estimate(*base(checkpoints["linear"], tmp_path / "reference", *KILL_ARGS)) == 0
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
    return read_results(tmp_path / "reference").drop(columns="seconds")


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["SIGKILL", "SIGINT"]
)
def test_a_killed_run_resumes_to_the_identical_table(checkpoints, tmp_path, sig):
    out = tmp_path / "killed"
    proc = _start(checkpoints, out)
    _wait_for_parts(proc, out, 1, "mmse-*.parquet")
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "run the same command again" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    partial = read_results(out)  # readable as it was left
    total = 40 * 2 * 5
    assert 0 < len(partial) < total, "the run finished before it was killed: make it longer"
    assert {"mc", "taylor", "mmse"} <= set(partial.method)
    assert not (out / "results.parquet").exists()

    assert estimate(*base(checkpoints["linear"], out, *KILL_ARGS)) == 0  # the same command again
    resumed = read_results(out).drop(columns="seconds")
    assert len(resumed) == total
    assert resumed.p_fail.notna().sum() == 40 * 2 * 2 and resumed.cv_beta.notna().sum() == 40 * 2
    assert resumed.equals(_uninterrupted(checkpoints, tmp_path))
    assert [p for p in (out / "parts").iterdir()] == []  # merged; temporaries cleaned


def test_p_fail_option_fills_the_p_fail_column(checkpoints, tmp_path):
    out = tmp_path / "r"
    args = base(
        checkpoints["linear"],
        out,
        "--sigma",
        "0.05",
        "--methods",
        "taylor_mvs",
        "mc",
        "mc_is",
        "--mc-samples",
        "50",
        "--indices",
        "0-3",
        "--device",
        "cpu",
        "--p-fail",
    )
    assert estimate(*args) == 0
    df = read_results(out)
    assert df[df.method != "mc"].p_fail.notna().all() and df[df.method == "mc"].p_fail.isna().all()
    assert read_config(out)["run"]["p_fail"] is True
