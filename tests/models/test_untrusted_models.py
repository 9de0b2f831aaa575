"""Model files a user did not write run no code when loaded, whatever they are called.

Every hostile file here is built by the test from a clean ``torch.export.save`` archive, by
rewriting its zip entries (tests/_crafted.py): a pickle whose unpickling creates a marker file
stands for the attacker's code, and each test asserts that the marker was never created.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path

import pytest
import torch

from probust import models as pm
from tests._crafted import (
    Marker,
    export_model,
    json_change,
    pickled_weight_archive,
    rewrite_archive,
    save_clean_archive,
    torch_pickle,
)
from tests._helpers import save_tiny_vit


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return save_clean_archive(tmp_path_factory.mktemp("export") / "clean.pt2")


def _pickled_sample_inputs(clean: Path, out: Path, marker: Path) -> Path:
    def change(inner: str, data: bytes) -> bytes:
        return torch_pickle(((Marker(marker),), {})) if inner == "data/sample_inputs/model.pt" else data

    return rewrite_archive(clean, out, change)


def _opaque_constant(clean: Path, out: Path, marker: Path) -> Path:
    """A constant stored as an "opaque object" (as torch writes one), which torch reads with pickle.loads."""
    payload = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    change = json_change("data/constants/model_constants_config.json", lambda c: c["config"].update(c0=payload))
    return rewrite_archive(clean, out, change, add={"data/constants/opaque_obj_0": pickle.dumps(Marker(marker))})


def _legacy_weights(clean: Path, out: Path, marker: Path) -> Path:
    """The weights as one legacy ``data/weights/model.pt``, which torch unpickles when
    weights_only refuses it."""
    return rewrite_archive(clean, out, add={"data/weights/model.pt": torch_pickle({"w": Marker(marker)})})


PICKLED = {
    "a weight marked use_pickle": pickled_weight_archive,
    "pickled sample inputs": _pickled_sample_inputs,
    "an opaque-object constant": _opaque_constant,
    "a legacy weights file": _legacy_weights,
}


@pytest.mark.parametrize("make", PICKLED.values(), ids=PICKLED.keys())
def test_an_export_archive_holding_a_pickle_is_refused_and_runs_nothing(clean, tmp_path, make):
    marker = tmp_path / "ran"
    path = make(clean, tmp_path / "evil.pt2", marker)

    with pytest.raises(pm.CheckpointError) as caught:
        pm.load_model(path, expect_num_classes=3, expect_input_shape=(1, 4, 4))

    assert not marker.exists()
    message = str(caught.value)
    assert message.startswith(f"{path}: holds pickled Python objects")
    assert "loading it runs code from the file; pass allow_pickle=True if you trust it" in message
    assert "probust.models.save_checkpoint or torch.export" in message


def test_an_export_archive_renamed_like_a_checkpoint_is_refused_the_same(clean, tmp_path):
    marker = tmp_path / "ran"
    path = pickled_weight_archive(clean, tmp_path / "checkpoint.pt", marker)

    with pytest.raises(pm.CheckpointError) as caught:
        pm.load_model(path)

    assert not marker.exists()
    assert re.match(rf"{re.escape(str(path))}: holds pickled Python objects .*allow_pickle=True", str(caught.value))


def test_allow_pickle_is_what_lets_an_archive_unpickle(clean, tmp_path):
    marker = tmp_path / "ran"
    path = pickled_weight_archive(clean, tmp_path / "trusted.pt2", marker)

    with pytest.raises(pm.CheckpointError):  # the pickle is not a tensor: torch fails after it ran
        pm.load_model(path, allow_pickle=True)
    assert marker.exists()


def test_an_export_archive_whose_shape_expression_is_python_code_is_refused(clean, tmp_path):
    marker = tmp_path / "ran"
    original = "Symbol('s31', positive=True, integer=True)"
    hostile = f"{original} + 0*len(str(open({str(marker)!r}, 'w')))"

    def change(inner: str, data: bytes) -> bytes:
        if inner != "models/model.json":
            return data
        text = data.decode()
        assert json.dumps(original) in text  # the clean archive's shape, as torch 2.14 writes it
        return text.replace(json.dumps(original), json.dumps(hostile)).encode()

    path = rewrite_archive(clean, tmp_path / "evil.pt2", change)

    with pytest.raises(pm.CheckpointError) as caught:
        pm.load_model(path)

    assert not marker.exists()
    assert re.search(r"holds Python code as a symbolic shape .*allow_pickle=True", str(caught.value))


def test_an_export_archive_whose_guards_are_python_code_runs_none_of_them(clean, tmp_path):
    marker = tmp_path / "ran"
    guard = f"open({str(marker)!r}, 'w') is not None"
    path = rewrite_archive(
        clean, tmp_path / "guards.pt2", json_change("models/model.json", lambda m: m.update(guards_code=[guard]))
    )

    loaded, _ = pm.load_model(path, expect_num_classes=3, expect_input_shape=(1, 4, 4))
    x = torch.rand(5, 1, 4, 4)

    assert torch.allclose(loaded(x), export_model()(x), atol=1e-6)
    assert not marker.exists()


def test_an_export_archive_with_native_code_is_refused(clean, tmp_path):
    path = rewrite_archive(clean, tmp_path / "aoti.pt2", add={"data/aotinductor/model/model.so": b"\x7fELF"})

    with pytest.raises(pm.CheckpointError, match=r"holds compiled native code .*model\.so.*allow_pickle=True"):
        pm.load_model(path)


def test_an_export_archive_with_two_entries_of_one_name_is_refused(clean, tmp_path):
    path = tmp_path / "twice.pt2"
    with zipfile.ZipFile(clean) as source, zipfile.ZipFile(path, "w") as target:
        for entry in source.infolist():
            target.writestr(entry.filename, source.read(entry))
        with pytest.warns(UserWarning, match="Duplicate name"):
            target.writestr(entry.filename, source.read(entry))

    with pytest.raises(pm.CheckpointError, match="two zip entries named"):
        pm.load_model(path)


def test_a_clean_export_archive_loads_without_allow_pickle_under_any_name(clean, tmp_path):
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes(clean.read_bytes())
    x = torch.rand(3, 1, 4, 4)

    for path in (clean, renamed):
        loaded, meta = pm.load_model(path, expect_num_classes=3, expect_input_shape=(1, 4, 4))
        assert meta["format"] == "torch.export"
        assert torch.allclose(loaded(x), export_model()(x), atol=1e-6)


def test_a_state_dict_file_with_pickled_objects_loads_only_when_allowed(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "weights.pt"
    torch.save({"0.weight": Marker(marker)}, path)

    with pytest.raises(pm.CheckpointError, match=r"weights\.pt: holds pickled Python objects.*allow_pickle=True"):
        pm.load_weights(export_model(), path)
    assert not marker.exists()
    with pytest.raises(pm.CheckpointError, match="expected a state_dict"):  # unpickled, then not tensors
        pm.load_weights(export_model(), path, allow_pickle=True)
    assert marker.exists()


def test_read_checkpoint_refuses_pickled_objects_without_offering_to_run_them(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "ckpt.pt"
    torch.save({"format": "probust.checkpoint", "meta": Marker(marker)}, path)

    with pytest.raises(pm.CheckpointError, match="holds pickled Python objects") as caught:
        pm.read_checkpoint(path)
    assert "allow_pickle" not in str(caught.value)
    assert not marker.exists()


def test_a_hugging_face_folder_with_pickled_weights_is_refused_and_runs_nothing(tmp_path):
    folder = tmp_path / "hf"
    save_tiny_vit(folder)
    marker = tmp_path / "ran"
    (folder / "model.safetensors").unlink()
    torch.save({"vit.embeddings.cls_token": Marker(marker)}, folder / "pytorch_model.bin")

    with pytest.raises(pm.CheckpointError) as caught:
        pm.load_hf_classifier(folder, warn=False)

    assert not marker.exists()
    assert str(caught.value).startswith(f"{folder}: holds weights saved with pickled Python objects")
    assert "save_pretrained (safetensors)" in str(caught.value)


def test_a_hugging_face_folder_naming_its_own_code_never_imports_it(tmp_path):
    folder = tmp_path / "hf"
    save_tiny_vit(folder)
    marker = tmp_path / "ran"
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForImageClassification": "evil.Model", "AutoConfig": "evil.Config"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w')\n")

    try:
        pm.load_hf_classifier(folder, warn=False)
    except pm.CheckpointError:
        pass  # refusing the folder is as good as ignoring its code

    assert not marker.exists()
