"""Reading a results folder (``probust estimate``'s): its rows, also while the run is going, and
its ``config.json``.

Example:
    >>> df = probust.run.read_results("results/")     # works while the run is going
    >>> df.pivot_table(index="index", columns=["sigma", "method"], values="p")

:func:`read_results` returns one row per (index, sigma, method, n_samples), sorted by those four columns (method
alphabetically), with a fresh RangeIndex. Rows of a work unit still being written are
not there yet; rows stored twice (a merge interrupted midway) appear once. Columns:

- ``index`` (int64): the point's index in the data set split.
- ``label`` (int64): its true class.
- ``prediction`` (int64): the model's class on the clean input (argmax of the logits;
  the lowest class wins an exact tie).
- ``target`` (int64): the class whose survival ``p`` measures (the prediction, or the
  label with ``target="label"``).
- ``sigma`` (float64): noise standard deviation per input coordinate, in the units of
  the inputs (pixels in [0, 1]). ``softmax`` does not depend on it and is repeated for
  every sigma so that each sigma has the same methods.
- ``method`` (str): one of ``probust.METHODS``: ``mc``, ``taylor``, ``mmse``,
  ``taylor_mvs``, ``mmse_mvs``, ``softmax``, ``mc_cv``, ``mc_is``.
- ``n_samples`` (int64): the method's sample count: Monte Carlo draws M for ``mc``,
  ``mc_cv`` and ``mc_is``; noisy copies N for ``mmse``/``mmse_mvs``; 0 for ``taylor``,
  ``taylor_mvs`` and ``softmax``.
- ``p`` (float64): the estimate of p_robust, in [0, 1].
- ``ci_low``, ``ci_high`` (float64, NaN where there is none): the Monte Carlo
  confidence interval (``mc``, ``mc_cv``, ``mc_is``; level in ``config.json``).
- ``stderr`` (float64, NaN where there is none): the standard error of ``p`` (same).
- ``clean_softmax`` (float64): softmax probability (temperature 1) of the clean
  prediction, whatever the method (not the interval's level, which ``config.json`` records
  as ``confidence``).
- ``cdf_error`` (float64, NaN where there is none): estimated absolute error of the
  mvn-cdf evaluation (``taylor``, ``mmse``, and ``mc_cv``'s control variate).
- ``p_fail`` (float64, NaN where there is none): the failure probability 1 - p computed
  directly, accurate in relative terms when tiny: ``mc_is`` always; ``taylor``,
  ``mmse``, ``taylor_mvs``, ``mmse_mvs`` when the run asked for it (``p_fail=True``,
  ``--p-fail``). Sort by it to rank the most robust points.
- ``p_fail_error`` (float64, NaN where there is none): the relative error of
  ``p_fail``: an error bound over ``p_fail`` for the analytic methods (about 99%; 0
  for the mv-sigmoid's closed form), the standard error over ``p_fail`` for ``mc_is``
  (inf when no failure was drawn).
- ``p_mc``, ``p_linearised``, ``cv_beta`` (float64, NaN where there is none):
  ``mc_cv`` only: the plain Monte Carlo fraction over the same draws, the linearised
  model's p_robust (the control variate's exact mean) and the fitted coefficient.
- ``n_drawn`` (float64, NaN where there is none): noisy draws the Monte Carlo methods
  actually evaluated for the point: ``n_samples``, or fewer where an adaptive run
  (``target_half_width``) stopped the point early.
- ``boundaries_kept`` (stored as int64; NaN where there is none): ``taylor`` and
  ``mmse``: how many of the C - 1 decision boundaries entered the mvn-cdf (fewer where
  the run setting ``prune`` skipped those that cannot matter; the mv-sigmoid methods
  always keep all C - 1).
- ``agreement`` (float64, NaN where there is none): ``taylor``, ``mmse`` and their
  ``_mvs`` variants: the fraction of checked noise draws on which the model's verdict
  (prediction unchanged) and the linearisation's agree; 1 - agreement estimates a bound
  on the linearisation's error at the point (``Estimate.agreement``).
- ``agreement_draws`` (stored as int64; NaN where there is none): the draws
  ``agreement`` counts (MMSE's N copies; Taylor's fresh draws: 8, or 32 where the
  first 8 left the verdict open).
- ``route`` (string, null where there is none): ``taylor`` and ``mmse`` and their
  ``_mvs`` variants: how the point's margin gradients were taken ("direct", "head",
  "forward", "candidates"; :data:`probust.estimators.result.ROUTE_NAMES`), decided from
  counts alone, so a resumed folder's new rows take the routes its first ones did.
- ``seconds`` (float64): wall time of the estimator on the point's work unit divided by
  its points (data loading and writing excluded).
- ``seed`` (int64): the seed of the random streams.

The columns from ``p_fail`` to ``route`` (:data:`OPTIONAL_COLUMNS`) came after the
first results format: files written before them read with nulls there. Files of format
version 1 read with their ``confidence`` column as ``clean_softmax``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from probust.errors import first_line
from probust.run.files import CONFIG_META_KEY, damaged, read_table_file, to_frame
from probust.run.store import FORMAT, ResultStore

__all__ = ["read_config", "read_results"]


def read_results(path: str | os.PathLike) -> Any:
    """The results table of a run, as a pandas DataFrame, also while the run is going.

    Args:
        path: a results folder (``--out``), or one Parquet file written by probust.

    Returns:
        The rows, one per (index, sigma, method, n_samples), with the columns of this
        module's docstring.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is another command's folder (``probust certify``'s: read it with
            :func:`probust.run.read_certified`), or a results file is damaged (unreadable, truncated, a page whose checksum
            does not match, a column of another type, a row without its key); the message names
            it and says what to do (move it away and run the same command again, which
            computes its rows again). No file is skipped: the table is whole or refused.
    """
    path = Path(path)
    if path.is_file():
        return to_frame(read_table_file(path, None))
    if not path.is_dir():
        raise FileNotFoundError(f"no results at {path}")
    store = ResultStore(path)
    config = store.read_config()
    found = config.get("format") if isinstance(config, dict) else None
    if found is not None and found != FORMAT:
        raise ValueError(
            f"{path} holds {found!r} results, not probust estimate's: read a probust certify folder with "
            "probust.run.read_certified"
        )
    return store.read()


def read_config(path: str | os.PathLike) -> dict[str, Any] | None:
    """The configuration of a results folder (``config.json``) or of a merged Parquet file.

    Raises:
        ValueError: the file is damaged (named in the message).
    """
    path = Path(path)
    if path.is_file():
        try:
            meta = pq.read_schema(path).metadata or {}
            return json.loads(meta[CONFIG_META_KEY]) if CONFIG_META_KEY in meta else None
        except Exception as exc:  # a damaged file: name it, as read_results does
            raise damaged(path, f"cannot read its configuration: {first_line(exc)}") from None
    return ResultStore(path).read_config()
