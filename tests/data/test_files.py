"""probust.data.load_file: a user's tensor files, tables and image folders, written here in each
format and read back through the function the runner uses; every bad file is refused by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from probust import data as pdata


def write_folder(root, sizes=None, mode="L", classes=("cat", "dog"), per_class=3, seed=0):
    """A folder of PNG images, one subfolder per class; returns {path: uint8 array}."""
    rng = np.random.default_rng(seed)
    written = {}
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            h, w = (sizes or {}).get((c, i), (6, 5))
            shape = (h, w) if mode == "L" else (h, w, 3)
            array = rng.integers(0, 256, size=shape, dtype=np.uint8)
            path = root / c / f"{i}.png"
            Image.fromarray(array, mode=mode).save(path)
            written[path] = array
    return written


def test_an_npz_file_gives_its_inputs_labels_and_class_names(tmp_path):
    x = np.random.default_rng(0).normal(size=(7, 2, 3)).astype(np.float64)
    y = np.array([0, 2, 1, 2, 0, 1, 1])
    np.savez(tmp_path / "d.npz", inputs=x, labels=y, classes=np.array(["a", "b", "c"]))
    ds = pdata.load_file(tmp_path / "d.npz", {"x_key": "inputs", "y_key": "labels"})
    X, Y = ds.tensors()
    assert X.dtype == torch.float32 and torch.equal(X, torch.from_numpy(x.astype(np.float32)))
    assert Y.tolist() == y.tolist() and ds.classes == ["a", "b", "c"] and ds.input_shape == (2, 3)
    assert ds.split == "all" and ds.name == "d.npz" and len(ds) == 7
    assert torch.equal(ds.subset([4, 1]).tensors()[0], X[[4, 1]])


def test_a_pt_file_may_hold_a_dict_or_a_pair_and_an_npy_file_names_its_labels_file(tmp_path):
    x, y = torch.rand(5, 4), torch.tensor([1, 0, 1, 1, 0])
    torch.save({"x": x, "y": y}, tmp_path / "a.pt")
    torch.save((x, y), tmp_path / "b.pt")
    np.save(tmp_path / "inputs.npy", x.numpy())
    np.save(tmp_path / "targets.npy", y.numpy())
    for ds in (
        pdata.load_file(tmp_path / "a.pt"),
        pdata.load_file(tmp_path / "b.pt"),
        pdata.load_file(tmp_path / "inputs.npy", {"y_key": "targets.npy"}),
    ):
        X, Y = ds.tensors()
        assert torch.equal(X, x) and torch.equal(Y, y) and ds.classes == ["0", "1"]


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ({"x": np.zeros((3, 2)), "y": np.array([0, 1.5, 1])}, "must be whole numbers .* point 1 has 1.5"),
        ({"x": np.zeros((3, 2)), "y": np.array([0, -1, 1])}, "out of range: point 1 has label -1"),
        (
            {"x": np.zeros((3, 2)), "y": np.array([0, 3, 1]), "classes": np.array(["a", "b"])},
            "out of range: point 1 has label 3, but the file lists 2 classes",
        ),
        ({"x": np.array([[0.0, np.nan], [1, 2]]), "y": np.array([0, 1])}, "NaN or infinite values in 1 points"),
        ({"x": np.zeros((3, 2)), "y": np.array([0, 1])}, "3 inputs but 2 labels"),
        ({"inputs": np.zeros((3, 2)), "y": np.array([0, 1, 1])}, "has no 'x' .*x_key=NAME"),
        ({"x": np.zeros(3), "y": np.array([0, 1, 1])}, r"must have shape \[N, ...\]"),
    ],
)
def test_a_bad_tensor_file_is_refused_naming_the_file_and_the_problem(tmp_path, contents, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **contents)
    with pytest.raises(pdata.DataFormatError, match=message) as info:
        pdata.load_file(path)
    assert str(path) in str(info.value)


def test_tensors_of_mixed_shapes_are_refused(tmp_path):
    torch.save({"x": [torch.zeros(2, 2), torch.zeros(3, 2)], "y": torch.tensor([0, 1])}, tmp_path / "m.pt")
    with pytest.raises(pdata.DataFormatError, match=r"mixed shapes \(\[2, 2\], \[3, 2\]\)"):
        pdata.load_file(tmp_path / "m.pt")


def test_a_table_gives_its_feature_columns_and_its_label_strings_as_sorted_class_names(tmp_path):
    frame = pd.DataFrame(
        {"b": [1.0, 2.0, 3.0, 4.0], "a": [0, 1, 0, 1], "kind": ["pear", "apple", "pear", "fig"], "z": [9, 9, 9, 9]}
    )
    frame.to_parquet(tmp_path / "t.parquet")
    frame.to_csv(tmp_path / "t.csv", index=False)
    for name in ("t.parquet", "t.csv"):
        ds = pdata.load_file(tmp_path / name, {"label_column": "kind"})
        X, Y = ds.tensors()
        assert ds.classes == ["apple", "fig", "pear"] and Y.tolist() == [2, 0, 2, 1]
        assert torch.equal(X, torch.tensor(frame[["b", "a", "z"]].to_numpy(), dtype=torch.float32))
        assert ds.details["features"] == ["b", "a", "z"] and ds.input_shape == (3,)
        # the MLP standardises with these (a constant column keeps std 1)
        assert ds.mean == pytest.approx([2.5, 0.5, 9.0]) and ds.std == pytest.approx([np.sqrt(1.25), 0.5, 1.0])
    chosen = pdata.load_file(tmp_path / "t.csv", {"label_column": "kind", "feature_columns": ["a", "b"]})
    assert torch.equal(chosen.tensors()[0], torch.tensor(frame[["a", "b"]].to_numpy(), dtype=torch.float32))


@pytest.mark.parametrize(
    ("frame", "options", "message"),
    [
        (
            pd.DataFrame({"f": [1.0, 2.0], "label": [0, 1], "city": ["x", "y"]}),
            {},
            "'city' is not .*feature_columns=NAMES",
        ),
        (pd.DataFrame({"f": [1.0, np.nan], "label": [0, 1]}), {}, "NaN or infinite feature values in 1 rows .*'f'"),
        (pd.DataFrame({"f": [1.0, 2.0], "target": [0, 1]}), {}, "no label column 'label' .*label_column=NAME"),
        (pd.DataFrame({"f": [1.0, 2.0], "label": [0.0, 0.5]}), {}, "whole numbers .* point 1 has 0.5"),
        (pd.DataFrame({"f": [1.0, 2.0], "label": [0, 1]}), {"feature_columns": ["g"]}, "has no column 'g'"),
        (pd.DataFrame({"f": [1.0, 2.0], "label": ["a", None]}), {}, "'label' has 1 missing values"),
    ],
)
def test_a_bad_table_is_refused_naming_the_file_and_the_column(tmp_path, frame, options, message):
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(pdata.DataFormatError, match=message) as info:
        pdata.load_file(path, options)
    assert str(path) in str(info.value)


def test_an_image_folder_is_read_lazily_with_folder_names_as_classes_and_values_in_0_1(tmp_path):
    written = write_folder(tmp_path / "pics")
    ds = pdata.load_file(tmp_path / "pics")
    assert ds.classes == ["cat", "dog"] and ds.input_shape == (1, 6, 5) and len(ds) == 6
    X, Y = ds.tensors()
    expected = torch.stack([torch.from_numpy(a).float()[None] / 255 for a in written.values()])
    assert torch.equal(X, expected) and Y.tolist() == [0, 0, 0, 1, 1, 1]
    assert float(X.min()) >= 0 and float(X.max()) <= 1
    # lazy: a file changed after opening is read as it is now
    path = next(iter(written))
    Image.fromarray(np.zeros((6, 5), np.uint8), mode="L").save(path)
    assert float(ds[0][0].abs().sum()) == 0.0


def test_image_size_and_channels_fix_the_shape(tmp_path):
    write_folder(tmp_path / "pics", sizes={("dog", 1): (9, 7)}, mode="RGB")
    with pytest.raises(pdata.DataFormatError, match="mixed sizes .*image_size=N"):
        pdata.load_file(tmp_path / "pics")
    ds = pdata.load_file(tmp_path / "pics", {"image_size": 4, "channels": 1})
    assert ds.input_shape == (1, 4, 4) and ds.tensors()[0].shape == (6, 1, 4, 4)
    colour = pdata.load_file(tmp_path / "pics", {"image_size": (3, 8)})
    assert colour.input_shape == (3, 3, 8)
    # the resize is PIL's bilinear one, read back as PIL gives it
    with Image.open(tmp_path / "pics" / "dog" / "1.png") as image:
        oracle = np.asarray(image.convert("RGB").resize((8, 3), Image.Resampling.BILINEAR), dtype=np.float32) / 255
    assert np.array_equal(colour[4][0].permute(1, 2, 0).numpy(), oracle)


def test_a_bad_image_folder_is_refused_naming_the_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(pdata.DataFormatError, match="one subfolder per class"):
        pdata.load_file(tmp_path / "empty")
    (tmp_path / "hollow" / "cat").mkdir(parents=True)
    with pytest.raises(pdata.DataFormatError, match="class folder 'cat' holds no images"):
        pdata.load_file(tmp_path / "hollow")
    write_folder(tmp_path / "broken")
    (tmp_path / "broken" / "dog" / "bad.png").write_bytes(b"not a png at all")
    with pytest.raises(pdata.DataFormatError, match="bad.png: not a readable image"):
        pdata.load_file(tmp_path / "broken")


def test_options_that_do_not_apply_to_the_source_are_refused(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 2)), y=np.array([0, 1]))
    with pytest.raises(ValueError, match="label_column: does not apply to a .npz file"):
        pdata.load_file(tmp_path / "d.npz", {"label_column": "y"})
    with pytest.raises(ValueError, match="unknown file option 'colour'"):
        pdata.load_file(tmp_path / "d.npz", {"colour": 3})
    (tmp_path / "d.txt").write_text("1,2")
    with pytest.raises(pdata.DataFormatError, match="unknown kind of data file .txt"):
        pdata.load_file(tmp_path / "d.txt")


def test_built_in_names_are_told_from_paths():
    assert pdata.is_builtin("digits") and pdata.is_builtin("FMNIST")
    assert not pdata.is_builtin("./digits") and not pdata.is_builtin("table.parquet")
