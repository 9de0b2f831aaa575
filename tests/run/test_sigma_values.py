"""A sigma is stored, resumed and read back as the float it was given, not a rounded one.

Every other run and CLI test uses sigmas of at most two decimals (0.1, 0.3), which survive a table
that rounds them: here 1/3 and 0.0123456789 (rounded to two decimals: 0.33 and 0.01) go through
run_estimate, a resume, probust.score, ``probust estimate --sigma`` and ``probust certify``, and
each row's numbers are those of its exact sigma.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

import probust
from probust.run import RunSettings, execute, prepare, run_estimate
from probust.run.reading import read_results
from tests._helpers import tiny_data, tiny_model

SIGMAS = [1 / 3, 0.0123456789]
SMALL = dict(methods=["taylor_mvs", "softmax"], limit=6, unit_size=3, device="cpu", show_progress=False)


def assert_rows_at_exact_sigmas(df) -> None:
    """Each row's sigma is one of SIGMAS bit for bit, and its taylor_mvs p is the estimator's at it."""
    assert sorted(set(df.sigma)) == sorted(SIGMAS)
    assert not df.duplicated(["index", "sigma", "method", "n_samples"]).any()
    x, _ = tiny_data().tensors()
    for sigma in SIGMAS:
        rows = df[(df.method == "taylor_mvs") & (df.sigma == sigma)].sort_values("index")
        assert len(rows) == 6
        direct = probust.Taylor(tiny_model(), sigma, cdf="mv-sigmoid")(x[torch.as_tensor(rows["index"].to_numpy())])
        # float32 passes of other sizes round differently (test_estimate: at most 4.5e-8); a sigma
        # off by a rounding to two decimals moves p by far more (z scales as 1 / sigma).
        np.testing.assert_allclose(rows.p, direct.p.numpy(), rtol=0, atol=1e-7)


def test_a_sigma_of_many_decimals_is_stored_and_resumed_exactly(tmp_path):
    args = dict(data=tiny_data(), model=tiny_model(), sigmas=SIGMAS, **SMALL)
    out = tmp_path / "r"
    full = run_estimate(out=out, merge=False, **args)
    assert_rows_at_exact_sigmas(full)
    parts = sorted((out / "parts").glob("*.parquet"))
    for p in parts[::2]:  # as if the run had died before these units
        p.unlink()
    lost = len(full) - len(read_results(out))
    assert lost > 0
    # The resume finds the rows kept at their exact sigma and computes only the lost ones.
    summary = execute(prepare(RunSettings(out=out, **args)))
    assert summary.rows_computed == lost
    resumed = read_results(out)
    assert resumed.drop(columns="seconds").equals(full.drop(columns="seconds"))
    assert execute(prepare(RunSettings(out=out, **args))).rows_computed == 0


def test_score_keeps_a_sigma_of_many_decimals():
    df = probust.score(tiny_model(), tiny_data(), SIGMAS, **SMALL)
    assert_rows_at_exact_sigmas(df)


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_the_command_line_keeps_a_sigma_of_many_decimals(tmp_path):
    from probust.cli import main

    x, y = tiny_data().tensors()
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    torch.jit.save(torch.jit.trace(tiny_model().eval(), x[:2]), tmp_path / "m.pt")
    sigmas = [repr(s) for s in SIGMAS]  # '0.3333333333333333': the shortest text of the float
    command = ["estimate", "--data", str(tmp_path / "d.npz"), "--model", str(tmp_path / "m.pt"), "--quiet"]
    flags = ["--sigma", *sigmas, "--methods", "taylor_mvs", "softmax", "--limit", "6", "--device", "cpu"]
    assert main([*command, *flags, "--out", str(tmp_path / "r")]) == 0
    assert_rows_at_exact_sigmas(read_results(tmp_path / "r"))


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")
def test_certify_keeps_a_sigma_of_many_decimals(tmp_path):
    # probust certify writes its own table (one row per point and sigma) and one TSV per sigma.
    from probust.cli import main
    from probust.run.certify import read_certified, tsv_name

    x, y = tiny_data().tensors()
    np.savez(tmp_path / "d.npz", x=x.numpy() / 255, y=y.numpy())
    torch.jit.save(torch.jit.trace(tiny_model().eval(), x[:2].float()), tmp_path / "m.pt")
    command = ["certify", "--data", str(tmp_path / "d.npz"), "--model", str(tmp_path / "m.pt"), "--quiet"]
    flags = ["--sigma", *[repr(s) for s in SIGMAS], "--N0", "16", "--N", "64", "--limit", "4", "--device", "cpu"]
    assert main([*command, *flags, "--estimate", "taylor", "--out", str(tmp_path / "c")]) == 0
    table = read_certified(tmp_path / "c")
    assert sorted(set(table.sigma)) == sorted(SIGMAS) and len(table) == 4 * len(SIGMAS)
    for sigma in SIGMAS:
        assert (tmp_path / "c" / tsv_name(sigma)).is_file()
    # The estimate's radius is sigma Phi^-1(p) at the row's own sigma.
    finite = np.isfinite(table.radius_estimate)
    assert finite.sum() >= 4
    expected = table.sigma * norm.ppf(table.p_estimate)
    np.testing.assert_allclose(table.radius_estimate[finite], expected[finite], rtol=1e-9)
