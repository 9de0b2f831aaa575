"""What every experiment returns, and the helpers they share for writing it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


class ExperimentSkipped(Exception):
    """The results hold nothing this experiment can use (the message says what is missing)."""


@dataclass
class Output:
    """An experiment's products.

    Attributes:
        name: the experiment's registry name (also its folder and file stem).
        title: a one-line title.
        description: what the experiment measures and how (fixed text).
        tables: tidy tables by name; ``tables[name]`` (the main one) is written to
            ``<name>.csv``, every other one to ``<name>_<table>.csv``.
        figures: PNG files (each with an SVG beside it).
        reading: short statements computed from the numbers.
        settings: the options the experiment ran with.
        skipped: why nothing was produced (then tables and figures are empty).
        files: every file written.
    """

    name: str
    title: str
    description: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def table(self) -> pd.DataFrame:
        """The main table."""
        return self.tables[self.name]


def write_tables(out: Path, name: str, tables: dict[str, pd.DataFrame]) -> list[Path]:
    """Write each table as CSV in ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, frame in tables.items():
        path = out / (f"{name}.csv" if key == name else f"{name}_{key}.csv")
        frame.to_csv(path, index=False, float_format="%.6g")
        paths.append(path)
    return paths


def finish(output: Output, out: Path) -> Output:
    """Write the tables of ``output`` and collect the list of files."""
    files = write_tables(out, output.name, output.tables)
    for png in output.figures:
        files += [png, png.with_suffix(".svg")]
    output.files = files
    return output


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for prose: 3 significant digits, scientific below 1e-3."""
    if value is None or not np.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def pct(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{100 * value:.1f}%"


def sem(values) -> float:
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
