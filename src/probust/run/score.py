"""``probust.score``: a data set scored in memory, a pandas DataFrame out.

    df = probust.score(model, loader, sigma=0.1, methods=["mc", "mmse"], mc_samples=1000)
    df = probust.score(model, loader, sigma=0.1, methods=["mc"], target_half_width=0.02)

The runner's machinery without its folder: the arguments are :class:`~probust.run.RunSettings`'
and checked by it, :func:`~probust.run.prepare` loads and probes as for ``probust estimate``,
and :func:`~probust.run.work_units.run_units` computes the same work units, whose parts go to a
:class:`~probust.run.memory_store.MemoryStore` instead of Parquet files. The rows are therefore the
ones :func:`~probust.run.run_estimate` and ``probust estimate`` store for the same points,
settings and seed, number for number (``seconds`` apart, a timing). With ``out`` the rows go to
that results folder (resumable, as :func:`~probust.run.run_estimate`) and are read back.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from probust._inputs import as_dataset
from probust.run.errors import ConfigError
from probust.run.memory_store import MemoryStore
from probust.run.methods import DEFAULT_METHODS
from probust.run.prepare import prepare
from probust.run.settings import FolderOptions, RunSettings, check_keywords
from probust.run.sources import class_names, point_paths
from probust.run.work_units import execute

__all__ = ["score"]

#: The folder's options (``out`` apart): they only apply with ``out``.
_FOLDER_ONLY = tuple(f.name for f in dataclasses.fields(FolderOptions) if f.name != "out")


def score(
    model: nn.Module | str | os.PathLike,
    data: Any,
    sigma: float | Sequence[float],
    methods: str | Sequence[str] = DEFAULT_METHODS,
    *,
    out: str | os.PathLike | None = None,
    keys: tuple[Any, Any] | None = None,
    **options: Any,
) -> Any:
    """p_robust of every point of a data set, for each sigma and method, as a pandas DataFrame.

    The same rows as :func:`probust.run_estimate` (and ``probust estimate``) on the same points,
    settings and seed: each point's random stream derives from the seed and its index in the
    data set, and the work is cut into the same blocks of ``unit_size`` points, whatever the
    DataLoader's own batch size. Needs the ``run`` extra.

    Args:
        model: maps [B, *S] to logits [B, C] (as the estimators take it: a Hugging Face
            ``ModelOutput`` or a tuple whose first item is the logits also do); or a model file,
            ``package.module:function`` or ``hf:FOLDER`` as ``probust estimate --model`` takes.
        data: the points, one of
            - a map-style Dataset, ``ds[i] -> (x float32 [*S], label)``;
            - a DataLoader over one: its ``dataset`` is scored, every point in index order (any
              batch size; ``drop_last`` and ``num_workers`` do not matter). A shuffled loader,
              another sampler, an IterableDataset or a collate_fn other than torch's default is
              refused with the reason (:func:`probust.run.sources.loader_dataset`);
            - tensors: ``x`` [N, *S], ``(x, y)`` with integer labels y [N], or a
              ``torch.utils.data.TensorDataset``; without labels, ``label`` is -1;
            - a data set name or a path, as ``probust estimate --data`` takes it.
            Inputs are in the units the noise is added in (pixels in [0, 1] for images).
        sigma: a noise standard deviation per input coordinate, or a list of them.
        methods: names of ``probust.METHODS``; default the paper's six.
        keys: ``(inputs_key, label_key)`` of a data set whose items are dicts, where they are not
            among the names read by default (:mod:`probust._inputs`: ``image``, ``pixel_values``,
            ``img``, ``x``; ``label``, ``labels``, ``y``).
        out: a results folder to write the rows into as well (then resumable and extendable,
            with the folder options below); None (default): nothing is written anywhere.
        **options: the other fields of :class:`~probust.run.RunSettings` (``probust estimate
            --help`` shows each flag's full help); an unknown one is refused with the list of these.

            How much work per point (the first to reach for: the defaults are the paper's):

            - ``mc_samples``: Monte Carlo draws per point of mc, mc_cv and mc_is (default
              10,000; e.g. ``mc_samples=1000`` for a first look, ten times faster); several values
              give one row each.
            - ``target_half_width``: adaptive Monte Carlo (mc, mc_cv): stop a point once its
              confidence interval's half-width is at most this (e.g. ``target_half_width=0.02``:
              p within about +-0.02), checked every 1,000 draws (500 for mc_cv), at most
              ``mc_samples`` draws; column ``n_drawn`` holds the draws used. Default None.
            - ``mmse_samples``: MMSE noisy copies per point (default 5); several values give
              one row each.

            The points: ``limit`` (the first N selected points), ``indices`` (a list of
            data-set indices or a spec such as ``"0-99:10"``), ``split`` ("test" or "train", a
            data set named), ``data_root``, ``download``, ``data_options`` (how a file or
            folder is read: :class:`probust.data.FileOptions`' fields).

            The model: ``mean``, ``std`` (the normalisation it expects, applied inside it, one
            value per channel or one for all), ``weights`` (a state_dict for a
            ``package.module:function`` model), ``model_args`` (that function's keyword
            arguments), ``allow_pickle`` (accept model files that run code when loaded), ``untrained``
            (score a ``package.module:function`` model without ``weights``: refused otherwise).

            The noise: ``noise`` ("gaussian" by default, "uniform", "laplace"), ``noise_std``
            (per-coordinate multipliers), ``noise_cov`` (a covariance), ``noise_scale``
            ("absolute" or "std").

            The estimators: ``seed`` (of every random stream; default 0), ``target``
            ("prediction", the default, or "label"), ``confidence`` (of the Monte Carlo
            interval, 0.95), ``interval`` ("wilson" or "clopper-pearson"), ``temperature``
            (softmax), ``tol`` (the mvn-cdf's error tolerance), ``sampling`` (MMSE's draws),
            ``p_fail`` (also 1 - p with relative accuracy), ``prune`` and ``gradients`` (which
            boundaries get exact gradients, and from where), ``check_draws`` (the trust check's
            draws).

            How it runs (no number changes): ``device`` ("auto", "cpu", "cuda", ...),
            ``unit_size`` (points per estimator call, 256), ``batch_size`` (rows per pass
            through the model), ``memory_budget``, ``channels_last``, ``jacobian``,
            ``show_progress`` (default True: one bar over the call's model evaluations, Monte
            Carlo draws and MMSE copies, with the time left; False: none).

            With ``out`` only: ``overwrite``, ``extend``, ``merge``, ``allow_version_change``.

    Returns:
        The runner's table (:func:`probust.run.read_results` documents every column: ``index``,
        ``label``, ``prediction``, ``target``, ``sigma``, ``method``, ``n_samples``, ``p``, ...,
        ``seconds``, ``seed``), one row per (point, sigma, method, sample count), sorted by
        them, plus where the data set knows them: ``path`` (the file each point was read
        from: probust's and torchvision's image folders) after ``index``, and ``label_name``
        and ``prediction_name`` (the class names: a data set's ``classes``) after ``label`` and
        ``prediction``. ``df.attrs["config"]`` is what the run records of itself (as a results
        folder's ``config.json``).

    Raises:
        ConfigError: a bad argument, before any work, named (an unknown keyword too, with the
            valid ones); a folder option without ``out``.
        ConfigMismatchError, TiedPredictionError: as :func:`probust.run_estimate`.
    """
    check_keywords(
        options, function="score", others=("model", "data", "sigma", "methods", "out", "keys"), without=("sigmas",)
    )
    if keys is not None:
        data = as_dataset(data, keys)
    if out is None:
        for name in _FOLDER_ONLY:
            if name in options:
                raise ConfigError(
                    "applies to a results folder: give out=... to write the rows into one as well "
                    "(without it they are kept in memory only)",
                    field=name,
                )
    sigmas = (sigma,) if isinstance(sigma, (int, float)) else sigma
    folder: dict[str, Any] = {"out": out} if out is not None else {"merge": False}
    settings = RunSettings(data=data, model=model, sigmas=sigmas, methods=methods, **folder, **options)
    plan = prepare(settings, store=None if out is not None else MemoryStore())
    if plan.world.is_main:
        for note in plan.warnings:
            warnings.warn(note, UserWarning, stacklevel=2)
    execute(plan)
    frame = plan.store.read()
    frame = with_names(frame, plan.dataset)
    frame.attrs["config"] = plan.config
    return frame


def with_names(frame: Any, ds: Any) -> Any:
    """The rows with the columns that name their points, where the data set knows them:
    ``path`` after ``index``; ``label_name`` and ``prediction_name`` after ``label`` and
    ``prediction`` (None for a label outside the class list, such as -1: no label)."""
    indices = frame["index"].to_numpy()
    paths = point_paths(ds, indices)
    if paths is not None:
        frame.insert(frame.columns.get_loc("index") + 1, "path", paths)
    classes = class_names(ds)
    if classes is not None:
        for column in ("label", "prediction"):
            names = [classes[c] if 0 <= c < len(classes) else None for c in frame[column].tolist()]
            frame.insert(frame.columns.get_loc(column) + 1, f"{column}_name", names)
    return frame
