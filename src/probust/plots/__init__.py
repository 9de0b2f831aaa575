"""Figures of p_robust from Python: each function takes the runner's DataFrame (or an
:class:`~probust.Estimate`) and returns a matplotlib :class:`~matplotlib.figure.Figure`.

::

    df = probust.score(model, test_set, sigma=[0.05, 0.1], methods=["mc", "mmse"])
    probust.plots.extremes(df, test_set, k=4)         # least / most robust inputs per class
    probust.plots.class_bias(df, kind="mean")         # p per class
    probust.plots.against_monte_carlo(df)             # each estimator against Monte Carlo
    probust.plots.over_sigma(df)                      # p's distribution per sigma and method
    issues = probust.find_issues(model, train_set)
    probust.plots.issue_grid(issues, train_set)       # the most suspect labels, captioned

The frame may also come from a results folder (``probust.run.read_results(folder)``). Nothing
here touches pyplot's global state (the figures are not registered with pyplot, no backend is
chosen): a notebook shows a returned figure, ``fig.savefig(path)`` writes it. The report
(``probust report``) draws its per-class, over-sigma and image-grid figures with these functions.
Needs the 'report' extra (matplotlib, pandas).
"""

from __future__ import annotations

from probust._extras import import_extra

import_extra("matplotlib", feature="probust.plots")
import_extra("pandas", extra="report", feature="probust.plots")

from probust.plots import frames, style  # noqa: E402
from probust.plots.classes import class_bias, class_means  # noqa: E402
from probust.plots.images import extremes, extremes_table  # noqa: E402
from probust.plots.issues import issue_grid  # noqa: E402
from probust.plots.monte_carlo import against_monte_carlo, monte_carlo_pairs  # noqa: E402
from probust.plots.sigma import over_sigma  # noqa: E402

__all__ = [
    "against_monte_carlo",
    "class_bias",
    "class_means",
    "extremes",
    "extremes_table",
    "frames",
    "issue_grid",
    "monte_carlo_pairs",
    "over_sigma",
    "style",
]
