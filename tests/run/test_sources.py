"""The data and model sources of a run: hashes that identify them, and one-line errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from torch import nn

from probust._io import sha256_file
from probust.data import ImageDataset
from probust.run import ConfigError, hash_state_dict
from probust.run.sources import batch, hash_data, load_data, num_classes


def test_the_state_dict_hash_identifies_the_weights_not_the_object():
    torch.manual_seed(0)
    a = nn.Linear(4, 3)
    b = nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    assert hash_state_dict(a) == hash_state_dict(b) and len(hash_state_dict(a)) == 64
    with torch.no_grad():
        b.bias[0] += 1e-6
    assert hash_state_dict(a) != hash_state_dict(b)


def test_the_file_hash_is_the_sha256_of_its_bytes(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 5000  # more than one read block
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_the_data_hash_notices_a_changed_label_and_a_plain_dataset_reads_the_same(tiny_data):
    x, y = tiny_data.tensors()
    changed = y.clone()
    changed[7] = (changed[7] + 1) % 3
    images = (x * 255).round().to(torch.uint8)
    other = ImageDataset(images, changed, name="tiny", split="test", classes=["a", "b", "c"])
    assert hash_data(tiny_data) != hash_data(other)
    plain = torch.utils.data.TensorDataset(x, y)
    assert hash_data(plain) == hash_data(tiny_data)
    xb, yb = batch(plain, np.array([3, 5]))
    assert torch.equal(xb, x[[3, 5]]) and yb.dtype == torch.int64 and torch.equal(yb, y[[3, 5]])
    assert num_classes(tiny_data) == 3 and num_classes(plain) is None


def test_a_data_set_that_cannot_be_used_is_one_line_naming_data():
    for bad, match in (
        (42, "^data: must be a data set name or a Dataset"),
        ([], "^data: the data set is empty"),
        ([1.5, 2.5], r"^data: cannot read ds\[0\] as \(x, label\)"),
        ("no-such-set", "^data: "),
    ):
        with pytest.raises(ConfigError, match=match) as info:
            load_data(bad, "test", None, False)
        assert "\n" not in str(info.value)
