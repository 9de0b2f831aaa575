"""Finding results folders and reading them for the experiments: :func:`load_results` gives a :class:`Results`.

:func:`load_results` finds every run (one results folder written by ``probust estimate``) under
a folder; the experiments then ask the :class:`Results` for the runs they need (standard
models, the robust family, the primary model) and each :class:`~probust.experiments.run_info.Run`
for its rows in the shapes they need. Folders written by ``probust certify`` are found too and
kept apart (:attr:`Results.certified`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from probust.experiments.run_info import Run
from probust.run import is_results_folder as _is_folder
from probust.run import read_config, read_results
from probust.run.certify import FORMAT as CERTIFY_FORMAT
from probust.run.certify import read_certified

__all__ = ["Results", "find_runs", "load_results"]


def find_runs(root: str | os.PathLike, max_depth: int = 4, format: str | None = None) -> list[Path]:
    """Every results folder at or under ``root`` (sorted by path), at most ``max_depth`` deep:
    ``probust estimate``'s, or those of ``format`` (e.g. ``"probust.certify"``)."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no such folder: {root}")

    def is_results_folder(path: Path) -> bool:
        return _is_folder(path) if format is None else _is_folder(path, format)

    if is_results_folder(root):
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "parts")
        if depth > max_depth:
            dirnames[:] = []
            continue
        here = Path(dirpath)
        if here != root and is_results_folder(here):
            found.append(here)
            dirnames[:] = []
    return sorted(found)


@dataclass
class Results:
    """Every run found under a folder, with helpers to pick the ones an experiment needs."""

    root: Path
    runs: list[Run]
    #: The ``probust certify`` folders: each a Run whose ``table`` is
    #: :func:`probust.run.certify.read_certified`'s (not an estimate table).
    certified: list[Run] = field(default_factory=list)

    def __iter__(self):
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def standard(self) -> list[Run]:
        """Runs of models trained without regularisation (lambda 0 or unknown, no extra loss
        such as a RobustLoss)."""
        return [r for r in self.runs if r.is_standard]

    def robust_loss_runs(self) -> list[Run]:
        """Runs of models trained with a :class:`~probust.RobustLoss`."""
        return [r for r in self.runs if r.robust_loss is not None]

    def families(self) -> list[list[Run]]:
        """Groups of runs of the same data set, architecture and training recipe that differ
        only in lambda (at least two lambdas), each sorted by lambda. Models trained with an
        extra loss (a RobustLoss) only form families with models trained with the same loss."""
        groups: dict[tuple, list[Run]] = {}
        for r in self.runs:
            if r.grad_reg is None:
                continue
            groups.setdefault((*r.recipe, r.extra_loss), []).append(r)
        out = []
        for runs in groups.values():
            by_lam: dict[float, Run] = {}
            for r in sorted(runs, key=lambda r: (r.grad_reg, str(r.path))):
                by_lam.setdefault(float(cast(float, r.grad_reg)), r)  # not None: filtered above
            if len(by_lam) >= 2:
                out.append([by_lam[k] for k in sorted(by_lam)])
        return sorted(out, key=lambda f: f[0].label)

    def primary(self) -> Run | None:
        """The run the single-model experiments use: among the standard runs with softmax and
        MMSE rows, the one with the most scored points, then the best test accuracy."""
        candidates = [r for r in self.standard() if r.has("mmse")] or self.standard() or self.runs
        if not candidates:
            return None

        def key(r: Run):
            acc = r.test_accuracy if r.test_accuracy is not None else -1.0
            return (r.table["index"].nunique(), acc, -len(str(r.path)))

        return max(candidates, key=key)

    def paper_setting(self) -> bool:
        """Whether these are results of the paper's kind: every run scores a model trained by
        probust (its checkpoint records an architecture) on a built-in data set, as ``probust
        demo`` makes. The experiments that time estimators or train models run on such results by
        default, not on one's own model or data (see :func:`probust.report.build_report`)."""
        from probust.data import is_builtin

        runs = [*self.runs, *self.certified]
        return bool(runs) and all(bool(r.meta.get("arch")) and is_builtin(r.dataset) for r in runs)

    def by_label(self, label: str) -> Run:
        for r in self.runs:
            if r.label == label or r.name == label:
                return r
        raise KeyError(f"no run named {label!r}; runs: {', '.join(r.label for r in self.runs)}")


def load_results(path: str | os.PathLike | list, *, max_depth: int = 4) -> Results:
    """Every results folder at or under ``path`` (or in a list of folders), read into memory.

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no results folder.
    """
    if isinstance(path, (list, tuple)):
        given = [Path(p) for p in path]
        certify_paths = [p for p in given if _is_folder(p, CERTIFY_FORMAT)]
        paths = [p for p in given if p not in certify_paths]
    else:
        paths = find_runs(path, max_depth)
        certify_paths = find_runs(path, max_depth, CERTIFY_FORMAT)
    everything = paths + certify_paths
    root = (
        Path(path)
        if not isinstance(path, (list, tuple))
        else (Path(os.path.commonpath([str(p) for p in everything])) if everything else Path("."))
    )
    if not everything:
        raise FileNotFoundError(f"no probust results folder (config.json + Parquet rows) at or under {path}")
    certified = []
    for p in certify_paths:
        table = read_certified(p)
        if not table.empty:
            certified.append(Run(path=p, config=read_config(p) or {}, table=table))
    runs = []
    for p in paths:
        table = read_results(p)
        if table.empty:
            continue
        config = read_config(p)
        if config is None:
            raise FileNotFoundError(f"no config.json in {p}")
        runs.append(Run(path=p, config=config, table=table))
    if not runs and not certified:
        raise FileNotFoundError(f"the results folders under {path} hold no rows yet")
    # sort: data set, architecture, extra loss (none first), lambda, then path
    runs.sort(
        key=lambda r: (
            r.dataset,
            r.arch != "linear",
            r.arch,
            r.extra_loss is not None,
            r.robust_loss if r.robust_loss is not None else math.inf,
            r.extra_loss or "",
            r.grad_reg if r.grad_reg is not None else math.inf,
            str(r.path),
        )
    )
    for group in (runs, certified):
        labels = [r.default_label() for r in group]
        for r, label in zip(group, labels):
            r.label = label if labels.count(label) == 1 else f"{label} ({r.path.name})"
    return Results(root=root, runs=runs, certified=certified)
