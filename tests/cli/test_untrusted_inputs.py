"""The command line with files and values a user did not make: hostile model files, links in the
results folder, damaged results, bad data and bad parameters. Each gives its exit status and a
one-line message that names the file or flag and what to do; nothing outside the results folder
changes and no code from a file runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from probust.cli import main
from tests._crafted import Marker, pickled_weight_archive, save_clean_archive


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """d.npz (8 points of 1 x 4 x 4, 3 classes) and model.pt2 (a clean torch.export archive)."""
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.random((8, 1, 4, 4)).astype("float32"), y=np.arange(8) % 3)
    save_clean_archive(root / "model.pt2")
    return root


def _estimate(root: Path, out: Path, *extra: str, model: str = "model.pt2") -> list[str]:
    return [
        "estimate",
        "--data",
        str(root / "d.npz"),
        "--model",
        str(root / model) if not Path(model).is_absolute() else model,
        "--sigma",
        "0.3",
        "--methods",
        "softmax",
        "--unit-size",
        "4",
        "--device",
        "cpu",
        "--quiet",
        "--out",
        str(out),
        *extra,
    ]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    return err


def test_a_clean_export_archive_runs_without_allow_pickle(root, tmp_path):
    assert main(_estimate(root, tmp_path / "r")) == 0
    assert (tmp_path / "r" / "results.parquet").is_file()


def test_estimate_refuses_an_export_archive_with_a_pickled_weight_and_runs_none_of_it(root, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = pickled_weight_archive(root / "model.pt2", tmp_path / "evil.pt2", marker)

    status = main(_estimate(root, tmp_path / "r", model=str(evil)))

    assert not marker.exists()
    assert status == 2
    err = _error(capsys)
    assert f"--model: {evil}: holds pickled Python objects" in err and "pass --allow-pickle if you trust it" in err


def test_certify_refuses_the_same_archive_renamed_checkpoint_pt(root, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = pickled_weight_archive(root / "model.pt2", tmp_path / "checkpoint.pt", marker)
    args = ["certify", "--data", str(root / "d.npz"), "--model", str(evil), "--sigma", "0.25", "--N0", "16"]
    args += ["--N", "64", "--device", "cpu", "--quiet", "--out", str(tmp_path / "c")]

    status = main(args)

    assert not marker.exists()
    assert status == 2
    assert f"{evil}: holds pickled Python objects" in _error(capsys)


def test_a_pickled_module_file_runs_nothing_without_allow_pickle(root, tmp_path, capsys):
    marker = tmp_path / "ran"
    torch.save({"model": Marker(marker)}, tmp_path / "m.pt")

    assert main(_estimate(root, tmp_path / "r", model=str(tmp_path / "m.pt"))) == 2
    assert not marker.exists() and "--allow-pickle" in _error(capsys)


def test_overwrite_into_a_folder_whose_parts_link_elsewhere_deletes_nothing_there(root, tmp_path, capsys):
    out, other = tmp_path / "results", tmp_path / "other"
    other.mkdir()
    for name in ("keep1.parquet", "keep2.parquet"):
        (other / name).write_bytes(b"someone else's rows")
    out.mkdir()
    (out / "parts").symlink_to(other)

    status = main(_estimate(root, out, "--overwrite"))

    assert status == 2
    assert sorted(p.name for p in other.iterdir()) == ["keep1.parquet", "keep2.parquet"]
    assert f"--out: {out / 'parts'} (its parts folder) is a symbolic link to {other}" in _error(capsys)


def test_a_lock_that_links_elsewhere_is_refused_and_its_target_kept(root, tmp_path, capsys):
    out, victim = tmp_path / "results", tmp_path / "notes.txt"
    victim.write_text("keep me\n")
    out.mkdir()
    (out / ".lock").symlink_to(victim)

    assert main(_estimate(root, out)) == 2
    assert victim.read_text() == "keep me\n"
    assert f"{out / '.lock'} (its lock) is a symbolic link" in _error(capsys)


def test_a_damaged_part_is_refused_by_estimate_and_report_with_its_name(root, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(_estimate(root, out, "--no-merge")) == 0
    part = sorted((out / "parts").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:100])
    capsys.readouterr()

    assert main(_estimate(root, out, "--no-merge")) == 1
    assert f"results file {part} is damaged" in _error(capsys)
    assert main(["report", str(out), "--quiet"]) == 1
    err = _error(capsys)
    assert err.startswith("probust report: error: results file") and "move it out of the folder" in err
    assert part.is_file()  # kept for the user to look at


BAD_PARAMETERS = {
    "sigma 0": (["--sigma", "0"], 2, "--sigma"),
    "negative sigma": (["--sigma", "-0.1"], 2, "--sigma"),
    "infinite sigma": (["--sigma", "inf"], 2, "--sigma"),
    "no samples": (["--methods", "mc", "--mc-samples", "0"], 2, "--mc-samples"),
    "unknown method": (["--methods", "bogus"], 2, "--methods"),
    "a 1-byte memory budget": (["--methods", "taylor", "--memory-budget", "1"], 1, "--memory-budget"),
}


@pytest.mark.parametrize("extra, status, flag", BAD_PARAMETERS.values(), ids=BAD_PARAMETERS.keys())
def test_a_bad_parameter_is_refused_naming_its_flag(root, tmp_path, capsys, extra, status, flag):
    code = main([*_estimate(root, tmp_path / "r"), *extra])

    assert code == status
    assert flag in _error(capsys)


def test_a_huge_sigma_is_a_valid_noise_level(root, tmp_path):
    assert main([*_estimate(root, tmp_path / "r"), "--sigma", "1e6", "--methods", "mc", "--mc-samples", "20"]) == 0


BAD_DATA = {
    "NaN pixels": (lambda x: x.__setitem__((0, 0, 0, 0), math.nan), "NaN or infinite values"),
    "infinite pixels": (lambda x: x.__setitem__((1, 0, 0, 0), math.inf), "NaN or infinite values"),
}


@pytest.mark.parametrize("spoil, words", BAD_DATA.values(), ids=BAD_DATA.keys())
def test_bad_data_is_refused_naming_the_file(root, tmp_path, capsys, spoil, words):
    x = np.random.default_rng(0).random((8, 1, 4, 4)).astype("float32")
    spoil(x)
    data = tmp_path / "bad.npz"
    np.savez(data, x=x, y=np.arange(8) % 3)
    args = _estimate(root, tmp_path / "r")
    args[args.index("--data") + 1] = str(data)

    assert main(args) == 2
    err = _error(capsys)
    assert f"{data}:" in err and words in err


def test_pickled_data_runs_nothing_and_is_refused_naming_the_file(root, tmp_path, capsys):
    marker = tmp_path / "ran"
    data = tmp_path / "d.pt"
    torch.save({"x": torch.rand(8, 1, 4, 4), "y": torch.arange(8) % 3, "extra": Marker(marker)}, data)
    args = _estimate(root, tmp_path / "r")
    args[args.index("--data") + 1] = str(data)

    assert main(args) == 2
    assert not marker.exists()
    assert f"{data}: holds pickled Python objects" in _error(capsys)
