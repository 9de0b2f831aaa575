"""Turning settings and metadata into JSON types, for config.json and checkpoint sidecars."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def jsonable(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with dict keys made strings, tuples made lists, and every other leaf mapped by
    ``leaf`` (which decides what to do with tensors, numpy scalars and unknown objects)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, leaf) for v in value]
    return leaf(value)
