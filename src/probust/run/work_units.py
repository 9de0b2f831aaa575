"""Executing a prepared run: every missing work unit computed, stored as a part, then merged.

The work is a grid: points x sigmas x (method, sample count). Points are cut into fixed blocks
of ``unit_size`` consecutive selected points; a *work unit* is one block for one (sigma,
method, sample count), computed by one estimator call and stored as one Parquet part (see
:mod:`probust.run.store`). A restarted run reads which rows exist and computes only the missing
units, with the same blocks, so its table equals an uninterrupted run's value for value. Under
torchrun the blocks are dealt out to the ranks (see :mod:`probust.run.distributed`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from probust._inputs import check_labels, check_x
from probust._progress import Share, counted_as, counting, run_bar
from probust._user_model import eval_mode
from probust.errors import Setting
from probust.estimators import ROUTE_NAMES
from probust.execution import sync
from probust.run.errors import TiedPredictionError, agree
from probust.run.folder import now
from probust.run.indices import consecutive_runs
from probust.run.methods import evaluations, make_task_estimator, reported_as
from probust.run.prepared import PreparedRun, RunSummary, Task
from probust.run.sources import batch
from probust.run.store import OPTIONAL_COLUMNS

__all__ = ["Units", "execute", "run_units"]

_FIELDS = ("p", "target", "stderr", "ci_low", "ci_high", "cdf_error", *(c for c in OPTIONAL_COLUMNS if c != "n_drawn"))


def _estimate(estimator: Any, x: Tensor, target: Tensor, indices: np.ndarray) -> dict[str, np.ndarray | None]:
    """Run the estimator on points with data-set indices ``indices`` (sorted, maybe sparse)."""
    # The estimator numbers rows from index_offset, so each run of consecutive indices gets
    # its own call.
    results = [estimator(x[r], target[r], index_offset=int(indices[r.start])) for r in consecutive_runs(indices)]
    out: dict[str, np.ndarray | None] = {}
    for name in _FIELDS:
        values = [getattr(r, name) for r in results]
        out[name] = None if values[0] is None else torch.cat([v.detach().cpu() for v in values]).numpy()
    route = out["route"]
    if route is not None:  # stored by name (what a reader of the table can use)
        out["route"] = np.asarray(ROUTE_NAMES, dtype=object)[route]
    # Draws actually evaluated (Monte Carlo methods; fewer than n_samples in an adaptive run).
    drawn = [r.n_samples for r in results]
    out["n_drawn"] = None if drawn[0] is None else torch.cat([v.cpu() for v in drawn]).double().numpy()
    return out


def _clean_pass(plan: PreparedRun, x: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """(prediction int64 [B], its softmax probability float64 [B], tied bool [B], C) on the CPU;
    ``tied``: the two largest logits are equal (the prediction is then the lowest of the tied
    classes)."""
    step = plan.settings.batch_size or 256
    with eval_mode(plan.model), torch.no_grad():
        logits = torch.cat([plan.model(x[i : i + step]) for i in range(0, x.shape[0], step)])
    logits = logits.detach().to("cpu", torch.float64)
    prediction = logits.argmax(dim=1)
    clean_softmax = torch.softmax(logits, dim=1).gather(1, prediction[:, None]).squeeze(1)
    if logits.shape[1] >= 2:
        top2 = logits.topk(2, dim=1).values
        tied = top2[:, 0] == top2[:, 1]
    else:
        tied = torch.zeros(logits.shape[0], dtype=torch.bool)
    return prediction, clean_softmax, tied, int(logits.shape[1])


def _clean_passes(plan: PreparedRun, todo: list[tuple[np.ndarray, np.ndarray]]) -> dict[int, tuple[Any, ...]]:
    """The clean pass of every block with rows to compute (``todo``: (block, its points without
    some row)), keyed by the block's first index.

    Raises:
        TiedPredictionError: with target "prediction", a point to compute has a tied prediction.
    """
    clean: dict[int, tuple[Any, ...]] = {}
    tied: list[np.ndarray] = []
    labelled = getattr(plan.dataset, "labelled", True)
    for block, missing in todo:
        x, labels = batch(plan.dataset, block)
        check_x(x, "data", int(block[0]))
        # Always on the whole block, so the prediction does not depend on what is left to do.
        clean[int(block[0])] = _clean_pass(plan, x.to(plan.device))
        if labelled:  # every label a class of the model's, before any estimator runs
            check_labels(labels, len(block), clean[int(block[0])][3], indices=block)
        tied.append(np.intersect1d(block[clean[int(block[0])][2].numpy()], missing))
    points = np.concatenate(tied) if tied else np.empty(0, np.int64)
    if plan.settings.target == "prediction" and len(points):
        first = points[:5].tolist()
        more = "..." if len(points) > 5 else ""
        raise TiedPredictionError(
            f"the clean prediction is tied between two classes at data-set indices {first}{more} "
            f"({len(points)} point{'s' if len(points) > 1 else ''}): p_robust of the prediction is undefined "
            "there; measure the true class with ",
            Setting("target", "label"),
            " (and ",
            Setting("overwrite", True),
            " or another ",
            Setting("out"),
            " folder), or leave these points out with ",
            Setting("indices", "..."),
            " (and ",
            Setting("extend", True),
            ")",
            indices=points.tolist(),
            field="target",
        )
    return clean


def _part_name(task: Task, indices: np.ndarray) -> str:
    return f"{task.method}-n{task.n_samples}-sigma{task.sigma!r}-{int(indices[0]):08d}-{int(indices[-1]):08d}"


def _run_unit(plan: PreparedRun, estimator: Any, task: Task, block: np.ndarray, todo: np.ndarray, clean: dict) -> int:
    """Compute the rows of ``todo`` (a subset of ``block``) for ``task`` and store them as a part."""
    x, labels = batch(plan.dataset, block)
    prediction, clean_softmax, _, _ = clean[int(block[0])]
    rows = np.isin(block, todo)
    if not rows.all():
        sel = torch.from_numpy(rows)
        x, labels, prediction, clean_softmax = x[sel], labels[sel], prediction[sel], clean_softmax[sel]
    target = prediction if plan.settings.target == "prediction" else labels
    sync(plan.device)
    start = time.perf_counter()
    est = _estimate(estimator, x.to(plan.device), target.to(plan.device), todo)
    sync(plan.device)
    seconds = (time.perf_counter() - start) / len(todo)
    n = len(todo)
    plan.store.write_part(
        _part_name(task, todo),
        {
            "index": todo,
            "label": labels.numpy(),
            "prediction": prediction.numpy(),
            "target": est["target"],
            "sigma": np.full(n, task.sigma),
            "method": [task.method] * n,
            "n_samples": np.full(n, task.n_samples, dtype=np.int64),
            "p": est["p"],
            "ci_low": est["ci_low"],
            "ci_high": est["ci_high"],
            "stderr": est["stderr"],
            "clean_softmax": clean_softmax.numpy(),
            "cdf_error": est["cdf_error"],
            **{name: est[name] for name in OPTIONAL_COLUMNS},
            "seconds": np.full(n, seconds),
            "seed": np.full(n, plan.settings.seed, dtype=np.int64),
        },
        metadata=plan.config["run"],
    )
    return n


def _missing(plan: PreparedRun, done: dict) -> int:
    """How many rows of the plan's grid ``done`` (from ResultStore.completed) lacks."""
    empty = np.empty(0, np.int64)
    return sum(int((~np.isin(plan.indices, done.get(t.key, empty))).sum()) for t in plan.tasks)


class Units(Protocol):
    """How one command computes and stores its work units; :func:`run_units` drives them (the
    sharding, resumption, progress, the barrier and the merge are the same for every command)."""

    def before(self, plan: PreparedRun, pending: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Called on every rank before any unit, with (block, its points still missing some row)
        for this rank's blocks that have work; may raise (every rank then stops)."""

    def cost(self, plan: PreparedRun, task: Any) -> int:
        """Model evaluations per point of ``task`` (what the run's progress bar counts)."""

    def start(self, plan: PreparedRun, task: Any) -> Any:
        """What computing ``task``'s units needs (an estimator), built once per task."""

    def run(self, plan: PreparedRun, state: Any, task: Any, block: np.ndarray, todo: np.ndarray) -> int:
        """Compute ``task``'s rows of the points ``todo`` (a subset of ``block``), store them as
        one part; returns how many rows. The estimators it calls report to the run's bar
        (:func:`probust._progress.counting`), scaled where they count something else than
        evaluations (:func:`probust._progress.counted_as`)."""

    def finish(self, plan: PreparedRun, rows: Any) -> None:
        """Rank 0, once every row is stored (and merged): ``rows`` is the whole table."""


class _EstimateUnits:
    """``probust estimate``'s units: a clean pass per block first, then one estimator per task."""

    def __init__(self) -> None:
        self.clean: dict[int, tuple[Tensor, ...]] = {}

    def before(self, plan: PreparedRun, pending: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.clean = _clean_passes(plan, pending)

    def cost(self, plan: PreparedRun, task: Task) -> int:
        return evaluations(task, self._classes())

    def _classes(self) -> int:
        """C, from the clean passes (2 where there is nothing to compute)."""
        return next((int(clean[3]) for clean in self.clean.values()), 2)

    def start(self, plan: PreparedRun, task: Task) -> Any:
        return make_task_estimator(plan, task)

    def run(self, plan: PreparedRun, state: Any, task: Task, block: np.ndarray, todo: np.ndarray) -> int:
        with counted_as(reported_as(task, self._classes())):
            return _run_unit(plan, state, task, block, todo, self.clean)

    def finish(self, plan: PreparedRun, rows: Any) -> None:
        pass


def execute(plan: PreparedRun) -> RunSummary:
    """Compute every missing row of the plan, write it to the folder, and (rank 0) merge.

    Every rank of a torchrun job calls it; each computes its share of the blocks. One progress
    bar counts the model evaluations of the whole grid (:func:`probust.run.methods.evaluations`:
    Monte Carlo draws, MMSE copies, one per point for Taylor and softmax) as the estimators
    report them, pass by pass, with the time left; under torchrun rank 0 shows its own share.

    Returns:
        What was done (on every rank; ``rows_computed`` counts this rank's rows).

    Raises:
        TiedPredictionError: with target "prediction", a point still to compute has a tied
            clean prediction (found by the clean passes, which all run before any estimator;
            raised on every rank).
        OptionError: an estimator refused a setting only the work can check (e.g. a
            ``memory_budget`` too small for the model); ``field`` names the option, which has the same
            name in the run and in the estimators.
        RuntimeError: rows of the grid are missing at the end (under torchrun: the output
            folder is not shared by every machine).
    """
    return run_units(plan, _EstimateUnits())


def run_units(plan: PreparedRun, units: Units) -> RunSummary:
    """Compute every missing unit of the plan's grid with ``units``, then (rank 0) check the
    table is whole, merge it and let ``units`` finish; see :func:`execute`.

    Points are cut into the plan's blocks; a unit is one block for one task. A unit already
    stored is skipped (resumption); under torchrun each rank takes every world_size-th block.
    The lock is released and the process group closed at the end, whatever happens.
    """
    start = time.perf_counter()
    world, store = plan.world, plan.store
    try:
        done = store.completed()
        rows_total = len(plan.indices) * len(plan.tasks)
        present = rows_total - _missing(plan, done)
        mine = world.shard(plan.blocks())
        empty = np.empty(0, np.int64)
        todos = {task.key: [block[~np.isin(block, done.get(task.key, empty))] for block in mine] for task in plan.tasks}
        pending = [(block, np.unique(np.concatenate([t[i] for t in todos.values()]))) for i, block in enumerate(mine)]
        # Every check first (estimate's clean passes), so that a tied prediction (or a failing
        # model) stops the run on every rank before any unit runs.
        error: BaseException | None = None
        try:
            units.before(plan, [(block, missing) for block, missing in pending if len(missing)])
        except Exception as exc:
            error = exc
        agree(world, error)
        computed = 0
        work = []
        for task in plan.tasks:
            todo = list(zip(mine, todos[task.key], strict=True))
            total = sum(len(b) for b, _ in todo)
            left = sum(len(t) for _, t in todo)
            work.append((task, todo, units.cost(plan, task), total, left))
        prefix = f"[rank 0/{world.world_size}] " if world.distributed else ""
        evaluations_total = sum(cost * total for _, _, cost, total, _ in work)
        done_before = sum(cost * (total - left) for _, _, cost, total, left in work)
        first = next((task for task, *_, left in work if left), None)
        title = "" if first is None else prefix + first.describe()
        with run_bar(evaluations_total, title, plan.show_progress and first is not None, initial=done_before) as bar:
            for task, todo, cost, _, left in work:
                if left == 0:
                    continue
                if bar is not None and task is not first:
                    bar.set_description(prefix + task.describe())
                state = units.start(plan, task)
                for block, missing in todo:
                    if len(missing):
                        share = None if bar is None else Share(bar, cost * len(missing))
                        with counting(share):
                            computed += units.run(plan, state, task, block, missing)
                        if share is not None:
                            share.finish()
        error = None
        merged = None
        world.barrier()
        if world.is_main:
            try:
                merged = _finish(plan, units)
            except Exception as exc:
                error = exc
        agree(world, error)
        return RunSummary(store.path, computed, present, rows_total, time.perf_counter() - start, merged)
    finally:
        store.release_lock()
        world.close()


def _finish(plan: PreparedRun, units: Units) -> Path | None:
    """Rank 0, after every rank is done: check the grid is complete, merge, record the end."""
    store = plan.store
    rows = store.read()
    missing = _missing(plan, store.completed(rows))
    # A shared file system may show other machines' files a little late.
    for wait in (1, 2, 4, 8) if missing and plan.world.distributed else ():
        time.sleep(wait)
        rows = store.read()
        missing = _missing(plan, store.completed(rows))
    if missing:
        hint = "; is the output folder on a file system every machine shares?" if plan.world.distributed else ""
        raise RuntimeError(f"{missing} rows of the run are missing from {store.path} after every rank finished{hint}")
    config = plan.config
    if config.get("history"):
        config["history"][-1]["finished"] = now()
    store.write_config(config)
    merged = store.merge(config, rows) if plan.settings.merge else None
    units.finish(plan, rows)
    return merged
