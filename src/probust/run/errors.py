"""The errors of a run's preparation, and how every rank of a torchrun job learns of one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probust.errors import ConfigError, ProbustError, first_line
from probust.run.distributed import World

__all__ = ["ConfigError", "ConfigMismatchError", "TiedPredictionError", "agree", "first_line"]


class ConfigMismatchError(ConfigError):
    """The output folder holds results of a different run.

    Attributes:
        differences: one ``"field: value there, value here"`` string per differing field.
    """

    def __init__(self, *parts: Any, differences: Sequence[str] = (), **where: Any) -> None:
        super().__init__(*parts, **where)
        self.differences = list(differences)


class TiedPredictionError(ConfigError):
    """With ``target="prediction"``, the clean prediction of a point to compute is tied between
    two classes (equal largest logits): p_robust of "the prediction" is undefined there, as in
    the estimators (which refuse a tie when no target is given). Raised before any estimator runs.

    Attributes:
        indices: the data-set indices of the tied points (sorted).
    """

    def __init__(self, *parts: Any, indices: Sequence[int] = (), **where: Any) -> None:
        super().__init__(*parts, **where)
        self.indices = list(indices)


_KNOWN: dict[str, type[ConfigError]] = {
    "ConfigMismatchError": ConfigMismatchError,
    "TiedPredictionError": TiedPredictionError,
    "ConfigError": ConfigError,
}


def agree(world: World, error: BaseException | None) -> None:
    """Raise on every rank if any rank failed (so no rank waits forever for the others)."""
    if error is None:
        outcome = None
    elif isinstance(error, ProbustError):
        outcome = (type(error).__name__, error.parts, error.field, error.path)
    else:
        outcome = (type(error).__name__, (str(error),), None, None)
    outcomes = world.all_gather(outcome)
    if error is not None:
        raise error
    for rank, other in enumerate(outcomes):
        if other is not None:
            kind, parts, field, path = other
            if kind in _KNOWN:
                raise _KNOWN[kind](*parts, field=field, path=path)
            raise RuntimeError(f"rank {rank} failed: {kind}: {''.join(map(str, parts))}")
