"""probust.data: real file formats written here, loaded through the code users run."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

import probust.data as pdata
from probust.data import _locate
from probust.data._digits import split_indices
from tests._helpers import FASHION_MNIST_DIR, require_fashion_mnist

FMNIST_DIR = FASHION_MNIST_DIR
FMNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No data from the user's cache or the system folders leaks into these tests."""
    monkeypatch.setenv(pdata.DATA_DIR_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {})


# ---- writers of the real formats, independent of the readers under test ----------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX: 0x0000, type 0x08 (ubyte), rank, big-endian sizes, data."""
    assert array.dtype == np.uint8
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_idx_set(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, gz: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "train" if split == "train" else "t10k"
    for stem, arr in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
        if gz:
            with gzip.open(folder / f"{stem}.gz", "wb") as f:
                f.write(idx_bytes(arr))
        else:
            (folder / stem).write_bytes(idx_bytes(arr))


def random_idx(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255  # the extremes map to exactly 0 and 1
    return images, rng.integers(0, 10, size=n).astype(np.uint8)


def cifar_batch(data: np.ndarray, labels: list[int], label_key: str) -> dict:
    # The real batches are python-2 pickles of dicts with bytes keys; latin1 decoding (as
    # torchvision does) turns them into str keys, so str keys here load the same way.
    return {
        "batch_label": "testing batch",
        label_key: labels,
        "data": data,
        "filenames": [f"{i}.png" for i in range(len(labels))],
    }


def write_cifar10(root: Path, per_batch: int = 2, n_test: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    all_data, all_labels = [], []
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(cifar_batch(data, labels, "labels"), protocol=2))
        all_data.append(data)
        all_labels += labels
    test = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    (folder / "test_batch").write_bytes(pickle.dumps(cifar_batch(test, list(range(n_test)), "labels"), protocol=2))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": names, "num_cases_per_batch": per_batch}, protocol=2)
    )
    return np.concatenate(all_data), np.array(all_labels)


# ---- MNIST / Fashion-MNIST --------------------------------------------------------------------


def test_idx_gz_files_load_as_float_images_in_unit_range(tmp_path):
    images, labels = random_idx(5)
    write_idx_set(tmp_path, "train", images, labels, gz=True)

    ds = pdata.load("fashion-mnist", split="train", root=tmp_path)

    assert (ds.name, ds.split, len(ds), ds.num_classes) == ("fashion-mnist", "train", 5, 10)
    assert ds.input_shape == (1, 28, 28) and ds.classes == FMNIST_CLASSES
    x, y = ds[0]
    assert x.dtype == torch.float32 and x.shape == (1, 28, 28) and isinstance(y, int)
    assert x[0, 0, 0] == 0.0 and x[0, 0, 1] == 1.0
    X, Y = ds.tensors()
    assert torch.equal(X, torch.from_numpy(images).float().unsqueeze(1) / 255)
    assert torch.equal(Y, torch.from_numpy(labels).long())
    assert all(torch.equal(ds[i][0], X[i]) and ds[i][1] == Y[i] for i in range(5))


def test_torchvision_layout_reads_the_same_values_as_gz(tmp_path):
    images, labels = random_idx(4, seed=1)
    write_idx_set(tmp_path / "tv" / "MNIST" / "raw", "test", images, labels, gz=False)
    write_idx_set(tmp_path / "flat", "test", images, labels, gz=True)

    via_torchvision = pdata.load("mnist", root=tmp_path / "tv")
    via_gz = pdata.load("mnist", root=tmp_path / "flat")

    assert via_torchvision.source.endswith(os.path.join("MNIST", "raw"))
    assert via_torchvision.classes == torchvision.datasets.MNIST.classes
    for a, b in zip(via_torchvision.tensors(), via_gz.tensors()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_truncated_idx_file_is_detected(tmp_path, gz):
    images, labels = random_idx(3)
    write_idx_set(tmp_path, "test", images, labels, gz=gz)
    name = "t10k-images-idx3-ubyte" + (".gz" if gz else "")
    full = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(full[: len(full) - 100])

    with pytest.raises(pdata.DataCorruptError, match=name) as info:
        pdata.load("fashion-mnist", root=tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    assert "truncated" in str(info.value) or "gzip" in str(info.value)


def test_file_with_wrong_magic_number_is_detected(tmp_path):
    images, labels = random_idx(3)
    write_idx_set(tmp_path, "test", images, labels, gz=False)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))

    with pytest.raises(pdata.DataCorruptError, match="magic"):
        pdata.load("fashion-mnist", root=tmp_path)


def test_labels_file_in_place_of_images_is_detected(tmp_path):
    images, labels = random_idx(3)
    write_idx_set(tmp_path, "test", images, labels, gz=True)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes((tmp_path / "t10k-labels-idx1-ubyte.gz").read_bytes())

    with pytest.raises(pdata.DataCorruptError, match="1 dimensions, expected 3"):
        pdata.load("fashion-mnist", root=tmp_path)


def test_image_and_label_counts_must_agree(tmp_path):
    images, labels = random_idx(4)
    write_idx_set(tmp_path, "test", images, labels[:3], gz=True)

    with pytest.raises(pdata.DataCorruptError, match="4 images but .* 3 labels"):
        pdata.load("mnist", root=tmp_path)


def test_labels_outside_ten_classes_are_detected(tmp_path):
    images, labels = random_idx(3)
    labels[1] = 12
    write_idx_set(tmp_path, "test", images, labels, gz=True)

    with pytest.raises(pdata.DataCorruptError, match="labels outside"):
        pdata.load("mnist", root=tmp_path)


def test_missing_data_set_names_files_places_and_remedies(tmp_path, monkeypatch):
    system = tmp_path / "usr-share-datasets-fashion-mnist"
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {"fashion-mnist": [system]})

    with pytest.raises(pdata.ProbustDataError) as info:
        pdata.load("fashion-mnist", split="train", root=tmp_path / "mine")

    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for needle in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        str(tmp_path / "mine"),
        str(system),
        "download=True",  # in Python the setting by its name (the CLI shows its flag)
        "dataset-fashion-mnist",
    ):
        assert needle in message


def test_default_root_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(pdata.DATA_DIR_ENV, str(tmp_path / "data"))
    images, labels = random_idx(2)
    write_idx_set(tmp_path / "data" / "FashionMNIST" / "raw", "test", images, labels, gz=False)

    assert pdata.data_home() == tmp_path / "data"
    assert len(pdata.load("fashion-mnist")) == 2


def test_system_folder_is_used_after_root(tmp_path, monkeypatch):
    images, labels = random_idx(2)
    write_idx_set(tmp_path / "system", "test", images, labels, gz=True)
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {"fashion-mnist": [tmp_path / "system"]})

    ds = pdata.load("fashion-mnist", root=tmp_path / "empty")

    assert ds.source == str(tmp_path / "system")


def test_half_present_data_set_is_reported(tmp_path):
    images, labels = random_idx(2)
    write_idx_set(tmp_path, "test", images, labels, gz=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()

    with pytest.raises(pdata.ProbustDataError, match="found t10k-images-idx3-ubyte.gz but not its companion"):
        pdata.load("mnist", root=tmp_path)


def test_failed_download_is_reported_without_a_loader_traceback(tmp_path, monkeypatch):
    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://..., got: <urlopen error>")

    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)

    with pytest.raises(pdata.ProbustDataError, match="download failed: RuntimeError: Error downloading") as info:
        pdata.load("mnist", root=tmp_path, download=True)
    assert info.value.__cause__ is None and info.value.__context__ is None  # no chained loader traceback


def test_downloaded_files_are_found_and_loaded(tmp_path, monkeypatch):
    images, labels = random_idx(3)

    def fake_download(self):  # what torchvision leaves behind: extracted files in raw_folder
        for split in ("train", "test"):
            write_idx_set(Path(self.raw_folder), split, images, labels, gz=False)

    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "download", fake_download)

    ds = pdata.load("fashion-mnist", root=tmp_path, download=True)

    assert ds.source == str(tmp_path / "FashionMNIST" / "raw") and len(ds) == 3


# ---- CIFAR ------------------------------------------------------------------------------------


def test_cifar10_batches_load_channel_first_in_file_order(tmp_path):
    data, labels = write_cifar10(tmp_path)

    ds = pdata.load("cifar10", split="train", root=tmp_path)

    assert (len(ds), ds.input_shape, ds.num_classes) == (10, (3, 32, 32), 10)
    assert ds.classes[0] == "airplane" and ds.classes[9] == "truck"
    X, Y = ds.tensors()
    # Row layout of a CIFAR record: 1024 red values, 1024 green, 1024 blue, each row-major.
    i, c, h, w = 7, 1, 5, 30
    assert X[i, c, h, w] == data[i, c * 1024 + h * 32 + w] / 255
    assert torch.equal(X, torch.from_numpy(data.reshape(-1, 3, 32, 32)).float() / 255)
    assert Y.tolist() == labels.tolist()
    test = pdata.load("cifar-10", split="test", root=tmp_path)
    assert len(test) == 3 and test.targets.tolist() == [0, 1, 2]


def test_cifar100_uses_fine_labels_and_names(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(0)
    fine = [3, 99, 42, 0]
    for name, n in (("train", 4), ("test", 2)):
        batch = {
            "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            "fine_labels": fine[:n],
            "coarse_labels": [1] * n,
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    names = [f"class{i:03d}" for i in range(100)]
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": names, "coarse_label_names": ["c"] * 20}))

    ds = pdata.load("cifar100", split="train", root=tmp_path)

    assert ds.num_classes == 100 and ds.classes == names
    assert ds.targets.tolist() == fine


def test_truncated_cifar_batch_is_detected(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    path.write_bytes(path.read_bytes()[:-500])

    with pytest.raises(pdata.DataCorruptError, match="data_batch_3"):
        pdata.load("cifar10", split="train", root=tmp_path)


def test_cifar_batch_with_wrong_record_size_is_detected(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(pickle.dumps(cifar_batch(np.zeros((3, 3000), np.uint8), [0, 1, 2], "labels")))

    with pytest.raises(pdata.DataCorruptError, match=r"shape \[n, 3072\]"):
        pdata.load("cifar10", root=tmp_path)


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_cifar_pickle_that_would_run_code_is_refused(tmp_path):
    write_cifar10(tmp_path)
    marker = tmp_path / "code-ran"
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({"data": _Exploit(marker)}))

    with pytest.raises(pdata.DataCorruptError, match="refusing to load global"):
        pdata.load("cifar10", root=tmp_path)
    assert not marker.exists()


def test_cifar_archive_alone_points_to_download(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not really")

    with pytest.raises(pdata.ProbustDataError, match="found the archive .*: download=True verifies") as info:
        pdata.load("cifar10", root=tmp_path)
    # The command line names its own flag for the same setting (the error carries it as a Setting).
    from probust.cli.flags import message

    assert "found the archive" in message(info.value, {"download": "--download"})
    assert ": --download verifies" in message(info.value, {"download": "--download"})


def test_a_damaged_cifar_file_suggests_download_in_the_callers_words(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(pdata.DataCorruptError, match=r"run again with download=True\)") as info:
        pdata.load("cifar10", root=tmp_path)
    from probust.cli.flags import message

    assert "run again with --download)" in message(info.value, {"download": "--download"})


# ---- digits, names ----------------------------------------------------------------------------


def test_digits_split_is_fixed_stratified_and_disjoint():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    train, test = pdata.load("digits", "train"), pdata.load("digits", "test")
    train_idx, test_idx = split_indices(bunch.target)

    assert len(train) + len(test) == len(bunch.target) == 1797
    assert set(train_idx).isdisjoint(test_idx)
    per_class = np.bincount(bunch.target[test_idx]) / np.bincount(bunch.target)
    assert np.allclose(per_class, 0.2, atol=0.02)
    X, Y = test.tensors()
    assert X.shape == (len(test_idx), 1, 8, 8) and float(X.min()) == 0.0 and float(X.max()) == 1.0
    assert torch.equal(X[:, 0], torch.from_numpy(bunch.images[test_idx] / 16).float())
    assert torch.equal(Y, torch.from_numpy(bunch.target[test_idx]).long())
    assert torch.equal(pdata.load("digits", "test").tensors()[0], X)  # the same split every time


def test_subset_keeps_attributes():
    ds = pdata.load("digits", "test")
    sub = ds.subset([4, 0])
    assert (sub.name, sub.classes, sub.input_shape, len(sub)) == (ds.name, ds.classes, ds.input_shape, 2)
    assert torch.equal(sub[0][0], ds[4][0]) and sub[1][1] == ds[0][1]


def test_unknown_data_set_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown data set 'svhn'; known data sets: mnist, fashion-mnist, cifar10, cifar100, digits"
    ):
        pdata.load("svhn")
    with pytest.raises(ValueError, match="unknown split 'val'"):
        pdata.load("digits", split="val")


@pytest.mark.parametrize("alias", ["FMNIST", "fashion_mnist", "FashionMNIST", "Fashion-MNIST"])
def test_common_spellings_are_accepted(alias):
    assert pdata.canonical_name(alias) == "fashion-mnist"


# ---- the real Fashion-MNIST files (Debian's dataset-fashion-mnist) --------------------------


@pytest.fixture
def real_fmnist(monkeypatch):
    monkeypatch.setattr(_locate, "SYSTEM_DIRS", {"fashion-mnist": [require_fashion_mnist()]})


def test_real_fashion_mnist_has_the_published_sizes_and_statistics(real_fmnist):
    test = pdata.load("fashion-mnist", "test")
    train = pdata.load("fashion-mnist", "train")

    assert (len(train), len(test)) == (60_000, 10_000)
    assert test.source == str(FMNIST_DIR) and test.classes == FMNIST_CLASSES
    assert torch.bincount(train.targets).tolist() == [6000] * 10
    assert torch.bincount(test.targets).tolist() == [1000] * 10
    X, _ = train.tensors()
    assert 0.0 == float(X.min()) and float(X.max()) == 1.0
    # Published training-set statistics of Fashion-MNIST, in [0, 1] units: mean 0.2860, std 0.3530.
    assert abs(float(X.mean()) - 0.2860) < 1e-3 and abs(float(X.std()) - 0.3530) < 1e-3
    assert train.mean == (0.2860,) and train.std == (0.3530,)


def test_missing_fashion_mnist_skips_outside_ci_and_fails_under_it(tmp_path, monkeypatch):
    # .ci/run sets PROBUST_REQUIRE_FASHION_MNIST=1: the tests on a trained network may not skip there.
    import tests._helpers as helpers

    monkeypatch.setattr(helpers, "FASHION_MNIST_DIR", tmp_path)
    monkeypatch.delenv("PROBUST_REQUIRE_FASHION_MNIST", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        helpers.require_fashion_mnist()
    monkeypatch.setenv("PROBUST_REQUIRE_FASHION_MNIST", "1")
    with pytest.raises(pytest.fail.Exception, match="PROBUST_REQUIRE_FASHION_MNIST=1"):
        helpers.require_fashion_mnist()
    # and .ci/run exports it, after failing outright when the files cannot be had
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "export PROBUST_REQUIRE_FASHION_MNIST=1" in ci and "exit 1" in ci
