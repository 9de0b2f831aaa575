"""The arguments of one ``probust estimate`` run: :class:`RunSettings`, checked when it is built.

Each argument is declared once, as a field with an :class:`~probust._options.Option` (help, unit,
flag, choices, check from :mod:`probust.run.option_checks`, whether ``config.json`` records it),
in the group of the layer that uses it: :class:`~probust.run.data_options.DataOptions` (what is
scored), :class:`NoiseOptions`, :class:`EstimatorOptions` (what the estimators compute: part of
a folder's identity), :class:`ExecutionOptions` (how they run: never changes a number) and
:class:`FolderOptions`. :class:`RunSettings` composes them; the flags, the recorded settings, the
estimators' keyword arguments and the error-to-flag map are derived from these declarations.
Every bad value raises :class:`~probust.run.ConfigError` whose ``field`` is the argument's name.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from probust._options import UNSET, declared, option
from probust.errors import OptionError, Setting
from probust.estimators import (
    DEFAULT_CONFIDENCE,
    GRADIENTS,
    INTERVALS,
    MMSE,
    PRUNE_CHOICES,
    REGISTRY,
    RUN_OPTIONS,
    check_settings,
)
from probust.execution import EXECUTION_SETTINGS, JACOBIANS, Execution
from probust.mvn import DEFAULT_TOL
from probust.run import option_checks as checks
from probust.run.data_options import DataOptions, SourceOptions
from probust.run.errors import ConfigError
from probust.run.noise_options import DEFAULT_DESCRIPTION, NOISE_KINDS, NOISE_SCALES, check_noise
from probust.run.option_checks import TARGETS

__all__ = [
    "GROUPS",
    "MMSE_SAMPLINGS",
    "SETTING_DEFAULTS",
    "TARGETS",
    "ComputeOptions",
    "DataOptions",
    "EstimatorOptions",
    "ExecutionOptions",
    "FolderOptions",
    "NoiseOptions",
    "RunSettings",
    "SeedOptions",
    "SourceOptions",
    "check_declared",
    "check_keywords",
    "estimator_parameters",
    "recorded",
]

MMSE_SAMPLINGS = MMSE.SAMPLINGS


# --- the declarations ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NoiseOptions:
    """The noise at each sigma (see :mod:`probust.run.noise_options`); its description is part of
    a folder's identity (``config.json`` "run" -> "noise")."""

    TITLE: ClassVar[str] = "noise (default: Gaussian, standard deviation sigma per coordinate)"

    noise: str = option(
        "gaussian",
        help=f"the noise at each sigma, with standard deviation sigma per coordinate ({checks.named(NOISE_KINDS)}; "
        f"{checks.named(n for n, s in REGISTRY.items() if s.needs_gaussian)} need gaussian)",
        choices=NOISE_KINDS,
        record="noise",
        implied=DEFAULT_DESCRIPTION,
    )
    noise_std: Any = option(
        None,
        help="a .npy file (or array) of per-coordinate multipliers m, broadcast to one input's shape: "
        "coordinate j gets standard deviation sigma * m[j] (Gaussian)",
        default_help="",
        metavar="FILE.npy",
        check=checks.array,
    )
    noise_cov: Any = option(
        None,
        help="a .npy file (or array) holding a covariance C [d, d] over the flattened input: the noise is "
        "N(0, sigma^2 C)",
        default_help="",
        metavar="FILE.npy",
        check=checks.array,
    )
    noise_scale: str = option(
        "absolute",
        help="absolute, or std: sigma times each coordinate's standard deviation over the whole data set (for "
        "tables: sigma in units of each feature's spread; Gaussian, diagonal)",
        choices=NOISE_SCALES,
    )


@dataclass(frozen=True, kw_only=True)
class SeedOptions:
    """The seed of every random stream (recorded, part of a folder's identity)."""

    TITLE: ClassVar[str] = "random streams"

    seed: int = option(
        0,
        help="seed of every random stream (each point's stream depends on it and the point's index)",
        metavar="S",
        parse=int,
        check=checks.integer(None, False),
        record="seed",
        implied=0,
        param="seed",
    )


@dataclass(frozen=True, kw_only=True)
class EstimatorOptions(SeedOptions):
    """What the estimators compute: recorded in ``config.json`` and part of a folder's identity.
    ``param`` names the estimator's argument each sets (see :func:`estimator_parameters`)."""

    TITLE: ClassVar[str] = "estimators"

    target: str = option(
        "prediction",
        help="class whose survival is measured: prediction (the clean prediction, the paper's definition; "
        "a point whose clean prediction is tied stops the run before any estimate) or label (the true class)",
        choices=TARGETS,
        record="target",
    )
    temperature: float = option(
        1.0,
        help="softmax temperature of method softmax",
        metavar="T",
        check=checks.positive,
        record="temperature",
        param="temperature",
    )
    tol: float = option(
        DEFAULT_TOL,
        help=f"absolute error tolerance of the mvn-cdf ({checks.with_option('tol')})",
        metavar="TOL",
        check=checks.positive,
        record="tol",
        param="tol",
    )
    confidence: float = option(
        DEFAULT_CONFIDENCE,
        help=f"level of the Monte Carlo confidence interval ({checks.with_option('confidence')})",
        metavar="LEVEL",
        check=checks.level,
        record="confidence",
        param="confidence",
    )
    interval: str = option(
        "wilson",
        help="Monte Carlo interval of method mc (mc_cv and mc_is give their own)",
        choices=INTERVALS,
        record="interval",
        param="interval",
    )
    sampling: str = option(
        "centred",
        help="MMSE noise draws: centred or iid (see probust.MMSE)",
        choices=MMSE_SAMPLINGS,
        record="sampling",
        param="sampling",
    )
    p_fail: bool = option(
        False,
        help=f"also compute p_fail = 1 - p directly, with relative accuracy, for {checks.with_option('p_fail')} "
        "(columns p_fail, p_fail_error; up to C-1 extra mvn integrals per point for the mvn-cdf methods; "
        "mc_is always fills them)",
        check=checks.boolean,
        record="p_fail",
        implied=False,
        param="p_fail",
    )
    target_half_width: float | None = option(
        None,
        help=f"adaptive Monte Carlo ({checks.with_option('target_half_width')}): stop a point once its interval's half-width "
        "is at most W, checked every 1,000 draws for mc, 500 for mc_cv (column n_drawn: the draws used)",
        default_help="always --mc-samples draws",
        metavar="W",
        check=checks.half_width,
        record="target_half_width",
        implied=None,
        param="target_half_width",
    )
    prune: str = option(
        "auto",
        help=f"{checks.with_option('prune')}: leave out the decision boundaries that cannot matter (what they could cost is "
        "added to cdf_error; column boundaries_kept): auto (where it applies and a route other than every "
        "gradient by its own pass pays by counts, from about 81 classes or fewer than a linear head's features + "
        "1, or --gradients names one: leave out those whose tails fit the budget; a screening bounds every "
        "boundary's distance, by 8 reverse-mode probes or 8 to 32 forward-mode ones, then only those still within "
        "reach get exact gradients), spectral or sketch (that screening on every point), or off (every boundary "
        "kept)",
        choices=PRUNE_CHOICES,
        record="prune",
        implied="auto",
        param="prune",
    )
    check_draws: int | None = option(
        None,
        help=f"noise draws per point on which {checks.with_option('check_draws')} check their linearisation against the "
        "model (columns agreement, agreement_draws; one forward pass each): at most M fresh draws, 8 on every "
        "point and the rest where those leave the verdict open; 0: no check",
        default_help="Taylor: up to 32 fresh draws; MMSE: its own noisy copies",
        metavar="M",
        parse=int,
        check=checks.integer(0, True),
        record="check_draws",
        implied=None,
        param="check_draws",
    )
    gradients: str = option(
        "auto",
        help=f"where {checks.with_option('gradients')} take the exact margin gradients from (column route): auto (each "
        "point's cheapest, by counts), direct (one backward pass per boundary, the paper's computation), head "
        "(through the model's linear head, where its features are fewer than the classes), or forward "
        "(forward mode, for inputs with few coordinates); a forced one runs no screening",
        choices=GRADIENTS,
        record="gradients",
        implied="auto",
        param="gradients",
    )


@dataclass(frozen=True, kw_only=True)
class ComputeOptions:
    """How the work runs: none of these changes a number, so none is part of a folder's identity.
    With ``batch_size``, ``channels_last`` (and ``probust estimate``'s ``jacobian``) fixed, the
    execution plan is fixed too, for tables identical to the bit on any machine."""

    TITLE: ClassVar[str] = "how it runs"

    device: str | torch.device = option(
        "auto",
        help="cpu, cuda, cuda:N or auto (cuda if available); under torchrun on GPUs each rank uses cuda:LOCAL_RANK",
        check=checks.device,
    )
    unit_size: int = option(
        256,
        help="points per work unit: per estimator call and per part file",
        metavar="B",
        parse=int,
        check=checks.integer(1, False),
    )
    batch_size: int | None = option(
        None,
        help="most inputs per pass through the model inside the estimators (noisy copies, or pulled rows)",
        default_help="each estimator's own, measured per model",
        metavar="R",
        parse=int,
        check=checks.integer(1, True),
        param="batch_size",
    )
    memory_budget: int | str | None = option(
        None,
        help="bytes (or a size such as 4GB) each estimator may hold at once; row and class chunks are chosen to fit",
        default_help="half the memory free on the device",
        metavar="SIZE",
        check=checks.budget,
        param="memory_budget",
    )
    channels_last: bool | None = option(
        None,
        help="channels_last memory format for convolutional models: measured (auto), on or off",
        choices={"auto": None, "on": True, "off": False},
        check=checks.channels_last,
        param="channels_last",
    )
    show_progress: bool = option(
        True,
        help="no progress bars or summary (errors only)",
        flag="--quiet",
        aliases=("--no-progress",),
        check=checks.boolean,
    )


@dataclass(frozen=True, kw_only=True)
class ExecutionOptions(ComputeOptions):
    """How ``probust estimate``'s estimators run (never changes a number)."""

    jacobian: str = option(
        "auto",
        help="how the analytic methods run their backward passes: measured once per model (auto), one per "
        "class (loop), or torch.func vmap (speed and rounding only; where the gradients come from is --gradients)",
        choices=JACOBIANS,
        param="jacobian",
    )


@dataclass(frozen=True, kw_only=True)
class FolderOptions:
    """The results folder (see :mod:`probust.run.store` and :mod:`probust.run.folder`)."""

    TITLE: ClassVar[str] = "input and output"

    out: str | os.PathLike = option(
        "results",
        help="the results folder (created); holds config.json and Parquet files",
        metavar="DIR",
        check=checks.path(False),
    )
    overwrite: bool = option(False, help="replace the results of a different run in --out", check=checks.boolean)
    extend: bool = option(
        False,
        help="add points, sigmas, methods or sample counts to a folder holding results of the same data, model "
        "and settings",
        check=checks.boolean,
    )
    merge: bool = option(
        True,
        help="keep one Parquet file per work unit instead of merging them into results.parquet at the end",
        flag="--no-merge",
        check=checks.boolean,
    )
    allow_version_change: bool = option(
        False,
        help="resume or extend --out although another probust version wrote its rows (refused by default: "
        "the rows of two versions could differ; recorded in config.json's history). A folder in another "
        "results format is always refused",
        check=checks.boolean,
    )


#: The groups :class:`RunSettings` composes, in the order they are checked and listed.
GROUPS: tuple[type, ...] = (DataOptions, NoiseOptions, EstimatorOptions, ExecutionOptions, FolderOptions)


@dataclass(frozen=True, kw_only=True)
class RunSettings(FolderOptions, ExecutionOptions, EstimatorOptions, NoiseOptions, DataOptions):
    """Every argument of a run, checked and normalised when the object is built.

    The fields are those of :data:`GROUPS` (each documented by its declaration; ``probust estimate
    --help`` shows them all). Sequences are stored as sorted tuples (``sigmas``, ``mc_samples``,
    ``mmse_samples``, ``indices``; ``methods`` in ``probust.METHODS`` order), numbers as int or float,
    ``model_args`` as a dict.

    Raises:
        ConfigError: a bad value; its ``field`` names the argument, and the message is one line.
    """

    def __post_init__(self) -> None:
        check_declared(self)
        takes = {option for m in self.methods for option in REGISTRY[m].run_options}
        if "gradients" in takes:
            try:  # the estimators' own check, before any work (the run names these settings alike)
                check_settings(
                    self.prune if "prune" in takes else "auto",  # as the methods that take it get it
                    self.gradients,
                    p_fail=self.p_fail,
                    gaussian=self.noise == "gaussian",
                    jacobian=self.jacobian,
                )
            except OptionError as exc:
                raise ConfigError(*exc.parts, field=exc.field) from None
        gaussian = [m for m in self.methods if REGISTRY[m].needs_gaussian]
        check_noise(self.noise, self.noise_std, self.noise_cov, self.noise_scale, gaussian)
        if self.target == "label" and getattr(self.data, "labelled", True) is False:
            raise ConfigError(
                "'label' needs the points' labels and the data came without them: give (x, y), or measure the "
                "clean prediction with ",
                Setting("target", "prediction"),
                field="target",
            )

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with some arguments changed (checked again)."""
        return dataclasses.replace(self, **changes)


def check_keywords(
    given: Iterable[str],
    *,
    settings: type | None = None,
    function: str = "run_estimate",
    others: Iterable[str] = (),
    without: Iterable[str] = (),
) -> None:
    """Refuse keyword arguments that are neither options of ``settings`` (default
    :class:`RunSettings`) nor ``others`` (or are in ``without``), where the dataclass would raise
    a bare TypeError.

    The message names the keyword, the closest valid one (difflib) or the option a command-line
    flag of that name sets (``quiet`` -> ``show_progress=False``), and every valid keyword.

    Raises:
        ConfigError: ``field`` is the unknown keyword.
    """
    cls = RunSettings if settings is None else settings
    valid = sorted(({f.name for f in dataclasses.fields(cls)} | set(others)) - set(without))
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return
    name = unknown[0]
    hint: tuple[Any, ...] = ()
    flag = _flag_options(cls).get(name)
    if flag is not None:
        hint = (" (did you mean ", flag, f", the command line's --{name.replace('_', '-')}?)")
    else:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            hint = (" (did you mean ", Setting(close[0]), "?)")
    raise ConfigError(f"not an argument of {function}", *hint, f"; its arguments: {', '.join(valid)}", field=name)


def _flag_options(cls: type) -> dict[str, Setting]:
    """A command-line flag's words (``quiet`` for ``--quiet``) -> the option it sets from Python,
    where the two are named differently (``show_progress=False``, ``sigmas``)."""
    out: dict[str, Setting] = {}
    for f, o in declared(cls):
        for flag in (o.flag or "", *o.aliases):
            word = flag.lstrip("-").replace("-", "_")
            if not word or word == f.name:
                continue
            # A switch whose flag turns the default True off (--quiet, --no-merge).
            out[word] = Setting(f.name, False) if f.default is True else Setting(f.name)
    return out


def check_declared(settings: Any) -> None:
    """Check and normalise, in place, every declared field of a frozen settings dataclass
    composed of :class:`SourceOptions` and :class:`FolderOptions` (a run's, a certification's),
    then what one field cannot check alone.

    Raises:
        ConfigError: a bad value; its ``field`` names the argument.
    """
    for f, o in declared(settings):
        value = getattr(settings, f.name)
        if o.check is not None:
            value = o.check(value, f.name)
        elif o.choices is not None:
            allowed = tuple(o.choices.values() if isinstance(o.choices, Mapping) else o.choices)
            checks.choice(allowed)(value, f.name)
        object.__setattr__(settings, f.name, value)
    if isinstance(settings.data, (str, os.PathLike)) and settings.split not in ("train", "test"):
        raise ConfigError(f"expected train or test, got {settings.split!r}", field="split")
    if settings.overwrite and settings.extend:
        raise ConfigError(Setting("overwrite", True), " and ", Setting("extend", True), " exclude each other")
    checks.check_normalization(settings)


def recorded(settings: Any, noise_description: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``config.json``'s "run" records of the settings (with the data and the model, a
    folder's identity): every declared option with a ``record`` key; the noise as described
    (where the settings have a noise)."""
    out = {o.record: getattr(settings, f.name) for f, o in declared(settings) if o.record is not None}
    # As JSON reads them back (a folder's config is compared with a new run's).
    out = {key: list(value) if isinstance(value, tuple) else value for key, value in out.items()}
    if noise_description is not None:
        out["noise"] = dict(noise_description)
    out["model_args"] = dict(settings.model_args)
    return out


#: Settings added to ``config.json``'s "run" after the first format, with the value a folder
#: written before them implicitly has (compared as such, so such folders still resume). A folder
#: from before ``prune`` computed every boundary; it counts as "auto", which computes every
#: boundary below 1,000 classes for models without a narrow linear head (the same rows, bitwise)
#: and otherwise stays within ``tol``. Derived from the declarations (``implied``).
SETTING_DEFAULTS: dict[str, Any] = {
    o.record: o.implied for _, o in declared(RunSettings) if o.record is not None and o.implied is not UNSET
}


def estimator_parameters(settings: Any, run_options: Iterable[str]) -> dict[str, Any]:
    """The keyword arguments of a method's estimator that the run's settings (a
    :class:`RunSettings`, or another settings dataclass such as a certification's) give, under the
    estimator's names (each option's declared ``param``): those of :data:`RUN_OPTIONS` only when
    the method takes them (``run_options``), the others (seed, memory budget, ...) always; a None
    value (or a False ``p_fail``) leaves the estimator's default. The settings of how the work
    runs (an :class:`~probust.execution.Execution`'s fields) go in as one ``execution``."""
    takes = set(run_options)
    out: dict[str, Any] = {}
    how: dict[str, Any] = {}
    # Another object holding a run's attributes (a namespace) reads as a RunSettings.
    for f, o in declared(settings if dataclasses.is_dataclass(settings) else RunSettings):
        if o.param is None or (o.param in RUN_OPTIONS and o.param not in takes):
            continue
        value = getattr(settings, f.name)
        if value is None or (o.param == "p_fail" and not value):
            continue
        (how if o.param in EXECUTION_SETTINGS else out)[o.param] = value
    if how:
        out["execution"] = Execution(**how)
    return out
