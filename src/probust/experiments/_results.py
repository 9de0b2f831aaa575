"""Reading results folders for the experiments: one :class:`Run` per scored model.

A *run* is one results folder written by ``probust estimate`` / :func:`probust.runner.run_estimate`
(``config.json`` + Parquet rows). :func:`load_results` finds every run under a folder; the
experiments then ask a :class:`Results` for the runs they need (standard models, the robust
family, the primary model) and a :class:`Run` for its rows in the shapes they need.

Rows of one method may exist at several sample counts (a convergence study next to the main
grid). Wherever an experiment needs one value per (point, sigma, method), it uses the method's
*principal* sample count: the count with the most rows (ties: the larger count).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probust.experiments._style import lambda_label
from probust.store import read_results

__all__ = ["Results", "Run", "find_runs", "load_results"]

_FORMAT = "probust.results"
_DATASET_LABELS = {
    "fashion-mnist": "Fashion-MNIST",
    "mnist": "MNIST",
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "digits": "digits",
}
_ARCH_LABELS = {"linear": "linear", "cnn": "CNN", "resnet18": "ResNet18", "vit": "ViT"}
# Training settings that must agree for models to form one robust family (all but lambda); a
# family also shares its extra loss (none, for the gradient-norm family).
_FAMILY_KEYS = ("dataset", "arch", "epochs", "lr", "batch_size", "weight_decay", "schedule", "train_size", "seed")
_ROBUST_REPR = re.compile(r"^RobustLoss\((.*)\)$", re.S)


def _number(text: str, *, as_float: bool) -> float | int | str:
    """A setting from a RobustLoss repr: an int where it reads as one (unless ``as_float``),
    else a float, else the text itself (e.g. a non-scalar noise's description)."""
    for kind in ((float,) if as_float else (int, float)):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _is_run(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("format") == _FORMAT
    except (OSError, ValueError):
        return False


def find_runs(root: str | os.PathLike, max_depth: int = 4) -> list[Path]:
    """Every results folder at or under ``root`` (sorted by path), at most ``max_depth`` deep."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no such folder: {root}")
    if _is_run(root):
        return [root]
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "parts")
        if depth > max_depth:
            dirnames[:] = []
            continue
        here = Path(dirpath)
        if here != root and _is_run(here):
            found.append(here)
            dirnames[:] = []
    return sorted(found)


@dataclass
class Run:
    """One scored model: its results table and configuration.

    Attributes:
        path: the results folder.
        config: its ``config.json``.
        table: every row (see :func:`probust.store.read_results`).
        label: a short human name, e.g. "Fashion-MNIST CNN, λ=0.001" (unique in a :class:`Results`).
    """

    path: Path
    config: dict[str, Any]
    table: pd.DataFrame
    label: str = ""
    _wide_cache: dict = field(default_factory=dict, repr=False)

    # -- what the model is -------------------------------------------------------------------

    @property
    def meta(self) -> dict[str, Any]:
        return dict((self.config.get("model") or {}).get("meta") or {})

    @property
    def dataset(self) -> str:
        return str(self.meta.get("dataset") or self.config.get("run", {}).get("dataset") or "?")

    @property
    def arch(self) -> str:
        return str(self.meta.get("arch") or (self.config.get("model") or {}).get("class", "?").rsplit(".", 1)[-1])

    @property
    def grad_reg(self) -> float | None:
        value = self.meta.get("grad_reg")
        return None if value is None else float(value)

    @property
    def extra_loss(self) -> str | None:
        """The name of the extra training loss the model was trained with (None: none)."""
        value = self.meta.get("extra_loss")
        return str(value) if value else None

    @property
    def robust_loss_config(self) -> dict[str, Any] | None:
        """The settings of the :class:`~probust.RobustLoss` the model was trained with, or None.

        From the checkpoint's ``extra_loss_config`` (written by ``probust.train``), else parsed
        from the ``extra_loss`` name (``RobustLoss(sigma=0.3, mu=1, ...)``) of older checkpoints.
        """
        cfg = self.meta.get("extra_loss_config")
        if isinstance(cfg, dict) and cfg.get("name") == "RobustLoss":
            return dict(cfg)
        m = _ROBUST_REPR.match(self.extra_loss or "")
        if m is None:
            return None
        out: dict[str, Any] = {"name": "RobustLoss"}
        for key, value in re.findall(r"(\w+)=('[^']*'|[^,]+)", m.group(1)):
            value = value.strip()
            if value.startswith("'"):
                out[key] = value.strip("'")
                continue
            out[key] = None if value == "None" else _number(value, as_float=key in ("mu", "sigma"))
        if not isinstance(out.get("sigma"), float):
            out["sigma"] = None
        return out if isinstance(out.get("mu"), float) else None

    @property
    def robust_loss(self) -> float | None:
        """mu of the RobustLoss the model was trained with, or None (no robust loss)."""
        cfg = self.robust_loss_config
        return None if cfg is None else float(cfg["mu"])

    @property
    def robust_sigma(self) -> float | None:
        """sigma of the RobustLoss the model was trained with (None: no robust loss, or noise
        that is not one scalar sigma)."""
        cfg = self.robust_loss_config
        return None if cfg is None or cfg.get("sigma") is None else float(cfg["sigma"])

    @property
    def is_standard(self) -> bool:
        """Trained without regularisation: lambda 0 (or unknown) and no extra loss."""
        return not self.grad_reg and self.extra_loss is None

    @property
    def recipe(self) -> tuple[str, ...]:
        """The training settings a family shares: all but lambda (and the extra loss)."""
        return tuple(json.dumps(self.meta.get(k), sort_keys=True) for k in _FAMILY_KEYS)

    @property
    def test_accuracy(self) -> float | None:
        value = self.meta.get("test_accuracy")
        return None if value is None else float(value)

    @property
    def classes(self) -> list[str]:
        names = (self.config.get("data") or {}).get("classes") or self.meta.get("classes") or []
        n = int(self.table["label"].max()) + 1 if len(self.table) else 0
        names = [str(c) for c in names]
        return names if len(names) >= n else names + [str(i) for i in range(len(names), n)]

    @property
    def name(self) -> str:
        """A file-name-safe identifier (the folder name)."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.path.name) or "run"

    @property
    def model_source(self) -> str | None:
        src = (self.config.get("model") or {}).get("source")
        return src if src and src != "nn.Module" else None

    @property
    def seed(self) -> int:
        return int(self.config.get("run", {}).get("seed", 0))

    def default_label(self) -> str:
        ds = _DATASET_LABELS.get(self.dataset, self.dataset)
        arch = _ARCH_LABELS.get(self.arch, self.arch)
        label = f"{ds} {arch}" + (f", {lambda_label(self.grad_reg)}" if self.grad_reg else "")
        if self.robust_loss is not None:
            sigma = f" (σ={self.robust_sigma:g})" if self.robust_sigma is not None else ""
            label += f", robust μ={self.robust_loss:g}{sigma}"
        elif self.extra_loss is not None:
            label += f", {self.extra_loss.split('(')[0]}"
        return label

    # -- rows --------------------------------------------------------------------------------

    @cached_property
    def methods(self) -> list[str]:
        return sorted(self.table["method"].unique().tolist())

    @cached_property
    def sigmas(self) -> list[float]:
        return sorted(float(s) for s in self.table["sigma"].unique())

    def has(self, method: str) -> bool:
        return method in self.methods

    def sample_counts(self, method: str) -> list[int]:
        return sorted(int(n) for n in self.table.loc[self.table["method"] == method, "n_samples"].unique())

    def principal_n(self, method: str) -> int | None:
        """The sample count with the most rows for ``method`` (ties: the larger); None if absent."""
        rows = self.table[self.table["method"] == method]
        if rows.empty:
            return None
        counts = rows.groupby("n_samples").size()
        best = counts.max()
        return int(max(n for n, c in counts.items() if c == best))

    def rows(self, method: str, n_samples: int | None = None) -> pd.DataFrame:
        """Rows of ``method`` at ``n_samples`` (default its principal count)."""
        n = self.principal_n(method) if n_samples is None else n_samples
        t = self.table
        return t[(t["method"] == method) & (t["n_samples"] == n)]

    @cached_property
    def core_indices(self) -> np.ndarray:
        """The points scored at every sigma of the run (sorted): the set on which per-sigma
        comparisons are made, so that a larger pool scored at one sigma does not change them."""
        per_sigma = self.table.groupby("sigma")["index"].unique()
        common = None
        for values in per_sigma:
            common = set(values) if common is None else common & set(values)
        return np.array(sorted(common or ()), dtype=np.int64)

    def wide(self, core: bool = False) -> pd.DataFrame:
        """One row per (index, sigma) present for any method at its principal count.

        With ``core=True`` only the points scored at every sigma (:attr:`core_indices`).

        Columns: index, sigma, label, prediction, softmax (the clean prediction's softmax
        probability: the ``softmax`` method's value where scored, else the table's
        ``confidence``), ``p_<method>`` for every method (NaN where not scored), and for
        Monte Carlo ``mc_ci_low``, ``mc_ci_high``, ``mc_stderr``, ``mc_n``.
        """
        if "wide" in self._wide_cache:
            w = self._wide_cache["wide"]
            return w[w["index"].isin(self.core_indices)] if core else w
        t = self.table
        base = t.drop_duplicates(["index", "sigma"])[["index", "sigma", "label", "prediction", "confidence"]]
        out = base.set_index(["index", "sigma"]).sort_index()
        for method in self.methods:
            r = self.rows(method).set_index(["index", "sigma"])
            out[f"p_{method}"] = r["p"]
            if method == "mc":
                out["mc_ci_low"] = r["ci_low"]
                out["mc_ci_high"] = r["ci_high"]
                out["mc_stderr"] = r["stderr"]
                out["mc_n"] = r["n_samples"]
        # softmax does not depend on sigma: take it per point, whichever sigma it was stored at
        per_point = out.reset_index().groupby("index")
        if "p_softmax" in out:
            soft = per_point["p_softmax"].first()
        else:
            soft = per_point["confidence"].first()
        out = out.reset_index()
        out["softmax"] = out["index"].map(soft).fillna(out["confidence"])
        out = out.drop(columns="confidence")
        self._wide_cache["wide"] = out
        return out[out["index"].isin(self.core_indices)] if core else out


@dataclass
class Results:
    """Every run found under a folder, with helpers to pick the ones an experiment needs."""

    root: Path
    runs: list[Run]

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
                by_lam.setdefault(float(r.grad_reg), r)
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
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else find_runs(path, max_depth)
    root = Path(path) if not isinstance(path, (list, tuple)) else (Path(os.path.commonpath([str(p) for p in paths])) if paths else Path("."))
    if not paths:
        raise FileNotFoundError(f"no probust results folder (config.json + Parquet rows) at or under {path}")
    runs = []
    for p in paths:
        table = read_results(p)
        if table.empty:
            continue
        config = json.loads((p / "config.json").read_text())
        runs.append(Run(path=p, config=config, table=table))
    if not runs:
        raise FileNotFoundError(f"the results folders under {path} hold no rows yet")
    # sort: data set, architecture, extra loss (none first), lambda, then path
    runs.sort(
        key=lambda r: (
            r.dataset, r.arch != "linear", r.arch, r.extra_loss is not None,
            r.robust_loss if r.robust_loss is not None else math.inf, r.extra_loss or "",
            r.grad_reg if r.grad_reg is not None else math.inf, str(r.path),
        )
    )  # fmt: skip
    labels = [r.default_label() for r in runs]
    for r, label in zip(runs, labels):
        r.label = label if labels.count(label) == 1 else f"{label} ({r.path.name})"
    return Results(root=root, runs=runs)


def finite(values) -> np.ndarray:
    """float64 array of the finite entries of ``values``."""
    a = np.asarray(values, dtype=np.float64)
    return a[np.isfinite(a)]


def load_dataset(run: Run):
    """The data set a run scored (``probust.data.load`` of its name and split), checked against
    the run: same size, and the labels of the scored points match.

    Raises:
        ExperimentSkipped: the data set cannot be loaded here or is not the one scored.
    """
    from probust import data as pdata
    from probust.experiments._base import ExperimentSkipped

    cfg = run.config.get("run", {})
    name, split = cfg.get("dataset"), cfg.get("split", "test")
    try:
        ds = pdata.load(name, split)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExperimentSkipped(f"the data set {name!r} ({split}) of {run.label} cannot be loaded here: {first}") from None
    if cfg.get("data_size") is not None and len(ds) != int(cfg["data_size"]):
        raise ExperimentSkipped(f"the data set {name!r} here has {len(ds)} points, the results were made on {cfg['data_size']}")
    labels = run.table.drop_duplicates("index")
    targets = ds.targets if hasattr(ds, "targets") else None
    if targets is not None:
        idx = torch_index(labels["index"].to_numpy())
        if not np.array_equal(targets[idx].numpy(), labels["label"].to_numpy()):
            raise ExperimentSkipped(f"the labels of {name!r} here differ from those in the results of {run.label}")
    return ds


def torch_index(values):
    import torch

    return torch.from_numpy(np.array(values, dtype=np.int64))


def images(ds, indices) -> np.ndarray:
    """float32 [B, C, H, W] images in [0, 1] of the given points."""
    import torch

    idx = torch_index(indices)
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(idx).tensors()[0].numpy()
    return torch.stack([ds[int(i)][0] for i in idx]).numpy()
