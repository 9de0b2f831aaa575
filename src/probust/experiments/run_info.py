"""One scored model read back from its results folder: the :class:`Run` record.

A *run* is one results folder written by ``probust estimate`` / :func:`probust.run.run_estimate`
(``config.json`` + Parquet rows). Its metadata (data set, architecture, training settings) comes
from the typed configuration (:class:`probust.run.ResultsConfig`) and the checkpoint's metadata
recorded there; its rows come in the shapes the experiments need.

Rows of one method may exist at several sample counts (a convergence study next to the main
grid). Wherever an experiment needs one value per (point, sigma, method), it uses the method's
*principal* sample count: the count with the most rows (ties: the larger count).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probust.experiments.style import lambda_label
from probust.run import ResultsConfig

__all__ = ["Run"]

_DATASET_LABELS = {
    "fashion-mnist": "Fashion-MNIST",
    "mnist": "MNIST",
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "digits": "digits",
}
_ARCH_LABELS = {"linear": "linear", "cnn": "CNN", "resnet18": "ResNet18", "vit": "ViT"}
#: Training settings that must agree for models to form one robust family (all but lambda); a
#: family also shares its extra loss (none, for the gradient-norm family).
_FAMILY_KEYS = ("dataset", "arch", "epochs", "lr", "batch_size", "weight_decay", "schedule", "train_size", "seed")


@dataclass
class Run:
    """One scored model: its results table and configuration.

    Attributes:
        path: the results folder.
        config: its ``config.json`` as written (read it typed with :attr:`results_config`).
        table: every row (see :func:`probust.run.read_results`).
        label: a short human name, e.g. "Fashion-MNIST CNN, λ=0.001" (unique in a :class:`Results`).
    """

    path: Path
    config: dict[str, Any]
    table: pd.DataFrame
    label: str = ""
    _wide_cache: dict = field(default_factory=dict, repr=False)

    # -- what the model is -------------------------------------------------------------------

    @cached_property
    def results_config(self) -> ResultsConfig:
        """:attr:`config`, typed."""
        return ResultsConfig.from_dict(self.config)

    @property
    def meta(self) -> dict[str, Any]:
        """The checkpoint's metadata (a copy; {} when there is none)."""
        return self.results_config.model_meta

    @property
    def dataset(self) -> str:
        """The data set the model was trained on, else the one scored ("?" when neither is known)."""
        return str(self.meta.get("dataset") or self.results_config.dataset or "?")

    @property
    def arch(self) -> str:
        """The model's name: the architecture a probust checkpoint records, else the factory
        function (``torchvision.models:resnet18`` -> "resnet18"), the module's class (a module
        passed in Python, a Hugging Face model), or the model file's stem ("?" when none is known)."""
        if self.meta.get("arch"):
            return str(self.meta["arch"])
        model = self.results_config.model
        source = model.source or ""
        if source.startswith("factory:"):
            return source.rsplit(":", 1)[-1].rsplit(".", 1)[-1] or "?"
        if model.class_name:
            return model.class_name.rsplit(".", 1)[-1]
        if model.file:
            return Path(model.file).stem or "?"
        return "?"

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

        From the checkpoint's ``extra_loss_config`` (written by ``probust.training.train``).
        """
        cfg = self.meta.get("extra_loss_config")
        return dict(cfg) if isinstance(cfg, dict) and cfg.get("name") == "RobustLoss" else None

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
        names = self.results_config.classes or self.meta.get("classes") or []
        n = int(self.table["label"].max()) + 1 if len(self.table) else 0
        names = [str(c) for c in names]
        return names if len(names) >= n else names + [str(i) for i in range(len(names), n)]

    @property
    def name(self) -> str:
        """A file-name-safe identifier (the folder name)."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.path.name) or "run"

    @property
    def model_source(self) -> str | None:
        """The model file scored (None for a module passed in Python)."""
        return self.results_config.model.file

    @property
    def seed(self) -> int:
        """The seed of the run's random streams."""
        return self.results_config.seed

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
        ``clean_softmax``), ``p_<method>`` for every method (NaN where not scored), and for
        Monte Carlo ``mc_ci_low``, ``mc_ci_high``, ``mc_stderr``, ``mc_n``.
        """
        if "wide" in self._wide_cache:
            w = self._wide_cache["wide"]
            return w[w["index"].isin(self.core_indices)] if core else w
        t = self.table
        base = t.drop_duplicates(["index", "sigma"])[["index", "sigma", "label", "prediction", "clean_softmax"]]
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
            soft = per_point["clean_softmax"].first()
        out = out.reset_index()
        out["softmax"] = out["index"].map(soft).fillna(out["clean_softmax"])
        out = out.drop(columns="clean_softmax")
        self._wide_cache["wide"] = out
        return out[out["index"].isin(self.core_indices)] if core else out
