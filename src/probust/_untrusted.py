"""The one gate for files that could run code when loaded: every model, weights, data and archive
file a user gives probust is read through it.

Three kinds of content run code on loading, whatever the file is called:

* pickled Python objects (``torch.save(model)``, ``np.save`` of an object array, a pickle inside
  a ``torch.export`` archive): unpickling calls whatever functions the file names;
* a ``torch.export`` archive's symbolic shape expressions, which torch parses with
  ``sympy.sympify``, that is with Python's ``eval``;
* compiled native code (an AOTInductor package inside a ``.pt2``), which torch loads with
  ``dlopen``.

:func:`torch_load` reads a ``torch.save`` file with ``weights_only=True`` (tensors and plain
containers only) and goes further only with ``allow_pickle``; :func:`numpy_load` never unpickles;
:func:`check_export_archive` reads a ``torch.export`` archive's zip entries and JSON before torch
sees them and refuses every one of the three, unless ``allow_pickle``. Each refusal uses one
message (:func:`refusal`): it names the file, what in it runs code, and what to do.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import torch

from probust.errors import Part, ProbustError, Setting

__all__ = [
    "ALLOW_PICKLE",
    "check_export_archive",
    "numpy_load",
    "refusal",
    "refused_objects",
    "torch_load",
]

#: The setting that lets files run code when loaded.
ALLOW_PICKLE = Setting("allow_pickle", True)

# What torch.export.load reads from an archive (torch/export/pt2_archive/constants.py), by
# path inside the archive's top folder.
_AOTI_DIR = "data/aotinductor/"
_WEIGHTS_DIR = "data/weights/"
_CONSTANTS_DIR = "data/constants/"
_SAMPLE_INPUTS_DIR = "data/sample_inputs/"
_MODELS_DIR = "models/"
_TENSOR_PREFIX = "tensor_"
_CONFIG_SUFFIXES = ("_weights_config.json", "_constants_config.json")
# The format torch.export.load falls back to (torch < 2.7): names at the root of the zip.
_LEGACY_PICKLES = (
    "serialized_state_dict.pt",
    "serialized_state_dict.json",
    "serialized_constants.pt",
    "serialized_constants.json",
    "serialized_example_inputs.pt",
)
_LEGACY_PROGRAM = "serialized_exported_program.json"
_NATIVE_SUFFIXES = (".so", ".dll", ".dylib", ".pyd")

# What a symbolic shape expression may hold: arithmetic, comparisons and calls of these
# functions (sympy's and torch.utils._sympy.functions', which torch's deserializer provides).
_EXPR_CALLS = frozenset(
    {
        "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs",
        "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise", "floor", "ceiling",
        "sqrt", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv",
        "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow",
        "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat",
        "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    }
)  # fmt: skip
_EXPR_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Call,
    ast.keyword,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Tuple,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
# Bounds that keep a symbolic shape cheap to evaluate: sympy computes 9**9**9**9 exactly (it never
# finishes), and torch's shapes and strides are 64-bit integers.
_MAX_EXPONENT = 64
_MAX_INTEGER = 2**64
_POWER_CALLS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})


def refusal(path: str | os.PathLike, found: str, advice: str, *, allowed: bool = True) -> tuple[Part, ...]:
    """The message for a file that runs code when loaded: ``path``, what in it does (``found``),
    and ``advice`` (how to save it without). With ``allowed`` (where the caller takes
    ``allow_pickle``) it also says that :data:`ALLOW_PICKLE` loads it."""
    start = f"{os.fspath(path)}: holds {found}, and loading it runs code from the file; "
    if allowed:
        return (start + "pass ", ALLOW_PICKLE, f" if you trust it, or {advice}")
    return (start + f"probust does not load such files: {advice}",)


# How torch's weights_only unpickler says that a file names Python objects (a damaged file
# fails with "Unsupported operand" instead).
_OBJECT_REFUSALS = ("unsupported global", "can only create new object", "can only build", "unrecognized function")


def refused_objects(exc: BaseException) -> bool:
    """Whether ``torch.load(..., weights_only=True)`` failed because the file holds objects other
    than tensors and plain containers (rather than because it is damaged or not a torch file):
    for a library that loads with ``weights_only=True`` itself (transformers), to say so with
    :func:`refusal`."""
    text = str(exc).lower()
    return isinstance(exc, pickle.UnpicklingError) and any(words in text for words in _OBJECT_REFUSALS)


def torch_load(
    source: str | os.PathLike | bytes,
    *,
    allow_pickle: bool | None,
    error: Callable[..., ProbustError],
    advice: str,
    name: str | os.PathLike | None = None,
    map_location: Any = "cpu",
) -> Any:
    """``torch.load`` of a file that may hold pickled objects: tensors and plain containers load
    (``weights_only=True``); anything else only with ``allow_pickle``.

    Args:
        source: the file, or its bytes.
        allow_pickle: load pickled Python objects too (it runs code from the file); None where the
            caller offers no such option (the message then does not suggest it).
        error: makes the error raised for a refused file from the message's parts (the caller's
            :class:`ProbustError` subclass, or a ``functools.partial`` of one with its ``field``).
        advice: how to save the file without pickled objects (ends the message).
        name: how to name the file in the message (default ``source``).
        map_location: as ``torch.load``'s.

    Raises:
        error: the file holds pickled objects and ``allow_pickle`` is false (:func:`refusal`).
        Exception: what ``torch.load`` raises for a damaged file or one of another kind.
    """
    label = name if name is not None else source if not isinstance(source, bytes) else "<bytes>"

    def load(weights_only: bool) -> Any:
        f = io.BytesIO(source) if isinstance(source, bytes) else source
        return torch.load(f, map_location=map_location, weights_only=weights_only)

    try:
        return load(True)
    except Exception as exc:
        if not refused_objects(exc):
            raise
        if not allow_pickle:
            found = "pickled Python objects (e.g. torch.save(model))"
            raise error(*refusal(label, found, advice, allowed=allow_pickle is not None)) from None
    return load(False)


def numpy_load(path: str | os.PathLike, *, error: Callable[..., ProbustError], advice: str) -> Any:
    """``np.load`` that never unpickles (``.npy``, ``.npz``): an object array is refused.

    Raises:
        error: the file holds an object array (pickled Python objects).
        Exception: what ``np.load`` raises for a damaged file or one of another kind.
    """
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise
        raise error(*refusal(path, "pickled Python objects (an object array)", advice, allowed=False)) from None


def check_export_archive(
    data: bytes, *, name: str | os.PathLike, error: Callable[..., ProbustError], advice: str
) -> None:
    """Refuses a ``torch.export`` archive (its bytes) from which ``torch.export.load`` would run
    code: a weight, constant or sample input that only loads unpickled (``use_pickle``, a custom
    or opaque object, a legacy ``.pt`` payload, sample inputs that ``weights_only`` refuses), an
    AOTInductor package or other native library, or a symbolic shape expression that is anything
    but arithmetic. An archive ``torch.export.save`` writes for a model of torch operators passes.

    The caller loads the same bytes afterwards (not the file again), so that what was checked
    is what is loaded, and calls ``ExportedProgram.module(check_guards=False)``: the guards an
    archive records are Python source that ``module()`` would otherwise compile.

    Args:
        data: the archive's bytes.
        name: the file, for messages.
        error: makes the error raised from the message's parts (as :func:`torch_load`'s).
        advice: how to save the model without such content (ends the message).

    Raises:
        error: the archive holds any of the above, or is not a zip that torch reads as one
            archive (two entries of one name).
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise error(f"{name}: not a torch.export archive ({exc})") from None
    seen: set[str] = set()
    for entry in entries:
        if entry.filename in seen:
            raise error(
                f"{name}: holds two zip entries named {entry.filename!r}, which torch.export.save never writes; "
                f"{advice}"
            )
        seen.add(entry.filename)
    with archive:
        for entry in entries:
            found = _code_in(archive, entry, name, error)
            if found is not None:
                raise error(*refusal(name, found, advice))


def _code_in(
    archive: zipfile.ZipFile, entry: zipfile.ZipInfo, name: Any, error: Callable[..., ProbustError]
) -> str | None:
    """What in one entry of an archive would run code when torch loads it; None for nothing."""
    full = entry.filename
    inner = full.split("/", 1)[1] if "/" in full else full  # below the archive's top folder
    if inner.startswith(_AOTI_DIR) or full.lower().endswith(_NATIVE_SUFFIXES):
        return f"compiled native code (the AOTInductor package entry {full})"
    if inner.startswith((_WEIGHTS_DIR, _CONSTANTS_DIR)) and inner.endswith(_CONFIG_SUFFIXES):
        config = _json(archive, entry, name, error)
        payloads = config.get("config") if isinstance(config, dict) else None
        if not isinstance(payloads, dict):
            raise error(f"{name}: {full} is not a torch.export payload configuration")
        constants = inner.startswith(_CONSTANTS_DIR)
        for key, payload in payloads.items():
            if not isinstance(payload, dict) or not isinstance(payload.get("path_name"), str):
                raise error(f"{name}: {full}: the entry {key!r} is not a torch.export payload")
            if payload.get("use_pickle"):
                return f"pickled Python objects ({key!r}, marked use_pickle in {full})"
            if constants and not payload["path_name"].startswith(_TENSOR_PREFIX):
                return f"pickled Python objects (the constant {key!r}, {payload['path_name']} in {full})"
        return None
    legacy = PurePosixPath(full).name in _LEGACY_PICKLES
    payload_file = inner.startswith((_WEIGHTS_DIR, _CONSTANTS_DIR)) and inner.endswith(".pt")
    if legacy or payload_file or inner.startswith(_SAMPLE_INPUTS_DIR):
        body = archive.read(entry)
        if body:
            try:
                torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
            except Exception:
                return f"pickled Python objects ({full}, which loads only unpickled)"
        return None
    if inner.startswith(_MODELS_DIR) or PurePosixPath(full).name == _LEGACY_PROGRAM:
        for expr in _expressions(_json(archive, entry, name, error)):
            shown = expr if len(expr) <= 80 else expr[:77] + "..."
            if not _arithmetic(expr):
                return f"Python code as a symbolic shape ({shown!r} in {full}, which torch evaluates)"
            if not _bounded(expr):
                raise error(
                    f"{name}: {full} holds a symbolic shape too large to evaluate ({shown!r}: exponents and "
                    f"shifts of at most {_MAX_EXPONENT}, integers of at most 2**64), which torch.export never writes"
                )
    return None


def _json(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, name: Any, error: Callable[..., ProbustError]) -> Any:
    try:
        return json.loads(archive.read(entry))
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{name}: {entry.filename} is not valid JSON ({exc})") from None


def _expressions(value: Any) -> Iterator[str]:
    """Every ``expr_str`` in a serialized exported program (what torch passes to sympify), as
    written: one that is not a string is given as its JSON text (a list of strings would be
    sympified item by item), which no arithmetic check passes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if key == "expr_str":
                    yield child if isinstance(child, str) else json.dumps(child)
                else:
                    stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def _arithmetic(expr: str) -> bool:
    """Whether ``expr`` is a symbolic shape as torch writes one (``Symbol('s0', positive=True,
    integer=True)``, ``2*s0 + 1``, ``FloorDiv(s0, 2)``): numbers, names, operators and calls of
    sympy's arithmetic functions, nothing Python could do more with."""
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _EXPR_NODES):
            return False
        if isinstance(node, ast.Name) and not (
            _NAME.match(node.id) and (node.id in _EXPR_CALLS or not _builtin(node.id))
        ):
            return False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _EXPR_CALLS):
            return False
        if isinstance(node, ast.keyword) and (node.arg is None or not _NAME.match(node.arg)):
            return False
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
            return False
    return True


def _bounded(expr: str) -> bool:
    """Whether an arithmetic ``expr`` (one :func:`_arithmetic` passed) is cheap to evaluate: every
    integer at most 2**64 in size, every exponent or shift a constant of at most 64."""
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) > _MAX_INTEGER:
            return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift, ast.RShift)):
            if not _small_constant(node.right):
                return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWER_CALLS:
            if len(node.args) != 2 or not _small_constant(node.args[1]):
                return False
    return True


def _small_constant(node: ast.expr) -> bool:
    """A number written as a constant (or its negation) of size at most :data:`_MAX_EXPONENT`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) <= _MAX_EXPONENT


def _builtin(name: str) -> bool:
    return hasattr(builtins, name)
