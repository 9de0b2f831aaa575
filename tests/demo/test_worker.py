"""probust.demo.worker: the work of one model (training settings handed to probust.training)."""

from __future__ import annotations

import pytest

from probust import demo
from probust.demo import worker


def test_the_robust_loss_ramps_up_over_a_fraction_of_the_training_steps(tmp_path, monkeypatch):
    import probust.training

    seen = {}

    class Stop(Exception):
        pass

    def fake_train(train_ds, arch, resume=True, **kwargs):
        seen.update(kwargs, n=len(train_ds))
        raise Stop

    monkeypatch.setattr(probust.training, "train", fake_train)
    cfg = demo.config_for("digits", quick=True, robust_warmup=0.5)
    spec = next(s for s in demo.model_specs(cfg, tmp_path) if s.robust)
    with pytest.raises(Stop):
        worker.run_model(cfg, spec, 1, None)
    loss = seen["extra_loss"]
    steps = cfg.cnn_epochs * -(-seen["n"] // 128)
    assert (
        loss.mu == cfg.robust_mus[0]
        and loss.noise.sigma == cfg.robust_sigma
        and loss.max_points == cfg.robust_max_points
    )
    assert loss.warmup_steps == round(0.5 * steps) and seen["grad_reg"] == 0


def test_a_results_folder_another_probust_version_wrote_is_recomputed_not_extended(tmp_path):
    """The runner refuses to extend a folder another version wrote into; the demo must then
    recompute the folder (overwrite) rather than fail on its next run."""
    import json

    import probust
    from probust.demo.worker import _written_by_this_version
    from probust.run import FORMAT, FORMAT_VERSION

    assert _written_by_this_version(tmp_path / "new")  # nothing scored yet: nothing to recompute
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "probust_version": probust.__version__,
        "history": [{"probust_version": probust.__version__}],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _written_by_this_version(tmp_path)
    config["history"].append({"probust_version": "0.0.1"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert not _written_by_this_version(tmp_path)
