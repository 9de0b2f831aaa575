"""The rows a plot draws: a runner's DataFrame or an :class:`~probust.Estimate`, checked and selected.

Every plot takes the long table the runner writes (one row per point, sigma, method and sample
count: ``probust.run.read_results(folder)``, ``probust.run_estimate``, ``probust.score``) or an
``Estimate``. Where a method was scored at several sample counts, a plot uses its *principal*
count, the one with the most rows (ties: the larger), as the report does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from probust.errors import OptionError
from probust.estimators import Estimate

__all__ = [
    "as_frame",
    "choose_sigma",
    "class_column",
    "methods_of",
    "pick_methods",
    "pick_sigmas",
    "principal",
    "wide",
]

#: The columns every plot needs.
REQUIRED = ("index", "method", "p")


def as_frame(results: Any, needs: Sequence[str] = REQUIRED) -> pd.DataFrame:
    """``results`` as a DataFrame with the runner's columns.

    Args:
        results: a DataFrame with the runner's columns (at least ``index``, ``method``, ``p``), or
            an :class:`~probust.Estimate` (its points indexed 0..B-1, its ``target`` the class;
            no ``label`` and no ``sigma``, which the estimate does not know).
        needs: the columns the caller needs besides :data:`REQUIRED`.

    Raises:
        OptionError: (field ``results``) neither, or a needed column is missing.
    """
    if isinstance(results, Estimate):
        n = len(results)
        frame = pd.DataFrame(
            {
                "index": np.arange(n, dtype=np.int64),
                "target": results.target.cpu().numpy().astype(np.int64),
                "prediction": results.target.cpu().numpy().astype(np.int64),
                "sigma": np.full(n, np.nan),
                "method": results.method,
                "n_samples": np.zeros(n, dtype=np.int64)
                if results.n_samples is None
                else results.n_samples.cpu().numpy().astype(np.int64),
                "p": results.p.detach().cpu().double().numpy(),
            }
        )
        for name in ("ci_low", "ci_high"):
            value = getattr(results, name)
            frame[name] = np.nan if value is None else value.detach().cpu().double().numpy()
    elif isinstance(results, pd.DataFrame):
        frame = results
    else:
        raise OptionError(
            "must be a pandas DataFrame with the runner's columns (probust.score, probust.run.read_results) "
            f"or an Estimate, got {type(results).__name__}",
            field="results",
        )
    missing = [c for c in dict.fromkeys([*REQUIRED, *needs]) if c not in frame]
    if missing:
        raise OptionError(
            f"has no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(map(str, frame.columns))})",
            field="results",
        )
    if frame.empty:
        raise OptionError("has no rows", field="results")
    return frame


def methods_of(frame: pd.DataFrame) -> list[str]:
    """The methods ``frame`` holds, in the registry's order."""
    from probust.plots.style import order_methods

    return order_methods(frame["method"].unique().tolist())


def pick_methods(frame: pd.DataFrame, methods: str | Iterable[str] | None, *, field: str = "methods") -> list[str]:
    """The methods asked for (default: all those in ``frame``), each checked to have rows.

    Raises:
        OptionError: (field ``field``) a method has no rows; the message lists those present.
    """
    present = methods_of(frame)
    if methods is None:
        return present
    asked = [methods] if isinstance(methods, str) else list(methods)
    if not asked:
        raise OptionError(f"names no method (present: {', '.join(present)})", field=field)
    absent = [m for m in asked if m not in present]
    if absent:
        raise OptionError(
            f"no rows of {', '.join(repr(m) for m in absent)} in the results (present: {', '.join(present)})",
            field=field,
        )
    return asked


def _sigmas(frame: pd.DataFrame) -> list[float]:
    return sorted(float(s) for s in frame["sigma"].unique()) if "sigma" in frame else [float("nan")]


def pick_sigmas(frame: pd.DataFrame, sigma: float | Iterable[float] | None) -> list[float]:
    """The noise levels asked for (default: every one in ``frame``), each checked to have rows.

    Raises:
        OptionError: (field ``sigma``) a level has no rows; the message lists those present.
    """
    present = _sigmas(frame)
    if sigma is None:
        return present
    asked = [float(s) for s in sigma] if isinstance(sigma, Iterable) else [float(sigma)]
    chosen = []
    for s in asked:
        match = [p for p in present if np.isclose(p, s, rtol=1e-9, atol=0.0)]
        if not match:
            listed = ", ".join(f"{p:g}" for p in present)
            raise OptionError(f"no rows at sigma {s:g} (present: {listed})", field="sigma")
        chosen.append(match[0])
    return chosen


def at_sigmas(frame: pd.DataFrame, sigmas: Sequence[float]) -> pd.DataFrame:
    """The rows of ``frame`` at the given levels (a frame without sigma, or NaN ones, as is)."""
    if "sigma" not in frame or all(np.isnan(s) for s in sigmas):
        return frame
    return frame[frame["sigma"].isin(sigmas)]


def choose_sigma(frame: pd.DataFrame, sigma: float | None) -> float:
    """One noise level: ``sigma`` (checked), else the one with the most rows (ties: the one
    nearest the middle of the levels present, in log scale, then the smaller)."""
    if sigma is not None:
        return pick_sigmas(frame, sigma)[0]
    present = _sigmas(frame)
    if len(present) == 1:
        return present[0]
    counts = frame.groupby("sigma").size()
    tied = sorted(float(s) for s, c in counts.items() if c == counts.max())
    middle = present[len(present) // 2]
    return min(tied, key=lambda s: (abs(np.log(s / middle)) if s > 0 and middle > 0 else abs(s - middle), s))


def principal(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of each method at its principal sample count (the count with the most rows,
    ties: the larger), one row per (index, sigma, method)."""
    if "n_samples" not in frame:
        return frame.drop_duplicates([c for c in ("index", "sigma", "method") if c in frame])
    keep = []
    for _, rows in frame.groupby("method", sort=False):
        counts = rows.groupby("n_samples").size()
        best = max(int(n) for n, c in counts.items() if c == counts.max())
        keep.append(rows[rows["n_samples"] == best])
    out = pd.concat(keep)
    return out.drop_duplicates([c for c in ("index", "sigma", "method") if c in out])


def class_column(frame: pd.DataFrame, by: str | None) -> str:
    """The column classes are read from: ``by``, or by default ``label`` (the true class) where
    present, else ``target`` (an Estimate knows only the class it measured).

    Raises:
        OptionError: (field ``by``) the column is missing.
    """
    if by is None:
        for column in ("label", "target", "prediction"):
            if column in frame:
                return column
        raise OptionError("the results have no label, target or prediction column", field="by")
    if by not in frame:
        raise OptionError(
            f"the results have no {by!r} column (columns: {', '.join(map(str, frame.columns))})", field="by"
        )
    return by


def wide(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (index, sigma): ``p_<method>`` for every method (principal counts; NaN where
    not scored), and Monte Carlo's ``mc_ci_low``, ``mc_ci_high`` where the frame has them."""
    rows = principal(frame)
    keys = [c for c in ("index", "sigma") if c in rows]
    if "sigma" in rows and rows["sigma"].isna().all():
        keys = ["index"]
    out = rows.pivot_table(index=keys, columns="method", values="p", aggfunc="first", dropna=False)
    out.columns = [f"p_{m}" for m in out.columns]
    if "ci_low" in rows and "ci_high" in rows:
        mc = rows[rows["method"] == "mc"].set_index(keys)
        out["mc_ci_low"] = mc["ci_low"]
        out["mc_ci_high"] = mc["ci_high"]
    return out.reset_index()
