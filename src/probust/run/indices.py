"""Which points a run scores: index specifications, and sorted indices as consecutive runs."""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from probust.run.errors import ConfigError

__all__ = ["consecutive_runs", "index_ranges", "parse_indices"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_indices(spec: str | int | Iterable[str | int]) -> np.ndarray:
    """Point indices from a list of numbers and inclusive ranges.

    Args:
        spec: ints, or strings like ``"7"``, ``"0-99"`` (100 points), ``"0-999:10"`` (every
            10th), possibly comma-separated (``"0-9,20,30-39"``).

    Returns:
        int64 [P], sorted and without duplicates.

    Raises:
        ConfigError: a malformed item or a descending range.
    """
    items = list(spec) if isinstance(spec, Iterable) and not isinstance(spec, (str, bytes, dict)) else [spec]
    parts: list[np.ndarray] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer, str)):
            raise ConfigError(f"expected integers or strings like '0-99', got {item!r}", field="indices")
        if isinstance(item, (int, np.integer)):
            if item < 0:
                raise ConfigError(f"indices must be >= 0, got {item}", field="indices")
            parts.append(np.array([item], dtype=np.int64))
            continue
        for token in str(item).replace(",", " ").split():
            m = _RANGE.match(token)
            if m is None:
                raise ConfigError(f"cannot read {token!r}; expected N, A-B (inclusive) or A-B:STEP", field="indices")
            start = int(m.group(1))
            stop = int(m.group(2)) if m.group(2) is not None else start
            step = int(m.group(3)) if m.group(3) is not None else 1
            if stop < start or step < 1:
                raise ConfigError(f"{token!r} is an empty range (need A <= B and STEP >= 1)", field="indices")
            parts.append(np.arange(start, stop + 1, step, dtype=np.int64))
    if not parts:
        raise ConfigError("no indices given", field="indices")
    return np.unique(np.concatenate(parts))


def consecutive_runs(indices: np.ndarray) -> list[slice]:
    """Slices of ``indices`` (sorted) over which the values are consecutive integers."""
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    edges = [0, *breaks.tolist(), len(indices)]
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def index_ranges(indices: np.ndarray) -> list[list[int]]:
    """Sorted indices as half-open ranges [[start, stop], ...] (compact in config.json)."""
    if len(indices) == 0:
        return []
    return [[int(indices[r.start]), int(indices[r.stop - 1]) + 1] for r in consecutive_runs(indices)]
