"""What CERTIFY and PREDICT return: one row per point, as tensors, with ``take`` / ``cat``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

import torch
from torch import Tensor

from probust._inputs import check_labels
from probust.errors import OptionError
from probust.estimators import rows_frame

ABSTAIN = -1  #: ``prediction`` where the procedure abstains

_R = TypeVar("_R", bound="_Rows")


def _check_radii(radii: Sequence[float] | Tensor, name: str = "radii") -> tuple[float, ...]:
    values = torch.as_tensor(radii, dtype=torch.float64).flatten() if not isinstance(radii, (int, float)) else None
    if values is None or values.numel() == 0:
        raise OptionError(f"must be a non-empty sequence of radii >= 0, got {radii!r}", field=name)
    if not torch.isfinite(values).all() or (values < 0).any():
        raise OptionError(f"must hold finite radii >= 0 (in the units of x), got {values.tolist()}", field=name)
    return tuple(float(r) for r in values)


def certified_accuracy(prediction: Tensor, radius: Tensor, labels: Tensor, radii: Sequence[float] | Tensor) -> Tensor:
    """The standard curve: the share of points predicted correctly with a radius of at least r.

    Args:
        prediction: int64 [B], the class (-1 where abstaining: never correct).
        radius: float64 [B], each point's radius (units of x, L2 norm).
        labels: int [B], the true classes.
        radii: the radii r to evaluate, [R].

    Returns:
        float64 [R] on the CPU.
    """
    labels = check_labels(labels, prediction.shape[0], field="labels").to(prediction.device)
    r = torch.as_tensor(_check_radii(radii), dtype=torch.float64, device=radius.device)
    correct = (prediction == labels) & (prediction != ABSTAIN)
    return ((radius[:, None] >= r[None, :]) & correct[:, None]).double().mean(0).cpu()


@dataclass
class _Rows:
    """``len``, ``take``, ``cat`` and ``cpu`` over the tensor fields (one row per point)."""

    prediction: Tensor

    def __len__(self) -> int:
        return len(self.prediction)

    def take(self: _R, index: Tensor) -> _R:
        """The rows of the points ``index`` (int64 [k], or a bool mask [B]), in that order."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self) if _is_rows(self, f.name)})

    def cpu(self: _R) -> _R:
        """A copy with every tensor on the CPU."""
        return replace(self, **{f.name: getattr(self, f.name).cpu() for f in fields(self) if _is_rows(self, f.name)})

    @classmethod
    def cat(cls: type[_R], parts: Sequence[_R]) -> _R:
        """The results of consecutive chunks of points as one (rows concatenated in order).

        The settings (``sigma``, ``alpha``, ``radii``) must agree between the parts."""
        if not parts:
            raise ValueError("parts must hold at least one result")
        values: dict[str, Any] = {}
        for f in fields(cls):
            first = getattr(parts[0], f.name)
            if isinstance(first, Tensor):
                values[f.name] = torch.cat([getattr(part, f.name) for part in parts])
            else:
                if any(getattr(part, f.name) != first for part in parts[1:]):
                    raise ValueError(f"the parts have different {f.name}: {[getattr(p, f.name) for p in parts]}")
                values[f.name] = first
        return cls(**values)


def _is_rows(result: object, name: str) -> bool:
    return isinstance(getattr(result, name), Tensor)


@dataclass
class CertifyResult(_Rows):
    """Cohen et al.'s CERTIFY for a batch of points: the smoothed class and a certified L2 radius.

    The guarantee, per point, over the draws: with probability at least 1 - ``alpha``, either
    the point abstains or the smoothed classifier g(x) = argmax_c P[f(x + eps) = c],
    eps ~ N(0, sigma^2 I) in the space of the tensors the model receives, is ``prediction`` on
    the whole L2 ball of radius ``radius`` around x.

    Attributes:
        prediction: int64 [B], the smoothed class, or -1 (:data:`ABSTAIN`) where p_lower < 1/2.
        radius: float64 [B], ``sigma * Phi^-1(p_lower)`` (units of x, L2 norm); 0 where it
            abstains. With ``radii``, at least every radius in ``radii`` it certified.
        p_lower: float64 [B], a lower confidence bound, at level ``alpha``, on p_A, the
            probability that a noisy copy is predicted as ``selected`` (not the probability of
            keeping the clean prediction: the two classes may differ). Without ``radii`` the
            one-sided Clopper-Pearson bound after n draws; with them the confidence sequence's
            bound when the point stopped (:mod:`probust.smoothing.stats`).
        selected: int64 [B], the class the selection draws chose (also where it abstains).
        hits: int64 [B], the estimation draws predicted as ``selected``.
        n_drawn: int64 [B], the noisy forward passes spent on the point: the n0 selection draws
            plus the estimation draws (n without ``radii``; at most n with them).
        seconds: float64 [B], the point's share of the wall time of the draws: each round of
            forward passes divided equally among the points it drew for (points are computed
            together, so this apportions, it does not measure a point alone). Not
            reproducible, unlike every other field.
        sigma: the noise's standard deviation per input coordinate.
        alpha: the level of the guarantee.
        radii: the radii asked for (units of x), or None (fixed-n CERTIFY).
        certified: bool [B, len(radii)] with ``radii``: the point is certified at radius
            ``radii[j]`` (with probability at least 1 - alpha, every True in a row is right at
            once); None without ``radii``.
        classes: C, the model's number of classes (labels given to :meth:`correct` and
            :meth:`certified_accuracy` are checked against it), where known.
    """

    prediction: Tensor
    radius: Tensor
    p_lower: Tensor
    selected: Tensor
    hits: Tensor
    n_drawn: Tensor
    seconds: Tensor
    sigma: float
    alpha: float
    radii: tuple[float, ...] | None = None
    certified: Tensor | None = None
    classes: int | None = None

    @property
    def abstained(self) -> Tensor:
        """bool [B]: the points where CERTIFY abstains."""
        return self.prediction == ABSTAIN

    def correct(self, labels: Tensor) -> Tensor:
        """bool [B]: the prediction is ``labels`` (False where it abstains): the TSV's ``correct``."""
        labels = check_labels(labels, len(self), self.classes, field="labels").to(self.prediction.device)
        return (self.prediction == labels) & ~self.abstained

    def certified_accuracy(self, labels: Tensor, radii: Sequence[float] | Tensor | None = None) -> Tensor:
        """The share of points certified correct at each radius, float64 [R] on the CPU.

        Args:
            labels: int [B], the true classes.
            radii: the radii r; default the ``radii`` asked for. A point counts at r when it is
                correct and ``radius >= r`` (with the ``radii`` asked for: ``certified``).
        """
        labels = check_labels(labels, len(self), self.classes, field="labels")
        if radii is None:
            if self.radii is None or self.certified is None:
                raise ValueError("radii is required: this result was certified without radii")
            correct = self.correct(labels)
            return (self.certified & correct[:, None]).double().mean(0).cpu()
        return certified_accuracy(self.prediction, self.radius, labels, radii)

    def to_pandas(self, index_offset: int = 0) -> Any:
        """The result as a pandas DataFrame, one row per point (needs the ``run`` extra).

        Columns: ``index`` (int64, ``index_offset + row``: the data-set index the draws were
        derived from, when certified with the same ``index_offset``), ``prediction``,
        ``radius``, ``p_lower``, ``selected``, ``hits``, ``n_drawn``, ``seconds`` (as the
        attributes), ``sigma`` and ``alpha`` repeated on every row, ``abstained`` (bool), and,
        with ``radii``, ``certified``: each cell a bool array [len(radii)], in the order of
        ``radii`` (also in ``df.attrs["radii"]``; ``np.stack(df.certified)`` gives [B, R]).

        Args:
            index_offset: the index of row 0 in the data set (as given to CERTIFY).
        """
        frame = rows_frame(self, index_offset, matrices=True, feature="CertifyResult.to_pandas")
        frame = frame.drop(columns=["radii", "classes"], errors="ignore")
        frame.insert(frame.columns.get_loc("prediction") + 1, "abstained", self.abstained.cpu().numpy())
        frame.attrs["radii"] = None if self.radii is None else list(self.radii)
        return frame


@dataclass
class PredictResult(_Rows):
    """Cohen et al.'s PREDICT for a batch of points: the smoothed class, or abstain.

    Per point, the probability of returning a class other than the smoothed classifier's is at
    most ``alpha`` (over the draws).

    Attributes:
        prediction: int64 [B], the top class of the n draws, or -1 (:data:`ABSTAIN`) where the
            two-sided binomial test of ``count_top`` against ``count_second`` does not reject
            p = 1/2 at ``alpha``.
        top: int64 [B], the class drawn most often (the lowest index among ties).
        count_top: int64 [B], draws predicted as ``top``.
        count_second: int64 [B], draws predicted as the runner-up class.
        p_value: float64 [B], the test's two-sided p-value.
        n_drawn: int64 [B], noisy forward passes spent on the point (n).
        seconds: float64 [B], the point's share of the wall time (as in :class:`CertifyResult`).
        sigma: the noise's standard deviation per input coordinate.
        alpha: the test's level.
    """

    prediction: Tensor
    top: Tensor
    count_top: Tensor
    count_second: Tensor
    p_value: Tensor
    n_drawn: Tensor
    seconds: Tensor
    sigma: float
    alpha: float

    @property
    def abstained(self) -> Tensor:
        """bool [B]: the points where PREDICT abstains."""
        return self.prediction == ABSTAIN

    def to_pandas(self, index_offset: int = 0) -> Any:
        """The result as a pandas DataFrame, one row per point (needs the ``run`` extra).

        Columns: ``index`` (int64, ``index_offset + row``), ``prediction``, ``abstained`` (bool),
        ``top``, ``count_top``, ``count_second``, ``p_value``, ``n_drawn``, ``seconds`` (as the
        attributes), ``sigma`` and ``alpha`` repeated on every row.

        Args:
            index_offset: the index of row 0 in the data set (as given to PREDICT).
        """
        frame = rows_frame(self, index_offset, feature="PredictResult.to_pandas")
        frame.insert(frame.columns.get_loc("prediction") + 1, "abstained", self.abstained.cpu().numpy())
        return frame
