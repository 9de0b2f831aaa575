"""probust._untrusted, the gate for files that could run code: what it lets through, what it
refuses, and the one message it refuses with."""

from __future__ import annotations

import functools
import io
import json
import zipfile

import numpy as np
import pytest
import torch

from probust import _untrusted
from probust.errors import OptionError
from tests._crafted import Marker


def _archive(expr) -> bytes:
    """A zip holding only a models/model.json with one symbolic shape ``expr`` (as written)."""
    program = {"graph_module": {"graph": {"sym_int_values": {"s": {"as_expr": {"expr_str": expr, "hint": None}}}}}}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("m/models/model.json", json.dumps(program))
    return buffer.getvalue()


def _check(data: bytes) -> None:
    _untrusted.check_export_archive(data, name="m.pt2", error=OptionError, advice="save it otherwise")


@pytest.mark.parametrize(
    "expr",
    [
        "Symbol('s31', positive=True, integer=True)",
        "2*Symbol('s0', positive=True, integer=True) + 1",
        "s0*s1 - 3",
        "FloorDiv(s0, 2)",
        "Max(1, Mod(s0, 4))",
        "s0**2",
        "Eq(s0, 3) & Ne(s1, 0)",
        "-s0 <= 4",
    ],
)
def test_shape_expressions_as_torch_writes_them_pass(expr):
    _check(_archive(expr))


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "open('/tmp/x', 'w')",
        "Symbol('s0') + 0*len(str(exec('1')))",
        "s0.__class__",
        "(lambda: 1)()",
        "[c for c in 'ab']",
        "Symbol('s0')(1)",
        "getattr(s0, 'x')",
        "s0!",
        "Symbol(**{'name': 's'})",
        ["s0", "__import__('os')"],  # sympify would parse each item of a list
        {"a": "s0"},
    ],
    ids=str,
)
def test_shape_expressions_python_could_do_more_with_are_refused(expr):
    with pytest.raises(OptionError, match=r"^m\.pt2: holds Python code as a symbolic shape .*save it otherwise"):
        _check(_archive(expr))


@pytest.mark.parametrize(
    "expr",
    ["9**9**9**9", "s0**(10**9)", "Pow(s0, 10**9)", "LShift(1, 10**9)", "s0 << 100000", "2*s0 + " + "9" * 40],
)
def test_shape_expressions_too_large_to_evaluate_are_refused(expr):
    # Arithmetic, so no code runs, but sympy would compute them exactly and never finish.
    with pytest.raises(
        OptionError, match=r"^m\.pt2: m/models/model\.json holds a symbolic shape too large to evaluate"
    ):
        _check(_archive(expr))


def test_torch_load_reads_tensors_and_refuses_objects_without_running_them(tmp_path):
    marker = tmp_path / "ran"
    safe, unsafe = tmp_path / "safe.pt", tmp_path / "unsafe.pt"
    torch.save({"w": torch.ones(2)}, safe)
    torch.save({"w": Marker(marker)}, unsafe)
    load = functools.partial(_untrusted.torch_load, error=OptionError, advice="save tensors")

    assert torch.equal(load(safe, allow_pickle=False)["w"], torch.ones(2))
    with pytest.raises(OptionError, match=r"unsafe\.pt: holds pickled Python objects.*pass allow_pickle=True"):
        load(unsafe, allow_pickle=False)
    with pytest.raises(OptionError) as caught:
        load(unsafe, allow_pickle=None)  # a caller that offers no such option
    assert "allow_pickle" not in str(caught.value) and "probust does not load such files: save tensors" in str(
        caught.value
    )
    assert not marker.exists()
    load(unsafe, allow_pickle=True)  # the user's choice: the file's code runs
    assert marker.exists()


def test_torch_load_leaves_a_damaged_file_to_the_caller(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"\x00\x01 not a torch file")

    with pytest.raises(Exception) as caught:
        _untrusted.torch_load(path, allow_pickle=False, error=OptionError, advice="-")
    assert not isinstance(caught.value, OptionError)


def test_numpy_load_never_unpickles(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object))

    with pytest.raises(OptionError, match=r"objects\.npy: holds pickled Python objects \(an object array\)"):
        _untrusted.numpy_load(path, error=OptionError, advice="save numbers")
