"""``probust certify``: Cohen et al.'s CERTIFY over a data set, into a resumable results folder.

    settings = probust.run.certify.CertifySettings(data="digits", model="m.pt", sigmas=[0.25], out="cert/")
    summary = probust.run.certify.run_certify(settings)
    df = probust.run.certify.read_certified("cert/")

The folder works as ``probust estimate``'s (:mod:`probust.run.store`, :mod:`probust.run.folder`,
:mod:`probust.run.work_units`, :mod:`probust.run.distributed`): the same data, model and folder
options, one Parquet part per work unit (a block of ``unit_size`` consecutive selected points at
one sigma), resumed by running the same command again, shared out under torchrun, merged into
``results.parquet`` at the end. Its ``config.json`` is marked ``"format": "probust.certify"``
(:data:`FORMAT`), so neither command takes the other's folder. At the end rank 0 also writes, per
sigma, ``certify_sigma<S>.tsv`` in the authors' column format (:func:`tsv_name`).

Each point's draws depend only on (seed, its index in the data set): ``index_offset`` is the
data-set index, so the table does not depend on the batch size, resumption or the number of ranks.
The noise is added to the tensors the model receives (pixel space for a model with its
normalisation inside, or given as ``mean`` / ``std``: ``--mean`` / ``--std``); radii are L2
distances in those units.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch

from probust._options import option
from probust._progress import counted_as
from probust.estimators import DEFAULT_COPIES
from probust.run.errors import ConfigError
from probust.run.files import Layout
from probust.run.indices import consecutive_runs, index_ranges
from probust.run.methods import make_task_estimator
from probust.run.prepare import Grid, prepare_folder
from probust.run.prepared import PreparedRun, RunSummary, Task
from probust.run.reading import read_config
from probust.run.settings import (
    ComputeOptions,
    FolderOptions,
    SeedOptions,
    SourceOptions,
    check_declared,
    estimator_parameters,
    recorded,
)
from probust.run.sources import batch
from probust.run.store import ResultStore
from probust.run.work_units import run_units
from probust.smoothing.smoothed import PREDICTIVE_FUTILITY, effective_procedure

__all__ = [
    "ESTIMATE_METHODS",
    "FORMAT",
    "TSV_COLUMNS",
    "CertifyOptions",
    "CertifySettings",
    "certified_column",
    "certify_layout",
    "execute_certify",
    "implied_run",
    "prepare_certify",
    "read_certified",
    "recorded_run",
    "run_certify",
    "tsv_name",
    "write_tsv",
]

#: ``config.json``'s "format" of a ``probust certify`` folder.
FORMAT = "probust.certify"
#: The analytic methods whose radius estimate sigma * Phi^-1(p) may go beside the certificate.
ESTIMATE_METHODS = ("taylor", "mmse")
#: The columns of ``certify_sigma<S>.tsv``, as Cohen et al.'s ``certify.py`` writes them.
TSV_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time")


# --- the declarations ----------------------------------------------------------------------------


def _count(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"must be an integer >= 1, got {value!r}", field=name)
    return int(value)


def _level(value: Any, name: str) -> float:
    try:
        level = float(value) if not isinstance(value, (bool, np.bool_)) else float("nan")
    except (TypeError, ValueError):
        level = float("nan")
    if not 0 < level < 1:
        raise ConfigError(f"must be a probability in (0, 1), got {value!r}", field=name)
    return level


def _fraction(value: Any, name: str) -> float:
    try:
        level = float(value) if not isinstance(value, (bool, np.bool_)) else float("nan")
    except (TypeError, ValueError):
        level = float("nan")
    if not 0 <= level < 1:
        raise ConfigError(f"must be a number in [0, 1), got {value!r}", field=name)
    return level


def _radii(value: Any, name: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, (int, float, str)) else list(value)
    out = []
    for item in items:
        try:
            r = float(item) if not isinstance(item, (bool, np.bool_)) else float("nan")
        except (TypeError, ValueError):
            r = float("nan")
        if not np.isfinite(r) or r < 0:
            raise ConfigError(f"radii must be finite numbers >= 0 (L2, in the units of x), got {item!r}", field=name)
        out.append(r)
    if not out:
        raise ConfigError("give at least one radius", field=name)
    return tuple(sorted(set(out)))


def _procedure(value: Any, name: str) -> str | None:
    if value is not None and value not in ("fixed", "sequential", "prior"):
        raise ConfigError(f"expected one of fixed, sequential, prior, got {value!r}", field=name)
    return value


def _estimate(value: Any, name: str) -> str | None:
    if value is not None and value not in ESTIMATE_METHODS:
        raise ConfigError(f"expected one of none, {', '.join(ESTIMATE_METHODS)}, got {value!r}", field=name)
    return value


@dataclass(frozen=True, kw_only=True)
class CertifyOptions(SeedOptions):
    """What CERTIFY computes (Cohen et al.'s defaults): recorded, part of a folder's identity."""

    TITLE: ClassVar[str] = "certification (Cohen et al.'s CERTIFY; recorded in config.json)"

    # The flags are the authors' (certify.py's --N0 and --N), with --n0 and --n as lowercase
    # aliases; under torchrun "--n" is an ambiguous abbreviation of torchrun's own options
    # (--nnodes, --nproc-per-node), which it refuses before probust starts: --N works there.
    n0: int = option(
        100,
        help="selection draws per point (Cohen et al.: 100)",
        flag="--N0",
        aliases=("--n0",),
        metavar="N0",
        parse=int,
        check=_count,
        record="n0",
    )
    n: int = option(
        100_000,
        help="estimation draws per point (Cohen et al.: 100,000); with --radii the most a point may draw "
        "(also --n, except under torchrun, which takes --n for its own options)",
        flag="--N",
        aliases=("--n",),
        metavar="N",
        parse=int,
        check=_count,
        record="n",
    )
    alpha: float = option(
        0.001,
        help="per point, the probability that its certificate is wrong (Cohen et al.: 0.001)",
        metavar="ALPHA",
        check=_level,
        record="alpha",
    )
    radii: Sequence[float] | None = option(
        None,
        help="decide these L2 radii (units of the model's inputs) with sequential draws, up to --N, instead of "
        "spending all n on every point; adds a boolean column certified_<r> per radius (certified_0_25 for 0.25)",
        default_help="fixed-n CERTIFY",
        metavar="R",
        many=True,
        check=_radii,
        record="radii",
        implied=None,
    )
    futility: float = option(
        0.001,
        help="with --radii: the level of the test that gives a radius up (lowers the share certified, never "
        "the guarantee)",
        metavar="LEVEL",
        check=_level,
        record="futility",
    )
    predictive_futility: float = option(
        PREDICTIVE_FUTILITY,
        help="with the prior procedure: also give a radius up at a look where the predictive chance that the last "
        "look certifies it is below P; 0 turns it off (saves draws; lowers the share certified, never the guarantee)",
        metavar="P",
        check=_fraction,
        record="predictive_futility",
    )
    procedure: str | None = option(
        None,
        help="how the estimation draws are made and read: fixed (Cohen et al.'s n draws, Clopper-Pearson), "
        "sequential (the uniform-mixture confidence sequence; needs --radii) or prior (the analytic-prior test, "
        "centred on Taylor's estimate per point; needs --radii); docs/certify.md",
        default_help="fixed without --radii, prior with them",
        choices={"fixed": "fixed", "sequential": "sequential", "prior": "prior"},
        check=_procedure,
        record="procedure",  # the procedure run, never None (recorded_run); older folders: implied_run
    )
    estimate: str | None = option(
        None,
        help="also an analytic radius ESTIMATE sigma * Phi^-1(p) from taylor or mmse (--estimate-copies), beside the "
        "certificate: no guarantee (columns p_estimate, radius_estimate, estimate_target)",
        default_help="none",
        choices={"none": None, "taylor": "taylor", "mmse": "mmse"},
        check=_estimate,
        record="estimate",
        implied=None,
    )
    estimate_copies: int = option(
        DEFAULT_COPIES,
        help="with --estimate mmse: the noisy copies N the MMSE estimate averages over",
        metavar="N",
        parse=int,
        check=_count,
        record="estimate_copies",
        implied=DEFAULT_COPIES,
    )


#: The groups :class:`CertifySettings` composes, in the order they are listed.
GROUPS: tuple[type, ...] = (SourceOptions, CertifyOptions, ComputeOptions, FolderOptions)


@dataclass(frozen=True, kw_only=True)
class CertifySettings(FolderOptions, ComputeOptions, CertifyOptions, SourceOptions):
    """Every argument of ``probust certify``, checked when built: the data, model, points and
    sigmas as ``probust estimate`` reads them (:class:`~probust.run.settings.SourceOptions`), the
    CERTIFY settings (:class:`CertifyOptions`), how it runs and the results folder.

    The noise is isotropic Gaussian N(0, sigma^2 I), added to the tensors the model receives.

    Raises:
        ConfigError: a bad value; its ``field`` names the argument.
    """

    def __post_init__(self) -> None:
        check_declared(self)

    def replace(self, **changes: Any) -> CertifySettings:
        """A copy with some arguments changed (checked again)."""
        return dataclasses.replace(self, **changes)


# --- the table -----------------------------------------------------------------------------------


def certified_column(radius: float) -> str:
    """The column of the radius ``radius`` asked for with ``radii``: ``certified_`` and the
    radius in decimal notation with ``_`` for the point, all the digits that tell it from any
    other float and no more: ``certified_0_25`` for 0.25, ``certified_0_025`` for 0.025,
    ``certified_1`` for 1.0, ``certified_0_00001`` for 1e-05 (no dot, so ``df.certified_0_25``
    works; two radii never share a column).
    """
    text = np.format_float_positional(float(radius) + 0.0, unique=True, trim="-")  # + 0.0: no "-0"
    return "certified_" + text.replace(".", "_")


def certify_layout(radii: Sequence[float] | None = None) -> Layout:
    """The table of a ``probust certify`` folder, one row per (point, sigma).

    Columns: ``index`` (int64, the data-set index; the TSV's idx), ``sigma`` (float64), ``label``
    (int64), ``prediction`` (int64, the smoothed class, -1 where CERTIFY abstains), ``radius``
    (float64, certified L2 radius in the units of the model's inputs, 0 where it abstains),
    ``correct`` (bool: prediction == label), ``p_lower`` (float64, the lower confidence bound on
    p_A), ``selected`` (int64, the class the selection draws chose), ``hits`` (int64, estimation
    draws predicted as it), ``n_drawn`` (int64, noisy forward passes spent: n0 + estimation
    draws), ``seconds`` (float64, the point's share of the wall time, in seconds, as the estimate
    table's ``seconds``; not reproducible), ``seed``
    (int64); with ``--estimate``: ``p_estimate``, ``radius_estimate`` (float64, sigma *
    Phi^-1(p), an estimate, not a certificate; inf where p = 1) and ``estimate_target`` (int64,
    the class it is for: the clean prediction), else null; with ``radii``: ``certified_<r>``
    (bool) per radius, in increasing order (:func:`certified_column`: ``certified_0_25``).
    """
    fields = [
        ("index", pa.int64()),
        ("sigma", pa.float64()),
        ("label", pa.int64()),
        ("prediction", pa.int64()),
        ("radius", pa.float64()),
        ("correct", pa.bool_()),
        ("p_lower", pa.float64()),
        ("selected", pa.int64()),
        ("hits", pa.int64()),
        ("n_drawn", pa.int64()),
        ("seconds", pa.float64()),
        ("seed", pa.int64()),
        ("p_estimate", pa.float64()),
        ("radius_estimate", pa.float64()),
        ("estimate_target", pa.int64()),
        *((certified_column(r), pa.bool_()) for r in radii or ()),
    ]
    return Layout(
        FORMAT,
        pa.schema(fields),
        ("index", "sigma"),
        ("p_estimate", "radius_estimate", "estimate_target"),
        implied=implied_run,
        resumable=("procedure",),
    )


def recorded_run(settings: CertifySettings) -> dict[str, Any]:
    """What a ``probust certify`` folder's ``config.json`` records of ``settings`` ("run", beside
    the data and the model): :func:`~probust.run.settings.recorded`, with the procedure CERTIFY
    runs (:func:`probust.smoothing.smoothed.effective_procedure`) where ``procedure`` is None, so
    that a folder keeps its procedure whatever the default of the version that resumes it."""
    return {**recorded(settings), "procedure": effective_procedure(settings.procedure, settings.radii)}


def implied_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """A ``probust certify`` folder's "run" section as this version reads it: the procedure its
    rows were computed with where it recorded none. A folder written before ``--procedure``
    existed (no "procedure" key) ran the sequential test with ``--radii`` and fixed-n CERTIFY
    without; one written while the option recorded its None default ran the default of then:
    the analytic-prior test with ``--radii``, fixed-n without. One written before
    ``--predictive-futility`` ran the prior test with its default
    (:data:`probust.smoothing.smoothed.PREDICTIVE_FUTILITY`)."""
    out = {"predictive_futility": PREDICTIVE_FUTILITY, **run}
    if out.get("procedure") is None:
        if "procedure" not in out:
            out["procedure"] = "fixed" if out.get("radii") is None else "sequential"
        else:
            out["procedure"] = "fixed" if out.get("radii") is None else "prior"
    return out


@dataclass(frozen=True)
class _SigmaTask:
    """One sigma of the grid: a work unit is a block of points at it."""

    sigma: float

    @property
    def key(self) -> tuple[float]:
        return (self.sigma,)

    def describe(self) -> str:
        return f"certify sigma={self.sigma:g}"


class _CertifyUnits:
    """The work units of ``probust certify`` (see :func:`probust.run.work_units.run_units`)."""

    def before(self, plan: PreparedRun, pending: list[tuple[np.ndarray, np.ndarray]]) -> None:
        pass

    def cost(self, plan: PreparedRun, task: _SigmaTask) -> int:
        """CERTIFY's draws (selection and estimation; with ``radii``, the most a point may draw),
        plus the analytic estimate's evaluations (its MMSE copies, or one for Taylor)."""
        s: CertifySettings = plan.settings
        return s.n0 + s.n + self._estimate_cost(s)

    @staticmethod
    def _estimate_cost(s: CertifySettings) -> int:
        """Evaluations per point of the analytic estimate beside the certificate (0: none)."""
        if s.estimate is None:
            return 0
        return s.estimate_copies if s.estimate == "mmse" else 1

    def start(self, plan: PreparedRun, task: _SigmaTask) -> tuple[Any, Any]:
        from probust.smoothing import Certify

        s: CertifySettings = plan.settings
        certifier = Certify(
            plan.model,
            task.sigma,
            n0=s.n0,
            n=s.n,
            alpha=s.alpha,
            radii=s.radii,
            futility=s.futility,
            procedure=s.procedure,
            predictive_futility=s.predictive_futility,
            **estimator_parameters(s, ()),
        )
        estimator = None
        if s.estimate is not None:
            copies = s.estimate_copies if s.estimate == "mmse" else 0
            estimator = make_task_estimator(plan, Task(task.sigma, s.estimate, copies))
        return certifier, estimator

    def run(
        self, plan: PreparedRun, state: tuple[Any, Any], task: _SigmaTask, block: np.ndarray, todo: np.ndarray
    ) -> int:
        from probust.smoothing import CertifyResult, radius_estimate

        certifier, estimator = state
        x, labels = batch(plan.dataset, todo)
        x = x.to(plan.device)
        # Each run of consecutive data-set indices is one call numbered from its first index.
        runs = consecutive_runs(todo)
        result = CertifyResult.cat([certifier(x[r], index_offset=int(todo[r.start])) for r in runs]).cpu()
        n, s = len(todo), plan.settings
        columns: dict[str, Any] = {
            "index": todo,
            "sigma": np.full(n, task.sigma),
            "label": labels.numpy(),
            "prediction": result.prediction.numpy(),
            "radius": result.radius.numpy(),
            "correct": result.correct(labels).numpy(),
            "p_lower": result.p_lower.numpy(),
            "selected": result.selected.numpy(),
            "hits": result.hits.numpy(),
            "n_drawn": result.n_drawn.numpy(),
            "seconds": result.seconds.numpy(),
            "seed": np.full(n, s.seed, dtype=np.int64),
        }
        if estimator is not None:
            p, radius, target = [], [], []
            for r in runs:
                with counted_as(self._estimate_cost(s)):  # the estimator counts points
                    est = estimator(x[r], index_offset=int(todo[r.start]))
                p.append(est.p.detach().cpu().double())
                radius.append(radius_estimate(est, task.sigma).detach().cpu())
                target.append(est.target.detach().cpu())
            columns |= {
                "p_estimate": torch.cat(p).numpy(),
                "radius_estimate": torch.cat(radius).numpy(),
                "estimate_target": torch.cat(target).numpy(),
            }
        if result.certified is not None:
            for j, r in enumerate(s.radii):
                columns[certified_column(r)] = result.certified[:, j].numpy()
        name = f"certify-sigma{task.sigma!r}-{int(todo[0]):08d}-{int(todo[-1]):08d}"
        plan.store.write_part(name, columns, metadata=plan.config["run"])
        return n

    def finish(self, plan: PreparedRun, rows: Any) -> None:
        write_tsv(rows, plan.store.path)


def tsv_name(sigma: float) -> str:
    """The TSV of one sigma: ``certify_sigma<repr(sigma)>.tsv`` (e.g. ``certify_sigma0.25.tsv``),
    one per sigma even when the folder holds one, so that the name stays when sigmas are added."""
    return f"certify_sigma{float(sigma)!r}.tsv"


def _timedelta(seconds: float) -> str:
    """A duration as Cohen et al.'s ``certify.py`` writes it: ``str(datetime.timedelta(seconds=...))``."""
    return str(datetime.timedelta(seconds=float(seconds)))


def write_tsv(rows: Any, folder: str | os.PathLike) -> list[str]:
    """Write ``certify_sigma<S>.tsv`` per sigma of ``rows`` (the folder's table) into ``folder``.

    The format of Cohen et al.'s ``certify.py``: a tab-separated header ``idx label predict
    radius correct time``, then one line per point in index order: its data-set index, true class,
    the smoothed class (-1 where CERTIFY abstains), the certified radius (0 there; written with all
    its digits, where the authors wrote three), 1 if the prediction is the label else 0, and the
    point's share of the time as ``str(datetime.timedelta(seconds=seconds))`` (``0:00:01.234000``).

    A file that already holds the same text is left as it is (a resumed, finished folder is
    not touched).

    Returns:
        The paths of the tables (each written whole or not at all).
    """
    from probust._io import atomic_write_bytes

    written = []
    for sigma, group in rows.groupby("sigma", sort=True):
        group = group.sort_values("index")
        lines = ["\t".join(TSV_COLUMNS)]
        for idx, label, predict, radius, correct, seconds in zip(
            group["index"],
            group["label"],
            group["prediction"],
            group["radius"],
            group["correct"],
            group["seconds"],
            strict=True,
        ):
            lines.append(
                f"{int(idx)}\t{int(label)}\t{int(predict)}\t{float(radius)!r}\t{int(correct)}\t{_timedelta(seconds)}"
            )
        path = os.path.join(folder, tsv_name(sigma))
        text = ("\n".join(lines) + "\n").encode()
        if not (os.path.isfile(path) and Path(path).read_bytes() == text):
            atomic_write_bytes(path, text)
        written.append(path)
    return written


# --- running -------------------------------------------------------------------------------------


def prepare_certify(settings: CertifySettings, *, argv: Sequence[str] | None = None) -> PreparedRun:
    """Load the data and the model and claim the folder for ``probust certify`` (nothing computed).

    Raises:
        ConfigError: a bad argument (named), found before any work.
        ConfigMismatchError: the folder holds another run's results (or ``probust estimate``'s).
    """
    s = settings

    def grid(ds: Any, selected: np.ndarray) -> Grid:
        return Grid(
            tasks=[_SigmaTask(sigma) for sigma in s.sigmas],
            request={"sigmas": list(s.sigmas), "n_points": int(len(selected)), "indices": index_ranges(selected)},
            recorded=recorded_run(s),
        )

    return prepare_folder(s, certify_layout(s.radii), grid, argv=argv)


def execute_certify(plan: PreparedRun) -> RunSummary:
    """Compute every missing (point, sigma) row of a plan from :func:`prepare_certify`, then
    (rank 0) merge and write the TSVs. Under torchrun every rank calls it and takes its share of
    the blocks.

    Returns:
        What was done (:class:`~probust.run.RunSummary`).
    """
    return run_units(plan, _CertifyUnits())


def run_certify(settings: CertifySettings, *, argv: Sequence[str] | None = None) -> RunSummary:
    """:func:`prepare_certify` and :func:`execute_certify`: certify every selected point at every
    sigma into ``settings.out``, computing only what is missing there."""
    return execute_certify(prepare_certify(settings, argv=argv))


def read_certified(path: str | os.PathLike) -> Any:
    """The table of a ``probust certify`` folder as a pandas DataFrame (also mid-run), one row per
    (index, sigma), sorted by them; columns as :func:`certify_layout` says.

    Raises:
        ValueError: ``path`` is not a ``probust certify`` folder, or a file is damaged (named).
    """
    config = read_config(path)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ValueError(f"{path} is not a probust certify results folder (no config.json of format {FORMAT})")
    run = config.get("run")
    radii = run.get("radii") if isinstance(run, dict) else None
    return ResultStore(path, certify_layout(radii)).read()
