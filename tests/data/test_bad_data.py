"""A user's data that is not usable is refused by name with what is wrong; pickled data runs no
code; an image folder is read through links, each file reached checked like any other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probust.data import DataFormatError, load_file
from tests._crafted import Marker

X = np.random.default_rng(0).random((6, 1, 4, 4)).astype("float32")
Y = np.arange(6) % 3


def _npz(tmp_path, name="d.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **{"x": X, "y": Y, **arrays})
    return path


TENSOR_FILES = {
    "NaN pixels": (dict(x=np.where(np.arange(X.size).reshape(X.shape) == 0, np.nan, X)), "NaN or infinite values"),
    "infinite pixels": (dict(x=np.where(np.arange(X.size).reshape(X.shape) == 17, np.inf, X)), "NaN or infinite"),
    "inputs of one dimension": (dict(x=X.reshape(-1)), "must have shape [N, ...]"),
    "fewer labels than inputs": (dict(y=Y[:5]), "6 inputs but 5 labels"),
    "labels of two dimensions": (dict(y=Y[:, None]), "one label per point"),
    "a negative label": (dict(y=np.array([0, 1, 2, -1, 0, 1])), "point 3 has label -1, expected >= 0"),
    "a label beyond the classes": (
        dict(y=np.array([0, 1, 2, 7, 0, 1]), classes=np.array(["a", "b", "c"])),
        "point 3 has label 7, but the file lists 3 classes",
    ),
    "a fractional label": (dict(y=np.array([0, 1, 2.5, 1, 0, 1])), "must be whole numbers"),
    "no points": (dict(x=X[:0], y=Y[:0]), "holds no points"),
}


@pytest.mark.parametrize("arrays, words", TENSOR_FILES.values(), ids=TENSOR_FILES.keys())
def test_a_tensor_file_that_is_not_usable_is_refused_naming_it(tmp_path, arrays, words):
    path = _npz(tmp_path, **arrays)

    with pytest.raises(DataFormatError) as caught:
        load_file(path)
    assert str(caught.value).startswith(f"{path}:") and words in str(caught.value)


def test_an_object_array_is_refused_without_unpickling(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}] * 6, dtype=object))
    np.save(tmp_path / "y.npy", Y)

    with pytest.raises(
        DataFormatError, match=r"x\.npy: holds pickled Python objects \(an object array\).*numpy\.savez"
    ):
        load_file(tmp_path / "x.npy")


def test_a_pt_file_with_pickled_objects_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": torch.from_numpy(X), "y": torch.from_numpy(Y), "extra": Marker(marker)}, tmp_path / "d.pt")

    with pytest.raises(DataFormatError, match=r"d\.pt: holds pickled Python objects.*does not load such files"):
        load_file(tmp_path / "d.pt")
    assert not marker.exists()


@pytest.fixture
def images(tmp_path):
    """An image folder: classes a and b, one 4 x 4 grey image each."""
    Image = pytest.importorskip("PIL.Image")
    root = tmp_path / "images"
    for i, name in enumerate("ab"):
        (root / name).mkdir(parents=True)
        Image.fromarray((X[i, 0] * 255).astype("uint8")).save(root / name / "1.png")
    return root


def test_an_empty_folder_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="needs one subfolder per class"):
        load_file(tmp_path / "empty")


def test_a_class_folder_without_images_is_refused(images):
    (images / "c").mkdir()
    (images / "c" / "notes.txt").write_text("not an image")
    with pytest.raises(DataFormatError, match=r"class folder 'c' holds no images"):
        load_file(images)


@pytest.mark.parametrize("content", [b"", b"not an image at all"], ids=["0 bytes", "text"])
def test_an_image_file_that_is_not_an_image_is_refused_naming_it(images, content):
    (images / "a" / "2.png").write_bytes(content)
    with pytest.raises(DataFormatError, match=rf"{images / 'a' / '2.png'}: not a readable image"):
        load_file(images)


def test_files_other_than_images_are_ignored(images):
    (images / "a" / "README").write_text("about these images")
    assert len(load_file(images)) == 2


def test_an_image_reached_through_a_link_is_read_and_checked_like_any_other(images, tmp_path):
    (images / "a" / "linked.png").symlink_to(images / "b" / "1.png")
    assert len(load_file(images)) == 3

    (images / "a" / "linked.png").unlink()
    (tmp_path / "secret.txt").write_text("outside the folder, and no image")
    (images / "a" / "linked.png").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(DataFormatError, match=r"linked\.png: not a readable image"):
        load_file(images)


def test_a_link_back_up_the_folder_is_not_followed_round(images):
    (images / "a" / "up").symlink_to("..")
    (images / "b" / "loop").symlink_to(images)

    ds = load_file(images)

    assert len(ds) == 2 and ds.classes == ["a", "b"]


def test_a_table_without_its_columns_is_refused_naming_them(tmp_path):
    (tmp_path / "t.csv").write_text("f1,f2,label\n1,2,0\n3,4,1\n")
    (tmp_path / "nolabel.csv").write_text("f1,f2\n1,2\n3,4\n")
    (tmp_path / "gap.csv").write_text("f1,f2,label\n1,,0\n3,4,1\n")

    with pytest.raises(DataFormatError, match=r"nolabel\.csv: has no label column 'label'.*label_column=NAME"):
        load_file(tmp_path / "nolabel.csv")
    with pytest.raises(DataFormatError, match=r"t\.csv: has no column 'f9'; its columns: f1, f2, label"):
        load_file(tmp_path / "t.csv", {"feature_columns": ["f1", "f9"]})
    with pytest.raises(DataFormatError, match=r"gap\.csv: NaN or infinite feature values in 1 rows \(columns 'f2'\)"):
        load_file(tmp_path / "gap.csv")
