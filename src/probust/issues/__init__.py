"""Finding what is wrong with a labelled data set from p_robust: suspect labels, atypical and
memorised points (:func:`find_issues`), scored in sample or out of sample (``folds``, which
:func:`train_folds` trains from a model factory). Needs the ``run`` extra (pandas).
"""

from typing import Any

from probust.issues.find import COLUMNS, default_sigma, find_issues, label_quality
from probust.issues.folds import IN_SAMPLE, train_folds
from probust.issues.tracker import HISTORY_COLUMNS, Tracker

__all__ = [
    "COLUMNS",
    "HISTORY_COLUMNS",
    "IN_SAMPLE",
    "Tracker",
    "default_sigma",
    "find_issues",
    "TrackerCallback",
    "label_quality",
    "train_folds",
]


def __getattr__(name: str) -> Any:
    # The callback needs Lightning, the tracker does not: import it on first use.
    if name == "TrackerCallback":
        from probust.issues.lightning import TrackerCallback

        return TrackerCallback
    raise AttributeError(f"module 'probust.issues' has no attribute {name!r}")
