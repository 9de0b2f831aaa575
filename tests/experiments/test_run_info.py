"""The Run record: metadata from the typed configuration and the checkpoint, rows in the shapes the experiments use."""

from __future__ import annotations

import numpy as np
import pytest

from probust.experiments.run_info import Run
from probust.experiments.runs import load_results
from probust.run import read_config, read_results

RECIPE = {"dataset": "fashion-mnist", "arch": "cnn", "epochs": 1, "seed": 0, "grad_reg": 0.0, "test_accuracy": 0.9}


def one(folder) -> Run:
    return Run(path=folder, config=read_config(folder), table=read_results(folder))


def test_robust_loss_settings_come_from_extra_loss_config(tmp_path, write_run):
    config = {"name": "RobustLoss", "mu": 2.0, "sigma": 0.5, "cdf": "mv-sigmoid", "max_points": 16}
    # the repr says otherwise: the dict wins
    meta = {**RECIPE, "extra_loss": "RobustLoss(sigma=9.0, mu=9)", "extra_loss_config": config}
    run = one(write_run(tmp_path, "robust", meta=meta))
    assert run.robust_loss_config == config and run.robust_loss_config is not run.meta["extra_loss_config"]
    assert (run.robust_loss, run.robust_sigma) == (2.0, 0.5) and not run.is_standard
    assert run.default_label() == "Fashion-MNIST CNN, robust μ=2 (σ=0.5)"
    # noise that is not one scalar sigma: no robust_sigma
    meta = {**RECIPE, "extra_loss": "RobustLoss(...)", "extra_loss_config": {**config, "sigma": None}}
    run = one(write_run(tmp_path, "anisotropic", meta=meta))
    assert run.robust_sigma is None and run.default_label() == "Fashion-MNIST CNN, robust μ=2"


def test_a_checkpoint_without_extra_loss_config_has_no_robust_loss(tmp_path, write_run):
    # the repr alone is a name, not settings: the experiments read extra_loss_config only
    text = "RobustLoss(sigma=0.3, mu=1, cdf='mv-sigmoid')"
    run = one(write_run(tmp_path, "repr-only", meta={**RECIPE, "extra_loss": text}))
    assert run.robust_loss is None and run.robust_loss_config is None and run.extra_loss == text
    other = one(write_run(tmp_path, "other", meta={**RECIPE, "extra_loss": "my_penalty"}))
    assert other.robust_loss is None and other.extra_loss == "my_penalty" and not other.is_standard
    assert other.default_label() == "Fashion-MNIST CNN, my_penalty"


def test_metadata_falls_back_from_the_checkpoint_to_the_run(tmp_path, write_run):
    folder = write_run(
        tmp_path,
        "module",
        meta={},
        run={"dataset": "digits", "seed": 7},
        model={"source": "nn.Module", "class": "mypkg.nets.TinyNet"},
        data={"classes": ["zero", "one"]},
        rows=[(0, 0.1, "mc", 10, 0.5), (4, 0.1, "mc", 10, 0.5)],
        labels=[0, 0, 0, 0, 3],
    )
    run = one(folder)
    assert (run.dataset, run.arch, run.seed, run.model_source) == ("digits", "TinyNet", 7, None)
    assert run.grad_reg is None and run.test_accuracy is None and run.is_standard
    # names recorded for the classes, then numbers up to the largest label
    assert run.classes == ["zero", "one", "2", "3"]
    assert run.results_config.dataset == "digits" and run.name == "module"
    checkpoint = one(
        write_run(tmp_path, "file", meta={**RECIPE, "classes": ["t-shirt"]}, model={"source": "/m/cnn.pt"})
    )
    assert (checkpoint.dataset, checkpoint.arch, checkpoint.model_source) == ("fashion-mnist", "cnn", "/m/cnn.pt")
    assert checkpoint.classes == ["t-shirt", "1"] and checkpoint.test_accuracy == 0.9
    bare = one(write_run(tmp_path, "bare", run={"dataset": None}))
    assert (bare.dataset, bare.arch) == ("?", "?")


def test_rows_at_the_principal_sample_count_and_the_wide_table(tmp_path, write_run):
    rows = [(i, s, "mc", 100, 0.5 + i / 10) for i in range(3) for s in (0.1, 0.2)]
    rows += [(i, 0.1, "mc", 1000, 0.4) for i in range(3)]  # a convergence study on fewer rows
    rows += [(i, s, "softmax", 0, 0.7) for i in range(3) for s in (0.1,)]
    rows += [(i, 0.2, "mmse", n, 0.6) for i in range(4) for n in (5, 10)]  # a tie: the larger count
    run = one(write_run(tmp_path, "grid", rows=rows))
    assert run.methods == ["mc", "mmse", "softmax"] and run.sigmas == [0.1, 0.2] and run.has("mmse")
    assert run.sample_counts("mc") == [100, 1000] and run.principal_n("mc") == 100
    assert run.principal_n("mmse") == 10 and run.principal_n("taylor") is None
    assert len(run.rows("mc")) == 6 and len(run.rows("mc", 1000)) == 3
    assert run.core_indices.tolist() == [0, 1, 2]  # index 3 is scored at sigma 0.2 only
    wide = run.wide()
    assert len(wide) == 3 * 2 + 1 and {"p_mc", "p_mmse", "p_softmax", "softmax", "mc_n"} <= set(wide)
    np.testing.assert_array_equal(wide.set_index(["index", "sigma"]).loc[(1, 0.2), "p_mc"], 0.6)
    # softmax does not depend on sigma: every sigma of a point gets its value, else the clean_softmax column
    assert (wide[wide["index"] < 3]["softmax"] == 0.7).all() and wide[wide["index"] == 3]["softmax"].item() == 0.9
    assert len(run.wide(core=True)) == 6


def test_load_results_builds_runs_whose_config_is_the_folders(tmp_path, write_run):
    folder = write_run(tmp_path, "a", meta=RECIPE)
    (run,) = load_results(tmp_path)
    assert run.config == read_config(folder) and run.results_config.model_meta == RECIPE
    with pytest.raises(ValueError, match="seed"):
        _ = Run(path=folder, config={"format": "probust.results", "run": {"seed": "x"}}, table=run.table).seed
