"""Experiment 3: runtime of every estimator, serial and batched, on this machine.

The paper's runtime tables: each estimator computes p_robust at sigma = 0.1 for a few points,
with the paper's sample counts (Monte Carlo n = 100, 1,000, 10,000; MMSE N = 1, 5, 10, 25, 50,
100), once point by point (batches of one: "serial") and once on all points in one call
("batched"), and the speed-up over Monte Carlo at n = 10,000 (the count at which the paper
finds it converged) in the same mode. This is a measurement, so it times the estimators
directly on the model of a results folder; its numbers depend on the machine and its load.

Outputs: ``runtime.csv``, one row per (estimator, sample count, mode) (see :func:`measure`), and
``runtime_paper_layout.csv``, the modes side by side; one figure.
"""

from __future__ import annotations

import html
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from probust.estimators import PAPER_METHODS
from probust.execution import peak_memory
from probust.experiments import style
from probust.experiments.base import Experiment, ExperimentSkipped, Output, Shown
from probust.experiments.common import fmt
from probust.experiments.datasets import open_dataset
from probust.experiments.run_info import Run
from probust.experiments.runs import Results

NAME = "runtime"
TITLE = "3. Runtime of the estimators (this machine)"
DESCRIPTION = (
    "Wall time of each estimator computing p<sub>σ</sub> for the same points, point by point (serial: batches of one) "
    "and in one call (batched), with the paper's sample counts, and the speed-up over Monte Carlo at n = 10,000 in the "
    "same mode. Times are measured now, on this machine (the settings list the CPU, device and threads); they are "
    "the one result of the report that is not reproducible to the digit."
)
PAPER_MC_COUNTS = (100, 1_000, 10_000)
PAPER_MMSE_COUNTS = (1, 5, 10, 25, 50, 100)
MODES = ("serial", "batched")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _grid(methods: Sequence[str], mc_counts: Sequence[int], mmse_counts: Sequence[int]) -> list[tuple[str, int | None]]:
    grid: list[tuple[str, int | None]] = []
    for method in methods:
        if method in ("mc", "mc_cv", "mc_is"):
            grid += [(method, int(n)) for n in mc_counts]
        elif method.startswith("mmse"):
            grid += [(method, int(n)) for n in mmse_counts]
        else:
            grid.append((method, None))
    return grid


def _estimator(method: str, model, sigma: float, n: int | None, seed: int):
    from probust.estimators import make_estimator

    if method == "softmax":
        return make_estimator(method, model, None, seed=seed)
    return make_estimator(method, model, sigma, n_samples=n, seed=seed)


def measure(
    model: torch.nn.Module,
    x: torch.Tensor,
    sigma: float = 0.1,
    *,
    mc_counts: Sequence[int] = PAPER_MC_COUNTS,
    mmse_counts: Sequence[int] = PAPER_MMSE_COUNTS,
    modes: Sequence[str] = MODES,
    methods: Sequence[str] = PAPER_METHODS,
    seed: int = 0,
) -> pd.DataFrame:
    """Time every estimator on the points ``x``.

    Args:
        model: the classifier.
        x: [P, *S] points (on the model's device).
        sigma: noise level.
        mc_counts, mmse_counts: sample counts to time (Monte Carlo variants use ``mc_counts``).
        methods: the estimators (default: the paper's six).
        modes: "serial" (one call per point) and/or "batched" (one call for all).
        seed: the estimators' seed.

    Returns:
        One row per (method, n_samples, mode): points, seconds (wall, total), seconds_per_point,
        cpu_seconds (this process), peak_mb (memory the call added at its peak: the process's
        resident set on a CPU, the allocator's on a GPU; NaN where unknown), mean_p.
    """
    rows = []
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for method, n in _grid(methods, mc_counts, mmse_counts):
        est = _estimator(method, model, sigma, n, seed)
        # warm-up on one point with the smallest count: first-call costs are not the estimator's
        _estimator(method, model, sigma, None if n is None else min(n, 10), seed)(x[:1])
        for mode in modes:
            if mode not in MODES:
                raise ValueError(f"mode must be serial or batched, got {mode!r}")
            with peak_memory(x.device) as peak:
                sync()
                wall, cpu = time.perf_counter(), time.process_time()
                if mode == "serial":
                    p = torch.cat([est(x[i : i + 1], index_offset=i).p for i in range(x.shape[0])])
                else:
                    p = est(x).p
                sync()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rows.append(
                {
                    "method": method,
                    "n_samples": 0 if n is None else n,
                    "mode": mode,
                    "points": int(x.shape[0]),
                    "seconds": wall,
                    "seconds_per_point": wall / x.shape[0],
                    "cpu_seconds": cpu,
                    "peak_mb": np.nan if peak.bytes is None else peak.bytes / 2**20,
                    "mean_p": float(p.mean()),
                }
            )
    table = pd.DataFrame(rows)
    return add_speedup(table)


def add_speedup(table: pd.DataFrame, reference_n: int = 10_000) -> pd.DataFrame:
    """Add ``speedup_vs_mc``: Monte Carlo's time at ``reference_n`` (or its largest n timed)
    divided by each row's time, in the same mode."""
    table = table.copy()
    mc = table[table["method"] == "mc"]
    ref_n = reference_n if (mc["n_samples"] == reference_n).any() else (int(mc["n_samples"].max()) if len(mc) else None)
    table["speedup_reference"] = f"mc n={ref_n}" if ref_n else ""
    speed = []
    for row in table.itertuples():
        ref = mc[(mc["n_samples"] == ref_n) & (mc["mode"] == row.mode)]["seconds"]
        speed.append(float(ref.iloc[0] / row.seconds) if len(ref) and row.seconds > 0 else np.nan)
    table["speedup_vs_mc"] = speed
    return table


def paper_layout(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the paper prints it: one row per (estimator, n), modes side by side."""
    wide = table.pivot_table(
        index=["method", "n_samples"], columns="mode", values=["seconds", "speedup_vs_mc", "peak_mb"], aggfunc="first"
    )
    wide.columns = [f"{a}_{b}" for a, b in wide.columns]
    wide = wide.reset_index()
    order = {m: i for i, m in enumerate(style.METHOD_ORDER)}
    wide["_o"] = wide["method"].map(order)
    return wide.sort_values(["_o", "n_samples"]).drop(columns="_o").reset_index(drop=True)


def _plot(table: pd.DataFrame, stem: Path, title: str) -> Path:
    wide = paper_layout(table)
    labels = [
        style.method_label(r.method)
        + ("" if r.n_samples == 0 else f"  {'n' if r.method == 'mc' else 'N'}={int(r.n_samples):,}")
        for r in wide.itertuples()
    ]
    y = np.arange(len(wide))[::-1]
    modes = [m for m in MODES if f"seconds_{m}" in wide]
    with style.style_context():
        fig, axes = style.new_figure(1, 1, width=7.6, height=0.32 * len(wide) + 1.4)
        ax = axes[0, 0]
        h = 0.38
        for k, mode in enumerate(modes):
            points = int(table["points"].iloc[0])
            values = wide[f"seconds_{mode}"] / points
            ax.barh(
                y + (h / 2 if k == 0 else -h / 2) * (len(modes) > 1),
                values,
                height=h,
                color=[style.method_color(m) for m in wide["method"]],
                alpha=1.0 if mode == "batched" else 0.45,
                hatch="" if mode == "batched" else "///",
                edgecolor="white",
                linewidth=0.4,
                label=mode,
            )
        ax.set_yticks(y)
        ax.set_yticklabels(labels)
        ax.set_xscale("log")
        ax.set_xlabel("wall time per point (seconds, log scale)")
        ax.set_title(title)
        from matplotlib.patches import Patch

        ax.legend(
            handles=[
                Patch(facecolor="#888888", alpha=0.45, hatch="///", label="serial (batch of 1)"),
                Patch(facecolor="#888888", label="batched"),
            ],
            loc="lower right",
            frameon=False,
        )
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.grid(False, axis="y")
        fig.tight_layout()
        return style.save_figure(fig, stem)[0]


def _reading(table: pd.DataFrame) -> list[str]:
    out = []
    for mode in MODES:
        t = table[table["mode"] == mode]
        if t.empty:
            continue
        ref = t["speedup_reference"].iloc[0]
        pick = []
        for method, n in (("taylor", 0), ("taylor_mvs", 0), ("mmse", 5), ("mmse_mvs", 5), ("softmax", 0)):
            r = t[(t["method"] == method) & (t["n_samples"] == n)]
            if len(r):
                pick.append(
                    f"{style.method_html(method)}{'' if n == 0 else f' (N={n})'} {fmt(r['speedup_vs_mc'].iloc[0])}×"
                )
        mc = t[(t["method"] == "mc")].sort_values("n_samples")
        if len(mc) and pick:
            out.append(
                f"{mode.capitalize()}: {ref.replace('mc', 'p<sup>mc</sup>')} takes {fmt(mc['seconds_per_point'].iloc[-1])} s per point; "
                f"speed-ups over it: " + ", ".join(pick) + "."
            )
    batched = table[(table["mode"] == "batched") & table["peak_mb"].notna()]
    mc_peak = batched[batched["method"] == "mc"].sort_values("n_samples")["peak_mb"]
    mmse_peak = batched[(batched["method"] == "mmse") & (batched["n_samples"] == 5)]["peak_mb"]
    if len(mc_peak) and len(mmse_peak):
        out.append(
            f"Peak memory added by one batched call: p<sup>mc</sup> {fmt(mc_peak.iloc[-1])} MB, "
            f"{style.method_html('mmse')} (N=5) {fmt(mmse_peak.iloc[0])} MB; both bounded by the estimators' "
            "memory budget (half the free memory by default), which sets their row chunks."
        )
    both = table.pivot_table(index=["method", "n_samples"], columns="mode", values="seconds", aggfunc="first")
    if set(MODES) <= set(both.columns):
        gain = (both["serial"] / both["batched"]).dropna()
        if len(gain):
            out.append(
                f"Serial time divided by batched time ranges from {fmt(gain.min())} to {fmt(gain.max())} "
                f"(largest for {style.METHOD_HTML.get(gain.idxmax()[0], gain.idxmax()[0])}"
                f"{'' if gain.idxmax()[1] == 0 else f' at n={int(gain.idxmax()[1]):,}'})."
            )
    return out


class Runtime(Experiment):
    name = NAME
    title = TITLE
    description = DESCRIPTION
    measuring = True  # it times the estimators on this machine

    def run(
        self,
        results: Results,
        out: str | Path,
        *,
        model: str | None = None,
        points: int = 5,
        sigma: float = 0.1,
        mc_counts: Sequence[int] = PAPER_MC_COUNTS,
        mmse_counts: Sequence[int] = PAPER_MMSE_COUNTS,
        modes: Sequence[str] = MODES,
        methods: Sequence[str] = PAPER_METHODS,
        device: str = "cpu",
    ) -> Output:
        """Time the estimators on the model of one run (default: the primary run).

        Args:
            results: the runs; the chosen run's model file and data set must still be on disk.
            out: output folder.
            model: label of the run whose model is timed.
            points: how many of its scored points to time on (the paper: 50).
            sigma: the noise level (the paper: 0.1).
            mc_counts, mmse_counts, modes, methods: see :func:`measure`.
            device: where to run.
        """
        out = Path(out)
        target: Run | None = results.by_label(model) if model else results.primary()
        if target is None or target.model_source is None or not Path(target.model_source).is_file():
            raise ExperimentSkipped("the model file of the results is not on this machine, so nothing can be timed")
        from probust import models as pmodels

        net, _ = pmodels.load_model(target.model_source, map_location=device)
        try:
            ds = open_dataset(target)  # a name or file that is gone fails as "not found"
        except Exception as exc:  # the data set is gone: say so rather than fail the report
            raise ExperimentSkipped(
                f"the data set of the results cannot be loaded ({str(exc).splitlines()[0]})"
            ) from None
        indices = np.sort(target.table["index"].unique())[:points]
        x = torch.stack([ds[int(i)][0] for i in indices]).to(device)
        table = measure(
            net, x, sigma, mc_counts=mc_counts, mmse_counts=mmse_counts, modes=modes, methods=methods, seed=target.seed
        )
        table.insert(0, "model", target.label)
        env = {
            "cpu": cpu_name(),
            "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": device,
            "torch": torch.__version__,
            "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        }
        title = f"{target.label}: σ={sigma:g}, {len(indices)} points, {env['torch_threads']} thread(s)"
        fig = _plot(table, out / NAME, title)
        paper = paper_layout(table)
        reading = _reading(table)
        reading.append(
            f"Measured on {env['cpu']} ({env['logical_cpus']} logical CPUs, torch using {env['torch_threads']} thread(s), "
            f"1-minute load average {env['load_average_1min']} when it ended); the paper timed 50 points of a CIFAR-10 ResNet18."
        )
        return self.output(
            out,
            tables={NAME: table, "paper_layout": paper},
            figures=[fig],
            reading=reading,
            settings={
                "model": target.label,
                "points": len(indices),
                "sigma": sigma,
                "mc_counts": list(mc_counts),
                "mmse_counts": list(mmse_counts),
                **env,
            },
        )

    def display(self, output: Output) -> list[Shown]:
        view = output.tables["paper_layout"].assign(method=lambda f: "p^" + f["method"])
        return [
            (
                "Wall time for all timed points (seconds), speed-up over Monte Carlo in the same mode, and the peak memory one call added (MB)",
                view,
            )
        ]

    def summary(self, output: Output, results: Results) -> list[Shown]:
        t = output.table
        keep = t[
            ((t["method"] == "mc") & (t["n_samples"] == t[t["method"] == "mc"]["n_samples"].max()))
            | t["method"].isin(["taylor", "taylor_mvs", "softmax"])
            | (t["method"].str.startswith("mmse") & (t["n_samples"] == 5))
        ]
        view = keep.pivot_table(
            index=["method", "n_samples"], columns="mode", values="speedup_vs_mc", aggfunc="first"
        ).reset_index()
        view = view.iloc[
            np.argsort(
                [style.METHOD_ORDER.index(m) if m in style.METHOD_ORDER else 99 for m in view["method"]], kind="stable"
            )
        ]
        view.columns = [f"speed-up vs MC, {c}" if c in ("serial", "batched") else c for c in view.columns]
        view["method"] = "p^" + view["method"]
        return [
            (
                f"Speed-up over Monte Carlo ({html.escape(str(t['speedup_reference'].iloc[0]))}) on this machine (experiment 3)",
                view,
            )
        ]


EXPERIMENT = Runtime()
