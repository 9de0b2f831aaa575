"""probust._io: files are replaced whole or not at all; digests match hashlib."""

from __future__ import annotations

import hashlib
import os

import pytest

from probust import _io


def test_atomic_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "f.bin"
    _io.atomic_write_bytes(path, b"old")
    _io.atomic_write_bytes(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.bin"]  # no temporary left


def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    _io.atomic_write_text(path, "old")

    def fail_halfway(f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        _io.atomic_write(path, fail_halfway)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_written_files_get_the_umask_default_mode(tmp_path):
    path = tmp_path / "f"
    _io.atomic_write_bytes(path, b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_sha256_file_equals_hashlib_over_the_bytes(tmp_path):
    data = os.urandom(3 * 1024 + 17)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert _io.sha256_file(path, block=1024) == hashlib.sha256(data).hexdigest()
