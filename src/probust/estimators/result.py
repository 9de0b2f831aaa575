"""The value every estimator returns: ``Estimate``, one row per point."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probust.errors import OptionError
from probust.linearisation import ROUTE_NAMES


@dataclass
class Estimate:
    """Average-case robustness of a batch of points, with the estimator's diagnostics.

    Attributes:
        p: float64 [B], the probability that the prediction stays ``target`` under the
            noise (the probability of *keeping* the prediction, in [0, 1]).
        target: int64 [B], the class whose survival is measured.
        method: the estimator's name ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax",
            "mc_cv", "mc_is").
        stderr: float64 [B], standard error of ``p`` (Monte Carlo estimators).
        ci_low, ci_high: float64 [B], a confidence interval for ``p`` at ``confidence``.
        confidence: the interval's confidence level.
        n_samples: int64 [B], the number of noisy model evaluations spent on each point.
        margin: float32 [B, C], the linearisation's margins c_i = g_i (0 at the target).
        grad_norm: float32 [B, C], ||u_i||_2 of the linearisation's boundary normals (0 at the target).
        z: float64 [B, C], c_i / sqrt(u_i^T S u_i): the boundary distance in noise standard
            deviations (+inf at the target and for boundaries the noise cannot cross).
        cdf_error: float64 [B], the estimated absolute error of the mvn-cdf evaluation.
        p_fail: float64 [B], the failure probability 1 - p computed directly, accurate in
            *relative* terms when it is tiny (``p_fail=True`` on the analytic estimators; "mc_is").
        p_fail_error: float64 [B], the relative error of ``p_fail``: an error bound over
            ``p_fail`` for the analytic estimators (about 99%; 0 for closed forms), the standard
            error over ``p_fail`` for importance sampling (inf when no failure was seen).
        p_mc: float64 [B], "mc_cv": the plain Monte Carlo fraction over the same noise samples.
        p_linearised: float64 [B], "mc_cv": the control variate's exact mean, the linearised
            model's p_robust (mvn-cdf).
        cv_beta: float64 [B], "mc_cv": the fitted control-variate coefficient.
        boundaries_kept: int64 [B], Taylor and MMSE: how many of the C - 1 decision boundaries
            entered the mvn-cdf (fewer than C - 1 where ``prune`` dropped those that cannot
            matter; their ``z`` is then a lower bound and their ``grad_norm`` NaN).
        route: int64 [B], Taylor and MMSE: how each point's margin gradients were computed, an
            index into :data:`ROUTE_NAMES` ("direct": one backward pass per boundary; "head":
            through the model's linear head; "forward": forward mode; "candidates": a screening,
            then the boundaries still within reach). Decided from counts, never from timings
            (:mod:`probust.linearisation.counting`), unless forced: ``gradients`` names the first
            three, ``prune="spectral"`` or ``"sketch"`` gives "candidates".
        agreement: float64 [B], Taylor and MMSE: the fraction of checked noise draws eps on
            which the model's verdict (argmax f(x + eps) = target) and the linearisation's
            (every kept c_i + u_i . eps > 0) agree. 1 - agreement estimates a bound on the
            linearisation's error, |p_robust - p| <= P(verdicts differ) (+ ``cdf_error``): near
            1, trust p; low, the linearisation does not describe the model at this noise
            (:mod:`probust.estimators.trust`). None where nothing was checked (``check_draws=0``).
        agreement_draws: int64 [B], the draws ``agreement`` counts: MMSE's own N noisy copies,
            or fresh draws (Taylor's, or ``check_draws``): 2 on every point, up to 8 where those
            leave the verdict open, then up to ``check_draws`` where it is still open
            (:func:`probust.estimators.trust.check_stages`).
    """

    p: Tensor
    target: Tensor
    method: str
    stderr: Tensor | None = None
    ci_low: Tensor | None = None
    ci_high: Tensor | None = None
    confidence: float | None = None
    n_samples: Tensor | None = None
    margin: Tensor | None = None
    grad_norm: Tensor | None = None
    z: Tensor | None = None
    cdf_error: Tensor | None = None
    p_fail: Tensor | None = None
    p_fail_error: Tensor | None = None
    p_mc: Tensor | None = None
    p_linearised: Tensor | None = None
    cv_beta: Tensor | None = None
    boundaries_kept: Tensor | None = None
    route: Tensor | None = None
    agreement: Tensor | None = None
    agreement_draws: Tensor | None = None

    def __len__(self) -> int:
        return len(self.p)

    @classmethod
    def cat(cls, parts: Sequence[Estimate]) -> Estimate:
        """The estimates of consecutive chunks of points as one.

        Tensor fields are concatenated along the batch (dim 0) in order; the others (``method``,
        ``confidence``) come from the first part. Fields that the first part leaves None stay None.
        """
        if not parts:
            raise ValueError("parts must hold at least one Estimate")
        values: dict[str, Any] = {}
        for f in fields(cls):
            first = getattr(parts[0], f.name)
            values[f.name] = (
                torch.cat([getattr(part, f.name) for part in parts]) if isinstance(first, Tensor) else first
            )
        return cls(**values)

    def take(self, index: Tensor) -> Estimate:
        """The estimates of the points ``index`` (int64 [n]), in that order."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        taken: dict[str, Any] = {k: v[index] if isinstance(v, Tensor) else v for k, v in values.items()}
        return Estimate(**taken)

    def cpu(self) -> Estimate:
        """A copy with every tensor moved to the CPU."""
        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        moved: dict[str, Any] = {k: v.cpu() if isinstance(v, Tensor) else v for k, v in values.items()}
        return Estimate(**moved)

    def to_pandas(self, index_offset: int = 0, *, per_class: bool = False) -> Any:
        """The estimate as a pandas DataFrame, one row per point (needs the ``run`` extra).

        Columns: ``index`` (int64, ``index_offset + row``: the data-set index the estimator
        derived each point's random stream from, when called with the same ``index_offset``),
        then every field that is set, under its own name and dtype: the per-point tensors
        [B] (``p``, ``target``, ``stderr``, ...) and the scalars repeated on every row
        (``method``). ``n_samples`` (evaluations spent on the point) is renamed ``n_drawn``,
        the runner's table's name for it (its ``n_samples`` is the count asked for). ``confidence``
        is the interval's level (the softmax probability of the clean prediction is
        ``clean_softmax``). ``route`` holds each point's route by name (:data:`ROUTE_NAMES`).
        Fields left None have no column.

        Args:
            index_offset: the index of row 0 in the data set (as given to the estimator).
            per_class: also the per-class fields [B, C] (``margin``, ``grad_norm``, ``z``), each
                as one column whose cells are numpy arrays [C] (``np.stack(df.z)`` gives
                [B, C] back); left out by default: C may be large and they are diagnostics.

        Returns:
            A DataFrame with a fresh RangeIndex.
        """
        frame = rows_frame(self, index_offset, matrices=per_class, renamed=_TABLE_NAMES, feature="Estimate.to_pandas")
        if "route" in frame:
            frame["route"] = np.asarray(ROUTE_NAMES, dtype=object)[frame["route"].to_numpy()]
        return frame


#: Fields of :class:`Estimate` whose column in :meth:`Estimate.to_pandas` has the runner's
#: table's name for the same quantity.
_TABLE_NAMES = {"n_samples": "n_drawn"}


def rows_frame(
    result: Any,
    index_offset: int = 0,
    *,
    matrices: bool = False,
    renamed: dict[str, str] | None = None,
    feature: str = "to_pandas",
) -> Any:
    """A dataclass of per-point tensors (an :class:`Estimate`, a certification) as a pandas
    DataFrame, one row per point; generic over its fields, so a field added later gets its
    column without a change here.

    Args:
        result: a dataclass whose tensor fields have the batch as dim 0 ([B] or [B, k]).
        index_offset: the first row's ``index`` (its index in the data set).
        matrices: keep the [B, k] fields, as one column of numpy arrays [k] each.
        renamed: field name -> column name.
        feature: what asks, named in the error when pandas is missing.

    Returns:
        DataFrame with ``index`` (int64) first, then one column per set field in field order;
        tensors as numpy arrays of their dtype, other values repeated on every row.
    """
    from probust._extras import import_extra

    pd = import_extra("pandas", feature=feature)
    if isinstance(index_offset, bool) or not isinstance(index_offset, int) or index_offset < 0:
        raise OptionError(f"must be an int >= 0, got {index_offset!r}", field="index_offset")
    names = renamed or {}
    rows = len(result)
    columns: dict[str, Any] = {"index": np.arange(index_offset, index_offset + rows, dtype=np.int64)}
    for f in fields(result):
        value = getattr(result, f.name)
        if value is None:
            continue
        name = names.get(f.name, f.name)
        if isinstance(value, Tensor):
            array = value.detach().cpu().numpy()
            if array.ndim == 1:
                columns[name] = array
            elif matrices:
                # Cells holding arrays: one row per point whatever the number of classes.
                cells = np.empty(rows, dtype=object)
                for row, item in enumerate(array.reshape(rows, -1)):
                    cells[row] = item
                columns[name] = cells
        else:
            columns[name] = [value] * rows
    return pd.DataFrame(columns)
