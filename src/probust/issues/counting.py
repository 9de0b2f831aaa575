"""How many label issues each class holds, and which points to flag: cleanlab's confident joint,
written for probust's scores (no cleanlab needed).

The count is Northcutt et al.'s (2021) confident joint: a point labelled i is *confidently* of
class j when its predicted probability of j reaches class j's threshold (the mean probability of
j over the points labelled j) and j is the most probable such class; the off-diagonal counts are
the label errors it estimates, calibrated so that each row sums to that label's point count.
:func:`flag` then prunes by class: of the points labelled i it flags the ``issues[i]`` with the
lowest label score (cleanlab's ``filter_by="prune_by_class"``, here ranked by probust's score).
"""

from __future__ import annotations

import numpy as np

__all__ = ["estimated_issues", "flag"]


def estimated_issues(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """The number of label errors in each given class: int64 [C].

    Args:
        labels: int64 [N] given labels in [0, C).
        probs: float [N, C] predicted class probabilities (rows sum to 1), out of sample where
            there are folds.
    """
    n, classes = probs.shape
    counts = np.bincount(labels, minlength=classes)
    thresholds = np.array(
        [probs[labels == j, j].mean() if counts[j] else np.inf for j in range(classes)], dtype=np.float64
    )
    above = probs >= thresholds[None, :] - 1e-12
    confident = np.where(above, probs, -np.inf).argmax(1)
    has = above.any(1)
    joint = np.zeros((classes, classes), dtype=np.float64)
    np.add.at(joint, (labels[has], confident[has]), 1.0)
    rows = joint.sum(1, keepdims=True)
    calibrated = np.divide(joint * counts[:, None], rows, out=np.zeros_like(joint), where=rows > 0)
    off = calibrated.sum(1) - np.diag(calibrated)
    return np.rint(off).astype(np.int64)


def flag(labels: np.ndarray, scores: np.ndarray, issues: np.ndarray) -> np.ndarray:
    """bool [N]: of the points labelled i, the ``issues[i]`` with the lowest ``scores`` (ties:
    the lower index first)."""
    flagged = np.zeros(len(labels), dtype=bool)
    for i, count in enumerate(issues):
        members = np.flatnonzero(labels == i)
        if count > 0 and members.size:
            order = members[np.argsort(scores[members], kind="stable")]
            flagged[order[: min(int(count), members.size)]] = True
    return flagged
