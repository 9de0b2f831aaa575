"""``probust certify``: the TSV in Cohen et al.'s format, abstentions, the table equal to
``probust.certify`` on the same points, and independent of batching and resumption."""

from __future__ import annotations

import datetime
import re
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import probust
from probust.cli import main
from probust.run import ConfigError
from probust.run.certify import (
    TSV_COLUMNS,
    CertifySettings,
    certified_column,
    prepare_certify,
    read_certified,
    tsv_name,
)
from probust.run.store import ResultStore

FACTORY = """
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
"""

N_POINTS = 12
SIGMAS = ["0.25", "1.0"]
RADII = ["0", "0.1", "0.3"]


def _x_y() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((N_POINTS, 1, 4, 4)).astype("float32"), np.arange(N_POINTS) % 3


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("certify")
    x, y = _x_y()
    np.savez(root / "d.npz", x=x, y=y)
    (root / "certnet.py").write_text(FACTORY)
    return root


@pytest.fixture()
def in_root(root, monkeypatch):
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    sys.modules.pop("certnet", None)
    return root


def _args(out: str, *extra: str) -> list[str]:
    return [
        "certify",
        "--data",
        "d.npz",
        "--model",
        "certnet:make",
        "--untrained",
        "--sigma",
        *SIGMAS,
        "--N0",
        "16",
        "--N",
        "256",
        "--radii",
        *RADII,
        "--estimate",
        "taylor",
        "--unit-size",
        "4",
        "--device",
        "cpu",
        "--quiet",
        "--out",
        out,
        *extra,
    ]


def _table(path) -> pd.DataFrame:
    return read_certified(path).drop(columns="seconds")


@pytest.fixture()
def reference(in_root) -> pd.DataFrame:
    if not (in_root / "ref" / "results.parquet").is_file():
        assert main(_args("ref")) == 0
    return _table(in_root / "ref")


def test_read_results_refuses_a_certify_folder_and_names_its_reader(in_root, reference):
    with pytest.raises(ValueError, match="'probust.certify' results, not probust estimate's.*read_certified"):
        probust.run.read_results(in_root / "ref")
    pd.testing.assert_frame_equal(probust.run.read_certified(in_root / "ref"), read_certified(in_root / "ref"))


def test_the_tsv_has_the_authors_columns_and_format(in_root, reference):
    rows = read_certified(in_root / "ref")
    for sigma in (0.25, 1.0):
        path = in_root / "ref" / tsv_name(sigma)
        assert path.name == f"certify_sigma{sigma!r}.tsv"
        lines = path.read_text().splitlines()
        assert lines[0] == "idx\tlabel\tpredict\tradius\tcorrect\ttime"
        tsv = pd.read_csv(path, sep="\t")
        assert tuple(tsv.columns) == TSV_COLUMNS and len(tsv) == N_POINTS
        mine = rows[rows.sigma == sigma].sort_values("index")
        assert tsv.idx.tolist() == mine["index"].tolist() == list(range(N_POINTS))
        assert tsv.label.tolist() == mine.label.tolist()
        assert tsv.predict.tolist() == mine.prediction.tolist()
        assert tsv.radius.tolist() == mine.radius.tolist()  # every digit written
        assert tsv.correct.tolist() == mine.correct.astype(int).tolist()
        # time as the authors write it: str(datetime.timedelta(seconds=elapsed))
        assert tsv.time.tolist() == [str(datetime.timedelta(seconds=s)) for s in mine.seconds]
        assert all(re.fullmatch(r"\d+:\d\d:\d\d(\.\d{6})?", t) for t in tsv.time)


def test_abstaining_points_read_minus_one_radius_zero_and_incorrect(in_root, reference):
    abstained = reference[reference.prediction == -1]
    assert len(abstained) > 0, "the test needs some abstentions (sigma 1.0 on a random model gives them)"
    assert (abstained.radius == 0).all() and (~abstained.correct).all()
    assert (abstained.p_lower < 0.5).all()
    kept = reference[reference.prediction != -1]
    # with --radii the analytic-prior test (the default) reports the largest radius it certified,
    # which is 0 for a point certified at radius 0 only (p_lower = Phi(0) = 1/2)
    assert (kept.radius >= 0).all() and (kept.p_lower >= 0.5).all()
    assert (kept.correct == (kept.prediction == kept.label)).all()
    tsv = pd.read_csv(in_root / "ref" / tsv_name(1.0), sep="\t")
    assert ((tsv.predict == -1) <= ((tsv.radius == 0) & (tsv.correct == 0))).all()


def test_the_cli_table_equals_probust_certify_on_the_same_points(in_root, reference):
    import certnet

    x, y = _x_y()
    model = certnet.make()
    for sigma in (0.25, 1.0):
        mine = reference[reference.sigma == sigma].sort_values("index")
        r = probust.certify(model, torch.from_numpy(x), sigma, n0=16, n=256, radii=[0, 0.1, 0.3], seed=0)
        assert mine.prediction.tolist() == r.prediction.tolist()
        np.testing.assert_array_equal(mine.radius.to_numpy(), r.radius.numpy())
        np.testing.assert_array_equal(mine.p_lower.to_numpy(), r.p_lower.numpy())
        assert mine.n_drawn.tolist() == r.n_drawn.tolist() and mine.hits.tolist() == r.hits.tolist()
        assert mine.correct.tolist() == r.correct(torch.from_numpy(y)).tolist()
        for j, radius in enumerate((0.0, 0.1, 0.3)):
            assert mine[certified_column(radius)].tolist() == r.certified[:, j].tolist()
        # The estimate column is labelled as such: Taylor's p and sigma * Phi^-1(p), no guarantee.
        est = probust.Taylor(model, sigma)(torch.from_numpy(x))
        np.testing.assert_allclose(mine.p_estimate.to_numpy(), est.p.double().numpy(), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(
            mine.radius_estimate.to_numpy(), probust.radius_estimate(est, sigma).numpy(), rtol=1e-5, atol=1e-9
        )


def test_the_mmse_estimate_averages_the_copies_asked_for_and_records_them(in_root):
    import json

    import certnet

    args = _args("mmse", "--estimate", "mmse", "--estimate-copies", "3", "--N", "32")  # the last flag wins
    at = args.index("--radii")
    del args[at : at + 1 + len(RADII)]  # fixed-n CERTIFY
    assert main(args) == 0
    x, _ = _x_y()
    mine = read_certified(in_root / "mmse")
    assert json.loads((in_root / "mmse" / "config.json").read_text())["run"]["estimate_copies"] == 3
    for sigma in (0.25, 1.0):
        rows = mine[mine.sigma == sigma].sort_values("index")
        est = probust.MMSE(certnet.make(), sigma, n_samples=3, seed=0)(torch.from_numpy(x))
        np.testing.assert_allclose(rows.p_estimate.to_numpy(), est.p.double().numpy(), rtol=1e-6, atol=1e-9)


def test_the_table_does_not_depend_on_the_batch_size(in_root, reference):
    assert main(_args("b5", "--unit-size", "5")) == 0
    pd.testing.assert_frame_equal(_table(in_root / "b5"), reference)


def _interrupted_after(parts: int):
    """ResultStore.write_part, raising KeyboardInterrupt once ``parts`` parts are written."""
    write_part, written = ResultStore.write_part, []

    def write(self, *args, **kwargs):
        if len(written) == parts:
            raise KeyboardInterrupt
        written.append(1)
        return write_part(self, *args, **kwargs)

    return write


def test_an_interrupted_run_resumes_to_the_uninterrupted_table(in_root, reference, monkeypatch):
    write_part = ResultStore.write_part
    monkeypatch.setattr(ResultStore, "write_part", _interrupted_after(3))
    assert main(_args("resumed")) == 130
    assert len(list((in_root / "resumed" / "parts").glob("*.parquet"))) == 3
    assert not (in_root / "resumed" / tsv_name(0.25)).exists()
    parts = []
    monkeypatch.setattr(
        ResultStore, "write_part", lambda self, name, *a, **k: parts.append(name) or write_part(self, name, *a, **k)
    )
    assert main(_args("resumed")) == 0
    assert len(parts) == 2 * 3 - 3  # only the missing units: 3 blocks of 4 points x 2 sigmas, 3 done
    pd.testing.assert_frame_equal(_table(in_root / "resumed"), reference)
    assert (in_root / "resumed" / tsv_name(1.0)).read_text().splitlines()[1:] != []
    # a finished folder run again computes nothing and leaves its tables untouched
    tables = sorted(p for p in (in_root / "resumed").iterdir() if p.suffix in (".tsv", ".parquet"))
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in tables]
    assert main(_args("resumed")) == 0
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in tables] == before


def test_integer_inputs_are_refused_naming_the_data(in_root, tmp_path):
    class Counts(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return torch.full((1, 4, 4), i, dtype=torch.int64), i % 3

    import certnet

    settings = CertifySettings(data=Counts(), model=certnet.make(), sigmas=[0.25], out=tmp_path / "c", device="cpu")
    with pytest.raises(ConfigError, match="not floating point") as info:
        prepare_certify(settings)
    assert info.value.field == "data"


def test_a_tensor_file_of_integers_is_refused_though_its_points_are_served_as_floats(in_root, tmp_path):
    import certnet

    from probust import data as pdata

    x = np.random.default_rng(0).integers(0, 256, size=(4, 1, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "pixels.npz", x=x, y=np.arange(4) % 3)
    assert pdata.load_file(tmp_path / "pixels.npz").subset([0, 1]).stored_dtype == "uint8"
    settings = CertifySettings(
        data=str(tmp_path / "pixels.npz"), model=certnet.make(), sigmas=[0.25], out=tmp_path / "c", device="cpu"
    )
    with pytest.raises(ConfigError, match=r"the inputs \(.*pixels.npz\) are uint8, not floating point") as info:
        prepare_certify(settings)
    assert info.value.field == "data"
    np.savez(tmp_path / "scaled.npz", x=(x / 255).astype(np.float32), y=np.arange(4) % 3)
    assert prepare_certify(settings.replace(data=str(tmp_path / "scaled.npz"))).store is not None


def test_a_bad_flag_is_one_line_naming_it(in_root, capsys):
    assert main(_args("bad", "--alpha", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probust certify: error: --alpha") and "\n" not in err


def test_estimate_and_certify_folders_refuse_each_other(in_root, reference, capsys):
    assert main(_args("ref", "--N", "128")) == 2
    assert "n: 256 there, 128 here" in capsys.readouterr().err
    estimate = [
        "estimate",
        "--data",
        "d.npz",
        "--model",
        "certnet:make",
        "--untrained",
        "--sigma",
        "0.25",
        "--methods",
        "softmax",
    ]
    assert main([*estimate, "--quiet", "--out", "ref"]) == 2
    assert "probust.certify's" in capsys.readouterr().err
    assert main([*estimate, "--quiet", "--out", "est"]) == 0
    assert main(_args("est")) == 2
    assert "not a probust.certify configuration" in capsys.readouterr().err


def test_the_draw_counts_read_as_the_authors_flags_or_lowercase(in_root):
    """--N0/--N (the authors' certify.py; what torchrun lets through) and --n0/--n (the issue's
    spelling) set the same settings."""
    from probust.cli import build_parser
    from probust.cli.certify import settings_from

    parser = build_parser()
    upper = settings_from(parser.parse_args(_args("x")))
    lower = ["--n0" if a == "--N0" else "--n" if a == "--N" else a for a in _args("x")]
    assert lower != _args("x")
    assert settings_from(parser.parse_args(lower)) == upper
    assert (upper.n0, upper.n) == (16, 256)


def test_progress_is_one_bar_over_every_draw(in_root, capsys):
    args = [a for a in _args("bar", "--N", "32") if a != "--quiet"]
    at = args.index("--radii")
    del args[at : at + 1 + len(RADII)]  # fixed-n CERTIFY: every point draws N0 + N, and one Taylor estimate
    assert main(args) == 0
    err = capsys.readouterr().err
    total = N_POINTS * len(SIGMAS) * (16 + 32 + 1)
    assert f"{total}/{total}" in err and "eval/s" in err
    assert f"/{N_POINTS} " not in err and "pt/s" not in err  # no bar over points, none per sigma
    assert "certify sigma=1: 100%" in err and f"{N_POINTS * len(SIGMAS)} rows" in err


def _config(path) -> dict:
    import json

    return json.loads((path / "config.json").read_text())


def test_the_folder_records_the_procedure_run_and_keeps_it_when_resumed_without_the_flag(in_root, reference):
    # --radii and no --procedure: the analytic-prior test ran, and the folder says so.
    assert _config(in_root / "ref")["run"]["procedure"] == "prior"
    args = _args("fixed-n", "--N", "32")
    at = args.index("--radii")
    del args[at : at + 1 + len(RADII)]
    assert main(args) == 0
    assert _config(in_root / "fixed-n")["run"]["procedure"] == "fixed"
    assert main([*_args("seq"), "--procedure", "sequential"]) == 0
    assert _config(in_root / "seq")["run"]["procedure"] == "sequential"
    # Resumed (run again, finished here) with no --procedure: the prior folder takes it, rows unchanged.
    before = _table(in_root / "ref")
    assert main(_args("ref")) == 0
    pd.testing.assert_frame_equal(_table(in_root / "ref"), before)


def test_resuming_under_another_procedure_is_refused_naming_the_flag_and_the_fix(in_root, reference, capsys):
    assert main([*_args("seq-only"), "--procedure", "sequential"]) == 0
    capsys.readouterr()
    assert main(_args("seq-only")) == 2  # the default with --radii is prior
    err = capsys.readouterr().err
    assert "procedure: sequential there, prior here" in err
    assert "use --procedure sequential to resume it, --overwrite to replace them, or another --out folder" in err
    assert main([*_args("ref"), "--procedure", "fixed"]) == 2
    assert "(procedure: prior there, fixed here); use --procedure prior to resume it" in capsys.readouterr().err
    # Another setting differing too: no resume advice that would not resume it.
    assert main([*_args("ref"), "--procedure", "fixed", "--N", "128"]) == 2
    err = capsys.readouterr().err
    assert "n: 256 there, 128 here" in err and "to resume it" not in err


def test_a_folder_written_before_the_procedure_was_recorded_reads_as_what_it_ran(
    in_root, reference, monkeypatch, capsys
):
    """Before --procedure, --radii ran the sequential test: such a folder (no "procedure" in its
    config) resumes under --procedure sequential only; one that recorded the option's old None
    default ran that default (prior with --radii, fixed without)."""
    from probust.run import certify as run_certify
    from probust.run.certify import implied_run
    from probust.run.settings import recorded

    assert implied_run({"radii": [0.0, 0.1]}) == {
        "radii": [0.0, 0.1],
        "procedure": "sequential",
        "predictive_futility": 0.01,
    }
    assert implied_run({"radii": [0.0], "procedure": "prior", "predictive_futility": 0.0})["predictive_futility"] == 0
    assert implied_run({"radii": None})["procedure"] == "fixed" and implied_run({})["procedure"] == "fixed"
    assert implied_run({"radii": [0.0], "procedure": None})["procedure"] == "prior"
    assert implied_run({"radii": None, "procedure": None})["procedure"] == "fixed"
    assert implied_run({"radii": [0.0], "procedure": "fixed"})["procedure"] == "fixed"

    def interrupted(args: list[str]) -> None:  # the run's first two parts, then an interruption
        with monkeypatch.context() as m:
            m.setattr(ResultStore, "write_part", _interrupted_after(2))
            assert main(args) == 130

    # Written as before the option existed (no "procedure" recorded; --radii ran the sequential test).
    with monkeypatch.context() as m:
        m.setattr(run_certify, "recorded_run", lambda s: {k: v for k, v in recorded(s).items() if k != "procedure"})
        interrupted([*_args("old"), "--procedure", "sequential"])
    assert "procedure" not in _config(in_root / "old")["run"]
    capsys.readouterr()
    assert main(_args("old")) == 2
    err = capsys.readouterr().err
    assert "(procedure: sequential there, prior here); use --procedure sequential to resume it" in err
    assert main([*_args("old"), "--procedure", "sequential"]) == 0
    assert "procedure" not in _config(in_root / "old")["run"]  # the folder's record is left as written
    assert main([*_args("seq-ref"), "--procedure", "sequential"]) == 0
    pd.testing.assert_frame_equal(_table(in_root / "old"), _table(in_root / "seq-ref"))
    # Written while the option recorded its None default: --radii ran the prior test.
    with monkeypatch.context() as m:
        m.setattr(run_certify, "recorded_run", recorded)
        interrupted(_args("null"))
    assert _config(in_root / "null")["run"]["procedure"] is None
    assert main([*_args("null"), "--procedure", "sequential"]) == 2
    assert "(procedure: prior there, sequential here)" in capsys.readouterr().err
    assert main(_args("null")) == 0
    pd.testing.assert_frame_equal(_table(in_root / "null"), reference)


def test_the_predictive_futility_is_the_libraries_recorded_and_checked(in_root, reference, capsys):
    import certnet

    assert _config(in_root / "ref")["run"]["predictive_futility"] == 0.01
    assert main(_args("pf0", "--predictive-futility", "0")) == 0
    assert _config(in_root / "pf0")["run"]["predictive_futility"] == 0.0
    x, _ = _x_y()
    mine = read_certified(in_root / "pf0")
    for sigma in (0.25, 1.0):
        rows = mine[mine.sigma == sigma].sort_values("index")
        r = probust.certify(
            certnet.make(), torch.from_numpy(x), sigma, n0=16, n=256, radii=[0, 0.1, 0.3], predictive_futility=0.0
        )
        assert rows.n_drawn.tolist() == r.n_drawn.tolist() and rows.hits.tolist() == r.hits.tolist()
        np.testing.assert_array_equal(rows.radius.to_numpy(), r.radius.numpy())
    capsys.readouterr()
    assert main(_args("ref", "--predictive-futility", "0")) == 2  # a folder's identity, as --futility
    assert "predictive_futility: 0.01 there, 0.0 here" in capsys.readouterr().err
    assert main(_args("bad", "--predictive-futility", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probust certify: error: --predictive-futility") and "[0, 1)" in err
