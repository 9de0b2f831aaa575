"""A noise file (noise_std, noise_cov as .npy) is read as numbers and never unpickled."""

from __future__ import annotations

import numpy as np
import pytest

from probust.run import ConfigError, RunSettings, prepare


def test_a_noise_file_holding_pickled_objects_is_refused_naming_its_setting(tmp_path, tiny_data, tiny_model):
    path = tmp_path / "std.npy"
    np.save(path, np.array([{"a": 1}] * 16, dtype=object).reshape(1, 4, 4))
    settings = RunSettings(
        data=tiny_data, model=tiny_model, sigmas=[0.3], methods=["mc"], noise_std=path, out=tmp_path / "r",
        device="cpu", show_progress=False,
    )  # fmt: skip

    with pytest.raises(ConfigError) as caught:
        prepare(settings)

    assert caught.value.field == "noise_std"
    assert f"{path}: holds pickled Python objects (an object array)" in str(caught.value)
    assert "numpy.save of a float array" in str(caught.value)
