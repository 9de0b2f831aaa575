"""The errors of a run's preparation, and how every rank of a torchrun job learns of one."""

from __future__ import annotations

from collections.abc import Sequence

from probust._io import first_line
from probust.run.distributed import World

__all__ = ["ConfigError", "ConfigMismatchError", "TiedPredictionError", "agree", "first_line"]


class ConfigError(ValueError):
    """A bad argument, found before any work started (the CLI prints it on one line, exit 2)."""


class ConfigMismatchError(ConfigError):
    """The output folder holds results of a different run.

    Attributes:
        differences: one ``"field: value there, value here"`` string per differing field.
    """

    def __init__(self, message: str, differences: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.differences = list(differences)


class TiedPredictionError(ConfigError):
    """With ``target="prediction"``, the clean prediction of a point to compute is tied between
    two classes (equal largest logits): p_robust of "the prediction" is undefined there, as in
    the estimators (which refuse a tie when no target is given). Raised before any estimator runs.

    Attributes:
        indices: the data-set indices of the tied points (sorted).
    """

    def __init__(self, message: str, indices: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.indices = list(indices)


def agree(world: World, error: BaseException | None) -> None:
    """Raise on every rank if any rank failed (so no rank waits forever for the others)."""
    outcomes = world.all_gather(None if error is None else (type(error).__name__, str(error)))
    if error is not None:
        raise error
    for rank, outcome in enumerate(outcomes):
        if outcome is not None:
            kind, message = outcome
            known = {
                "ConfigMismatchError": ConfigMismatchError,
                "TiedPredictionError": TiedPredictionError,
                "ConfigError": ConfigError,
            }
            if kind in known:
                raise known[kind](message)
            raise RuntimeError(f"rank {rank} failed: {kind}: {message}")
