"""Score a data set with several estimators and noise levels into a resumable results table.

Two steps, so that every bad argument is reported before any work starts::

    settings = probust.run.RunSettings(data="fashion-mnist", model="cnn.pt", sigmas=[0.1],
                                       methods=["mc", "softmax"], out="results/")  # may raise ConfigError
    plan = probust.run.prepare(settings)       # loads the data and the model, claims the folder
    summary = probust.run.execute(plan)

or all at once, returning the table: ``df = probust.run_estimate(...)``. See
:mod:`probust.run.work_units` for how the work is cut into units.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from probust.estimators import DEFAULT_COPIES
from probust.run import distributed
from probust.run.distributed import World
from probust.run.errors import ConfigError, agree
from probust.run.files import ESTIMATE, Layout
from probust.run.folder import claim_folder, new_config, request, start_history
from probust.run.memory_store import MemoryStore
from probust.run.methods import DEFAULT_METHODS, tasks
from probust.run.model_source import load_model
from probust.run.noise_options import noise_setting
from probust.run.prepared import PreparedRun
from probust.run.reading import read_results
from probust.run.settings import RunSettings, check_keywords, recorded
from probust.run.sources import (
    batch,
    class_names,
    data_name,
    data_split,
    device_type,
    input_shape,
    load_data,
    num_classes,
    resolve_device,
    single_class_note,
)
from probust.run.store import FORMAT_VERSION, ResultStore
from probust.run.work_units import execute

__all__ = ["Grid", "prepare", "prepare_folder", "run_estimate"]


@dataclass
class Grid:
    """What a command computes on the loaded data: its work units' tasks and what the folder
    records of them (built by the ``grid`` callback of :func:`prepare_folder`).

    Attributes:
        tasks: the grid's tasks, in the order they are computed; each has ``key`` (the values of
            the layout's grid key) and ``describe()``.
        request: the "requests" entry of this call (:func:`probust.run.folder.request` for estimate).
        recorded: the "run" settings that make the folder's identity (:func:`probust.run.settings.recorded`).
        noise: the run's noise setting, or None (isotropic Gaussian of each sigma).
        linearisation_samples: MMSE copies of the mc_cv / mc_is linearisation (estimate only).
    """

    tasks: list[Any]
    request: dict[str, Any]
    recorded: dict[str, Any]
    noise: Any = None
    linearisation_samples: int = DEFAULT_COPIES


def prepare(
    settings: RunSettings, *, argv: Sequence[str] | None = None, store: MemoryStore | None = None
) -> PreparedRun:
    """Load the data and the model, and claim the output folder.

    Nothing is computed. Under torchrun this joins the process group; every rank must call it.

    Args:
        settings: the run (already checked when it was built).
        argv: the command line, recorded in the folder's history (None from Python).
        store: keep the rows in memory instead of ``settings.out`` (:func:`probust.score`):
            no folder is claimed, and the run is this process's alone (see :func:`prepare_folder`).

    Raises:
        ConfigError: a missing data set, a model that does not fit the data, an output folder
            that cannot be written; the message is one line naming the argument.
        ConfigMismatchError: the folder holds results of a different run, or results written
            by another probust version or in another results format (see :mod:`probust.run.folder`).
    """
    s = settings

    def grid(ds: Any, selected: np.ndarray) -> Grid:
        noise = noise_setting(
            s.noise,
            s.noise_std,
            s.noise_cov,
            s.noise_scale,
            input_shape(ds),
            batch(ds, np.arange(len(ds), dtype=np.int64))[0] if s.noise_scale == "std" else None,
        )
        return Grid(
            tasks=tasks(list(s.sigmas), list(s.methods), list(s.mc_samples), list(s.mmse_samples)),
            request=request(s.sigmas, s.methods, s.mc_samples, s.mmse_samples, selected),
            recorded=recorded(s, noise.description),
            noise=noise,
            linearisation_samples=s.mmse_samples[0],
        )

    return prepare_folder(settings, ESTIMATE, grid, argv=argv, store=store)


def prepare_folder(
    settings: Any,
    layout: Layout,
    grid: Callable[[Any, np.ndarray], Grid],
    *,
    argv: Sequence[str] | None = None,
    store: MemoryStore | None = None,
) -> PreparedRun:
    """:func:`prepare` for any command writing a results folder of ``layout``: join torchrun's
    group, load the data and the model, select the points, claim the folder (every check before
    any work, agreed between the ranks).

    Args:
        settings: a checked settings dataclass composed of
            :class:`~probust.run.settings.SourceOptions`, ``ComputeOptions`` and ``FolderOptions``.
        layout: the table the folder holds (its ``format`` marks ``config.json``).
        grid: ``grid(dataset, selected indices int64 [P]) -> Grid``, called on every rank; may
            raise :class:`~probust.run.ConfigError`.
        argv: the command line, recorded in the folder's history.
        store: where the rows go instead of the folder ``settings.out``: nothing on disk (no
            folder claimed, locked or recorded, no data hash), one process whatever torchrun's
            environment says (every rank computes every point itself, waiting for no other).

    Raises:
        ConfigError, ConfigMismatchError: as :func:`prepare`.
    """
    s = settings
    memory = store is not None
    world = World() if memory else distributed.join(device_type(s.device))
    results: ResultStore = store if store is not None else ResultStore(s.out, layout)
    try:
        plan = None
        error: BaseException | None = None
        try:
            dev = resolve_device(s.device, device_type(s.device), world)
            ds = load_data(s.data, s.split, s.data_root, s.download, s.data_options)
            selected = _selected(ds, s.selected, s.limit, s.split)
            module, model_info, notes = load_model(
                s.model, dev, ds, s.allow_pickle, s.weights, s.model_args, mean=s.mean, std=s.std, untrained=s.untrained
            )
            spread = single_class_note(ds, selected, s.limit) if s.selected is None else None
            notes = notes + ([spread] if spread else [])
            work = grid(ds, selected)
            if memory:
                config = _memory_config(ds, s.split, model_info, work, layout)
            else:
                config = new_config(ds, s.split, model_info, work.recorded, work.request, dev, world, layout.format)
            if world.is_main and not memory:
                config = claim_folder(results, config, s.overwrite, s.extend, s.allow_version_change)
            plan = PreparedRun(
                store=results,
                dataset=ds,
                model=module,
                device=dev,
                indices=selected,
                tasks=work.tasks,
                config=config,
                world=world,
                settings=s,
                show_progress=s.show_progress and world.is_main,
                linearisation_samples=work.linearisation_samples,
                warnings=notes,
                noise=work.noise,
            )
        except ConfigError as exc:
            error = exc
        agree(world, error)
        assert plan is not None
        if world.is_main and not memory:
            try:
                start_history(plan, s.overwrite, argv, s.allow_version_change)
            except ConfigError as exc:
                error = exc
        # Also a barrier: no rank reads the folder before rank 0 has cleared and claimed it.
        agree(world, error)
        return plan
    except BaseException:
        results.release_lock()
        world.close()
        raise


def _selected(ds: Any, selected: np.ndarray | None, limit: int | None, split: str) -> np.ndarray:
    """The data-set indices a run scores, int64 [P]: the ``selected`` ones (None: all, in order),
    at most ``limit`` of them; an index past the data set is refused by name."""
    if selected is None:
        return np.arange(len(ds) if limit is None else min(limit, len(ds)), dtype=np.int64)
    if selected[-1] >= len(ds):
        raise ConfigError(
            f"index {int(selected[-1])} is out of range for {data_name(ds)} {data_split(ds, split)} ({len(ds)} points)",
            field="indices",
        )
    return selected[:limit] if limit is not None else selected


def _memory_config(ds: Any, split: str, model_info: dict[str, Any], work: Grid, layout: Layout) -> dict[str, Any]:
    """What a run kept in memory records of itself: ``config.json``'s "format", "run" (without
    the data's sha256: no folder's identity to check, and hashing would read every point),
    "requests", "model" and "data"."""
    return {
        "format": layout.format,
        "format_version": FORMAT_VERSION,
        "run": {
            "dataset": data_name(ds),
            "split": data_split(ds, split),
            "data_size": len(ds),
            "model_sha256": model_info["sha256"],
            **work.recorded,
        },
        "requests": [work.request],
        "model": model_info,
        "data": {
            "input_shape": list(input_shape(ds)),
            "num_classes": num_classes(ds),
            "classes": class_names(ds) or [],
        },
    }


def run_estimate(
    data: str | Any,
    model: str | os.PathLike | nn.Module,
    sigmas: float | Sequence[float],
    methods: str | Sequence[str] = DEFAULT_METHODS,
    out: str | os.PathLike | None = "results",
    **options: Any,
) -> Any:
    """Score a data set with estimators of p_robust at several noise levels, into ``out``.

    The same as ``probust estimate`` on the command line. A run interrupted at any point and
    started again with the same arguments computes only what is missing; the table is then
    identical to an uninterrupted run's. Under torchrun every rank calls this and shares the work.

    Args:
        data, model, sigmas, methods, out, **options: the fields of :class:`~probust.run.RunSettings`
            of the same names (keyword arguments only, after ``out``), each declared once with its
            unit, default and what it changes (see :mod:`probust.run.settings`).

    Returns:
        The results table as :func:`probust.run.reading.read_results` gives it (every row in ``out``,
        including those of earlier runs added with ``extend``).

    Raises:
        ConfigError: a bad argument, found before any work starts.
        ConfigMismatchError: ``out`` holds results of a different run, or of another probust
            version (``allow_version_change``) or results format.
        TiedPredictionError: with ``target="prediction"``, the clean prediction of a point to
            compute is tied between two classes (found before any estimator runs).
        ConfigError: also an unknown keyword argument (named, with the valid ones), and
            ``out=None`` (:func:`probust.score` gives the table in memory).
    """
    check_keywords(options)
    if out is None:
        raise ConfigError(
            "run_estimate writes its rows into a results folder: give one, or use probust.score(model, data, "
            "sigma, ...) for the table in memory",
            field="out",
        )
    sigmas = (sigmas,) if isinstance(sigmas, (int, float)) else sigmas
    settings = RunSettings(data=data, model=model, sigmas=sigmas, methods=methods, out=out, **options)
    plan = prepare(settings)
    if plan.world.is_main:
        for note in plan.warnings:
            warnings.warn(note, UserWarning, stacklevel=2)
    execute(plan)
    return read_results(plan.store.path)


def _signature() -> inspect.Signature:
    """run_estimate's signature as help() and editors show it: its five leading arguments, then
    every other declared field of RunSettings as a keyword argument with its default."""
    head = list(inspect.signature(run_estimate).parameters.values())[:5]
    rest = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(RunSettings)
        if f.name not in {p.name for p in head}
    ]
    return inspect.Signature([*head, *rest], return_annotation=Any)


run_estimate.__signature__ = _signature()  # type: ignore[attr-defined]
